"""A userspace TCP proxy that delays a link: this kernel has no ``netem``.

The proxy runs as its own process on a host (``python -m keel.chaos.proxy --config FILE``)
and relays each listening address to a target. Bytes read in either direction are held
until their release time, ``now + (delay_ms + U(-jitter_ms, +jitter_ms)) / 2``, so a
round trip through the proxy gains ``delay_ms`` on average and never more than
``delay_ms + jitter_ms``; release times never go backwards, so a stream stays in order.

With ``flip_at`` the proxy also corrupts a transfer in flight: the byte at that offset of
the replies (target to client, counted over every connection) is flipped once, and the
``flipped`` file says when; a reader must refuse what it got and ask again.

The delay is changed while connections stay up: the harness writes the control file and
sends SIGUSR1; the proxy applies it and writes the generation to the ack file. A link
that may be delayed later therefore gets its proxy at start with a delay of 0.

Example
-------
>>> proxy = DelayProxy(cluster, "b", [("10.213.0.3", 0, "10.213.0.3", 9000)]).start()  # doctest: +SKIP
>>> proxy.set_delay(20.0, jitter_ms=2.0)                                              # doctest: +SKIP
>>> proxy.ports                                                                        # doctest: +SKIP
[40111]
"""
from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import time
from pathlib import Path

import orjson

from keel.chaos.probes import wait_file, write_json
from keel.chaos.resources import ChaosError

CHUNK = 65536


