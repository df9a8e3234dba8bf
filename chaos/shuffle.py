"""Background shuffles: bulk TCP transfers between hosts, like ParM §6.1's analytics traffic.

A shuffle is two processes: a receiver on the destination host (``python -m
keel.chaos.shuffle recv``) that counts bytes and measures the rate from first to last byte,
and a sender on the source host that writes N bytes of zeros as fast as the link lets
it. Both exit after ``--max-s`` whatever happens. ``ShuffleLoad`` keeps ``concurrent``
shuffles going between random pairs of hosts, each of a size drawn from ``size_mb``
(128-256 MB in the paper), until stopped or until its duration is up.

Example
-------
>>> s = Shuffle(cluster, "a", "b", 64 << 20).start()          # doctest: +SKIP
>>> s.wait(30).mbps                                             # doctest: +SKIP
478.2
"""
from __future__ import annotations

import argparse
import random
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from keel.chaos.probes import wait_file, write_json

CHUNK = 1 << 20


@dataclass
class ShuffleResult:
    src: str
    dst: str
    bytes_planned: int
    bytes: int = 0
    seconds: float = 0.0
    mbps: float = 0.0
    started: float = 0.0  # wall clock
    ended: float = 0.0
    ok: bool = False
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class Shuffle:
    """One transfer of ``nbytes`` from host ``src`` to host ``dst`` of a cluster."""

    _seq = 0
    _seq_lock = threading.Lock()

    def __init__(self, cluster, src: str, dst: str, nbytes: int, max_s: float = 60.0):
        if src == dst:
            raise ValueError("a shuffle needs two different hosts")
        self.cluster, self.src, self.dst, self.nbytes, self.max_s = cluster, src, dst, int(nbytes), max_s
        with Shuffle._seq_lock:
            Shuffle._seq += 1
            self.name = f"shuffle-{Shuffle._seq}-{src}-{dst}"
        self.dir = Path(cluster.run_dir) / "shuffles"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.result = ShuffleResult(src, dst, self.nbytes)
        self.recv = self.send = None
        self.out = self.dir / f"{self.name}.json"

    def start(self, ready_timeout: float = 10.0) -> Shuffle:
        self.result.started = time.time()
        ready, out = self.dir / f"{self.name}.ready", self.out
        for stale in (ready, out):
            stale.unlink(missing_ok=True)
        addr = self.cluster.host(self.dst).address
        self.recv = self.cluster.spawn(self.dst, [sys.executable, "-m", "keel.chaos.shuffle", "recv", "--bind", addr,
                                                  "--ready", str(ready), "--out", str(out), "--max-s", str(self.max_s)],
                                       f"{self.name}-recv", kind="shuffle")
        got = wait_file(ready, ready_timeout, alive=self.recv.running)
        if got is None:
            self.result.error = "receiver did not start"
            return self
        self.send = self.cluster.spawn(self.src, [sys.executable, "-m", "keel.chaos.shuffle", "send", "--to", addr,
                                                  "--port", str(got["port"]), "--bytes", str(self.nbytes),
                                                  "--max-s", str(self.max_s)], f"{self.name}-send", kind="shuffle")
        return self

    def done(self) -> bool:
        return self.recv is None or not self.recv.running()

    def wait(self, timeout: float) -> ShuffleResult:
        """The result once the receiver is done (or killed); stops both at the deadline."""
        if self.recv is not None:
            got = wait_file(self.out, timeout, alive=self.recv.running) if self.send else None
            if got is not None:
                self.result.bytes, self.result.seconds, self.result.mbps = got["bytes"], got["seconds"], got["mbps"]
                self.result.ok = got["bytes"] >= self.nbytes
            elif self.result.error is None:
                self.result.error = "no result: the transfer was cut short (host killed, or timed out)"
        self.stop()
        self.result.ended = time.time()
        return self.result

    def stop(self) -> None:
        for proc in (self.send, self.recv):
            if proc is not None and proc.running():
                self.cluster.stop(proc, grace_s=0.5)


