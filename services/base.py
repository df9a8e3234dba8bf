"""The shape every Keel process shares (zguide / PySyncObj style).

``__init__`` makes the sockets (linger 0) and registers them with a poller; ``tick(timeout)``
polls once, hands each ready socket to its handler, then runs due chores (heartbeats,
expiring deadlines); ``run()`` calls ``tick`` until ``stop()``. Tests drive ``tick``
directly. SIGTERM/SIGINT stop the loop gracefully; a second signal exits at once.
"""
from __future__ import annotations

import gc
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from common import logs, protocol
from common.metrics import Metrics


class Chore:
    """A function run every ``interval`` seconds from the loop."""

    __slots__ = ("fn", "interval", "due")

    def __init__(self, fn: Callable[[float], None], interval: float):
        self.fn, self.interval, self.due = fn, interval, time.monotonic() + interval


class Service:
    role = "service"

    def __init__(self, name: str, metrics_port: int | None = None):
        self.name = name
        self.ctx = zmq.Context()
        self.poller = zmq.Poller()
        self.handlers: dict[zmq.Socket, Callable[[zmq.Socket], None]] = {}
        self.sockets: list[zmq.Socket] = []
        self.chores: list[Chore] = []
        self.running = False
        self._signals = 0
        self.log = logs.setup(name)
        self.metrics = Metrics(name)
        self.metrics_port = metrics_port

    def add_socket(self, sock: zmq.Socket, handler: Callable[[zmq.Socket], None] | None = None) -> zmq.Socket:
        self.sockets.append(sock)
        if handler is not None:
            self.handlers[sock] = handler
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def messages(self, sock: zmq.Socket, router: bool = False, limit: int = 1000) -> Iterator[tuple[list, Any]]:
        """(envelope, message) for each message waiting on ``sock``, without blocking; a
        malformed one is logged and skipped (peers inside Keel have no one to answer)."""
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            envelope, body = protocol.split_envelope(frames) if router else ([], frames)
            try:
                msg = protocol.decode(body)
            except protocol.ProtocolError as exc:
                self.log.error("bad message", socket=sock.type, error=str(exc))
                continue
            yield envelope, msg

    def every(self, interval: float, fn: Callable[[float], None]) -> None:
        self.chores.append(Chore(fn, interval))

    def next_timeout(self) -> float:
        """Seconds until the next chore is due (the poll timeout)."""
        if not self.chores:
            return 0.1
        return max(0.0, min(c.due for c in self.chores) - time.monotonic())

    def tick(self, timeout: float | None = None) -> None:
        timeout = self.next_timeout() if timeout is None else timeout
        for sock, _ in self.poller.poll(timeout * 1000):
            try:
                self.handlers[sock](sock)
            except Exception:  # a bug in one message's handling must not stop the service
                self.log.exception("handler failed", role=self.role)
        now = time.monotonic()
        for chore in self.chores:
            if now >= chore.due:
                chore.due = now + chore.interval
                chore.fn(now)

    def run(self) -> None:
        self.metrics.serve(self.metrics_port)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.running = True
        # Latency: a full collection over a frontend's de-duplication table stalls the loop
        # for tens of ms. Keel's loops make few reference cycles, so collect rarely and never
        # scan what start-up allocated (torch, the model, configs).
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 1000)
        self.log.info("started", role=self.role, pid=os.getpid())
        try:
            while self.running:
                self.tick()
        finally:
            self.shutdown()

    def stop(self) -> None:
        self.running = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(1)
        self.stop()

    def drain(self) -> None:
        """Hook: finish or hand back in-flight work before sockets close."""

    def shutdown(self) -> None:
        """Ordered and idempotent: stop taking work, drain, close sockets and context."""
        if self.ctx.closed:
            return
        self.running = False
        try:
            self.drain()
        finally:
            for sock in self.sockets:
                sock.close(0)
            self.ctx.term()
            self.log.info("stopped")