class DelayProxy:
    """Harness side: start a proxy process on ``host`` and steer its delay."""

    def __init__(self, cluster, host: str, routes: list[tuple[str, int, str, int]], delay_ms: float = 0.0,
                 jitter_ms: float = 0.0, seed: int = 0, max_s: float = 600.0, name: str = "proxy",
                 flip_at: int | None = None):
        self.cluster, self.host, self.routes, self.seed, self.max_s = cluster, host, routes, seed, max_s
        self.flip_at = flip_at
        self.delay_ms, self.jitter_ms, self.gen = delay_ms, jitter_ms, 0
        self.dir = Path(cluster.run_dir) / "proxies"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = f"{name}-{host}"
        self.files = {k: self.dir / f"{self.name}.{k}" for k in ("config", "control", "ack", "ready", "flipped")}
        self.proc = None
        self.ports: list[int] = []

    def start(self, timeout: float = 10.0) -> DelayProxy:
        for path in self.files.values():
            path.unlink(missing_ok=True)
        self._control()
        config = {"routes": [{"listen": [a, p], "target": [ta, tp]} for a, p, ta, tp in self.routes],
                  "seed": self.seed, "max_s": self.max_s, "flip_at": self.flip_at,
                  **{k: str(v) for k, v in self.files.items() if k != "config"}}
        write_json(self.files["config"], config)
        self.proc = self.cluster.spawn(self.host, [sys.executable, "-m", "keel.chaos.proxy", "--config", str(self.files["config"])],
                                       self.name, kind="proxy")
        ready = wait_file(self.files["ready"], timeout, alive=self.proc.running)
        if ready is None:
            raise ChaosError(f"proxy on {self.host} did not start; see {self.proc.log}")
        self.ports = [r["listen"][1] for r in ready["routes"]]
        return self

    def _control(self) -> None:
        self.gen += 1
        write_json(self.files["control"], {"gen": self.gen, "delay_ms": self.delay_ms, "jitter_ms": self.jitter_ms})

    def set_delay(self, delay_ms: float, jitter_ms: float = 0.0, timeout: float = 5.0) -> None:
        """Change the added round-trip delay; returns once the proxy applies it."""
        self.delay_ms, self.jitter_ms = float(delay_ms), float(jitter_ms)
        self._control()
        self.cluster.signal(self.proc, signal.SIGUSR1)
        gen = self.gen

        def acked() -> bool:
            try:
                return orjson.loads(self.files["ack"].read_bytes())["gen"] >= gen
            except (OSError, orjson.JSONDecodeError, KeyError):
                return False

        from keel.chaos.probes import wait_until
        if not wait_until(acked, timeout):
            raise ChaosError(f"proxy on {self.host} did not apply delay {delay_ms} ms within {timeout} s")

    def flipped(self) -> dict | None:
        """{"offset", "t"} once the proxy flipped its byte (``flip_at``); None before."""
        try:
            return orjson.loads(self.files["flipped"].read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None

    def stop(self) -> None:
        if self.proc is not None:
            self.cluster.stop(self.proc, grace_s=1.0)


# ---------------------------------------------------------------------- the process


class _Line:
    """The delay of one proxy, shared by all its connections."""

    def __init__(self, files: dict, seed: int, flip_at: int | None = None):
        self.files, self.rng = files, random.Random(seed)
        self.flip_at, self.replied = flip_at, 0  # the reply byte to corrupt once; reply bytes seen
        self.delay_s = self.jitter_s = 0.0
        self.late = 0.0  # how much earlier than the release time to wake up (s)
        self.reload()

    def reload(self) -> None:
        ctl = orjson.loads(Path(self.files["control"]).read_bytes())
        self.delay_s, self.jitter_s = ctl["delay_ms"] / 1000.0, ctl["jitter_ms"] / 1000.0
        write_json(Path(self.files["ack"]), {"gen": ctl["gen"]})

    def corrupt(self, data: bytes) -> bytes:
        """``data`` (replies) with the ``flip_at`` byte flipped, when it falls in this read."""
        start, self.replied = self.replied, self.replied + len(data)
        if self.flip_at is None or not start <= self.flip_at < self.replied:
            return data
        out = bytearray(data)
        out[self.flip_at - start] ^= 0xFF
        write_json(Path(self.files["flipped"]), {"offset": self.flip_at, "t": time.time()})
        self.flip_at = None
        return bytes(out)

    def one_way(self) -> float:
        if self.jitter_s:
            return max(0.0, (self.delay_s + self.rng.uniform(-self.jitter_s, self.jitter_s)) / 2)
        return self.delay_s / 2


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: _Line, replies: bool = False) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def ingest() -> None:
        last = 0.0
        while True:
            try:
                data = await reader.read(CHUNK)
            except OSError:
                data = b""
            last = max(last, loop.time() + line.one_way())
            queue.put_nowait((last, line.corrupt(data) if replies and data else data))
            if not data:
                return

    async def emit() -> None:
        while True:
            release, data = await queue.get()
            wait = release - loop.time() - line.late
            if wait > 0:
                await asyncio.sleep(wait)
                # the event loop wakes up to ~1 ms late: learn by how much and wake earlier
                line.late = min(0.003, max(0.0, line.late + 0.2 * (loop.time() - release)))
            try:
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
            except OSError:
                return

    await asyncio.gather(ingest(), emit())


async def _serve(config: dict) -> None:
    line = _Line(config, config.get("seed", 0), config.get("flip_at"))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, line.reload)

    def handler(target: tuple[str, int]):
        async def handle(r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
            try:
                r2, w2 = await asyncio.open_connection(*target)
            except OSError:
                w1.close()
                return
            try:
                await asyncio.gather(_pipe(r1, w2, line), _pipe(r2, w1, line, replies=True))
            finally:
                for w in (w1, w2):
                    w.close()
        return handle

    servers, routes = [], []
    for route in config["routes"]:
        target = tuple(route["target"])
        server = await asyncio.start_server(handler(target), route["listen"][0], route["listen"][1], reuse_address=True)
        servers.append(server)
        routes.append({"listen": [route["listen"][0], server.sockets[0].getsockname()[1]], "target": list(target)})
    write_json(Path(config["ready"]), {"routes": routes})
    await asyncio.sleep(config.get("max_s", 600.0))
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keel.chaos.proxy", description="delaying TCP proxy")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    config = orjson.loads(Path(args.config).read_bytes())
    asyncio.run(_serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
