"""Tiny processes and client helpers the self-test puts on hosts instead of Keel services.

``python -m keel.chaos.probes echo --bind ADDR --port 0 --ready FILE --max-s 120`` echoes every
byte it receives (threads, one per connection) and writes its port to FILE once it
listens. ``python -m keel.chaos.probes sleep --max-s 120`` does nothing, slowly: a process to
kill or freeze. Both exit by themselves after ``--max-s``.

``wait_file`` polls for a file the harness waits on (a ready or result file) until a
deadline: no blind sleeps anywhere in the harness.
"""
from __future__ import annotations

import argparse
import socket
import socketserver
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import orjson

from keel.common.waiting import wait_until  # noqa: F401  (the harness imports it from here)

_TOKENS = __import__("itertools").count(1)


def wait_file(path: Path, timeout: float, alive: Callable[[], bool] | None = None) -> dict | None:
    """The JSON in ``path`` once it exists (written atomically), None at the deadline or
    as soon as ``alive()`` says the writer died without writing it."""
    path = Path(path)

    def ready() -> dict | None:
        if path.exists():
            return orjson.loads(path.read_bytes())
        if alive is not None and not alive():
            return {"_writer_died": True}
        return None

    got = wait_until(ready, timeout)
    return None if not got or "_writer_died" in got else got


def write_json(path: Path, data: dict) -> None:
    """Atomic write: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(data))
    tmp.replace(path)


def ping(sock: socket.socket, timeout: float) -> float | None:
    """One echoed round trip on a connected socket in ms; None on timeout or error.

    Each ping carries a fresh 8-byte token and waits for that token, so echoes of
    earlier pings that timed out (and arrive late) are skipped, never mistaken."""
    token = next(_TOKENS).to_bytes(8, "big")
    t0 = time.perf_counter()
    deadline = t0 + timeout
    try:
        sock.sendall(token)
        got = b""
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            sock.settimeout(left)
            chunk = sock.recv(8 - len(got) % 8 or 8)
            if not chunk:
                return None
            got += chunk
            if len(got) % 8 == 0 and got[-8:] == token:
                return (time.perf_counter() - t0) * 1000.0
    except OSError:
        return None


def median_rtt_ms(sock: socket.socket, n: int = 20, timeout: float = 2.0) -> float | None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(n):
        rtt = ping(sock, timeout)
        if rtt is None:
            return None
        rtts.append(rtt)
    return statistics.median(rtts)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def echo_main(args: argparse.Namespace) -> int:
    server = _Server((args.bind, args.port), _Echo)
    write_json(Path(args.ready), {"port": server.server_address[1]})
    timer = threading.Timer(args.max_s, server.shutdown)
    timer.daemon = True
    timer.start()
    server.serve_forever(poll_interval=0.1)
    return 0


def sleep_main(args: argparse.Namespace) -> int:
    end = time.monotonic() + args.max_s
    while time.monotonic() < end:
        time.sleep(0.05)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keel.chaos.probes")
    sub = parser.add_subparsers(dest="cmd", required=True)
    echo = sub.add_parser("echo", help="TCP echo server")
    echo.add_argument("--bind", default="127.0.0.1")
    echo.add_argument("--port", type=int, default=0)
    echo.add_argument("--ready", required=True, help="file that gets {'port': P} once listening")
    echo.add_argument("--max-s", type=float, default=120.0)
    sleep = sub.add_parser("sleep", help="a process that only sleeps")
    sleep.add_argument("--max-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    return echo_main(args) if args.cmd == "echo" else sleep_main(args)


if __name__ == "__main__":
    sys.exit(main())