class ShuffleLoad:
    """``concurrent`` shuffles at a time among ``hosts`` until ``stop()`` or ``duration_s``."""

    def __init__(self, cluster, hosts: list[str], concurrent: int = 4, size_mb: tuple[float, float] = (128, 256),
                 duration_s: float = 30.0, seed: int = 0, max_s: float = 60.0):
        if len(hosts) < 2:
            raise ValueError("shuffles need at least two hosts")
        self.cluster, self.hosts, self.concurrent = cluster, list(hosts), concurrent
        self.size_mb, self.duration_s, self.max_s = size_mb, duration_s, max_s
        self.rng = random.Random(seed)
        self.results: list[ShuffleResult] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="shuffle-load", daemon=True)

    def start(self) -> ShuffleLoad:
        self.thread.start()
        return self

    def _next(self) -> Shuffle:
        src, dst = self.rng.sample(self.hosts, 2)
        nbytes = int(self.rng.uniform(*self.size_mb) * (1 << 20))
        return Shuffle(self.cluster, src, dst, nbytes, max_s=self.max_s)

    def _run(self) -> None:
        end = time.monotonic() + self.duration_s
        active: list[Shuffle] = []
        try:
            while not self.stopping.is_set() and time.monotonic() < end:
                for s in [s for s in active if s.done()]:
                    active.remove(s)
                    self.results.append(s.wait(1.0))
                while len(active) < self.concurrent and not self.stopping.is_set():
                    active.append(self._next().start())
                self.stopping.wait(0.05)
        finally:
            for s in active:
                s.stop()
                res = s.wait(0.0)
                if not res.ok:
                    res.error = "stopped unfinished when the shuffle period ended"
                self.results.append(res)

    def stop(self, timeout: float = 10.0) -> list[ShuffleResult]:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout)
        return self.results


# ---------------------------------------------------------------------- processes


def recv_main(args: argparse.Namespace) -> int:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((args.bind, 0))
    srv.listen(1)
    srv.settimeout(args.max_s)
    write_json(Path(args.ready), {"port": srv.getsockname()[1]})
    end = time.monotonic() + args.max_s
    conn, _ = srv.accept()
    buf = bytearray(CHUNK)
    total, first, last = 0, None, None
    while time.monotonic() < end:
        conn.settimeout(max(0.01, end - time.monotonic()))
        try:
            n = conn.recv_into(buf)
        except TimeoutError:
            break
        if not n:
            break
        last = time.perf_counter()
        if first is None:
            first = last
        total += n
    seconds = (last - first) if first is not None and last > first else 0.0
    write_json(Path(args.out), {"bytes": total, "seconds": seconds, "mbps": total * 8 / seconds / 1e6 if seconds else 0.0})
    conn.close()
    return 0


def send_main(args: argparse.Namespace) -> int:
    end = time.monotonic() + args.max_s
    sock = socket.create_connection((args.to, args.port), timeout=min(10.0, args.max_s))
    data = memoryview(bytes(CHUNK))
    sent = 0
    while sent < args.bytes and time.monotonic() < end:
        n = min(CHUNK, args.bytes - sent)
        sock.settimeout(max(0.01, end - time.monotonic()))
        sock.sendall(data[:n])
        sent += n
    sock.shutdown(socket.SHUT_WR)
    sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keel.chaos.shuffle")
    sub = parser.add_subparsers(dest="cmd", required=True)
    recv = sub.add_parser("recv")
    recv.add_argument("--bind", required=True)
    recv.add_argument("--ready", required=True)
    recv.add_argument("--out", required=True)
    recv.add_argument("--max-s", type=float, default=60.0)
    send = sub.add_parser("send")
    send.add_argument("--to", required=True)
    send.add_argument("--port", type=int, required=True)
    send.add_argument("--bytes", type=int, required=True)
    send.add_argument("--max-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    try:
        return recv_main(args) if args.cmd == "recv" else send_main(args)
    except OSError as exc:  # a cut link or a killed peer ends a shuffle; not a crash
        print(f"shuffle {args.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
