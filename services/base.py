"""The shape every Keel process shares (zguide / PySyncObj style).

``__init__`` makes the sockets (linger 0) and registers them with a poller; ``tick(timeout)``
polls once, hands each ready socket to its handler, then runs due chores (heartbeats,
purges) and timers (a deadline, a delayed batch: a due time that moves); ``run()`` calls
``tick`` until ``stop()``. Tests drive ``tick`` directly. SIGTERM/SIGINT stop the loop
gracefully; a second signal exits at once.

A failure while handling one message, or in one chore or timer, is logged with its
traceback and the loop goes on: nothing a peer sends may stop a service. Every service
answers ``Status`` with ``status()``: on its own ROUTER when it has one, else on the
``status_endpoint`` its config names; its metrics port answers ``/healthz`` and
``/readyz`` (``ready()``) for an orchestrator's probes.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import gc
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from keel.common import curve, logs, protocol, tracing, transport
from keel.common.metrics import Metrics


def _malloc_trim() -> Callable[[], Any] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator returns memory its own way
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Hand freed heap memory back to the system. glibc keeps what a process freed for
    reuse, and ZeroMQ's I/O threads allocate from their own arenas, which it trims only
    at their top: a frontend whose de-duplication table had expired, or whose 2,000 idle
    client connections had closed, kept hundreds of MB it no longer used."""
    if _TRIM is not None:
        _TRIM(0)


class Chore:
    """A function run every ``interval`` seconds from the loop."""

    __slots__ = ("fn", "interval", "due")

    def __init__(self, fn: Callable[[float], None], interval: float):
        self.fn, self.interval, self.due = fn, interval, time.monotonic() + interval


class Timer:
    """A function run once at a time (monotonic) that its owner moves: ``at(when)`` sets or
    moves it, ``clear()`` cancels; after it runs it is clear until set again."""

    __slots__ = ("fn", "due")

    def __init__(self, fn: Callable[[float], None]):
        self.fn, self.due = fn, None

    def at(self, when: float | None) -> None:
        self.due = when

    def at_latest(self, when: float) -> None:
        """Due at ``when`` or earlier, if it already is."""
        if self.due is None or when < self.due:
            self.due = when

    def clear(self) -> None:
        self.due = None


#: SIGTERM/SIGINT that arrived before a service's loop took them over (``catch_signals_early``)
_early_signals = 0


def _on_early_signal(signum: int, frame: Any) -> None:
    global _early_signals
    _early_signals += 1
    if _early_signals > 1:
        os._exit(1)


def catch_signals_early() -> None:
    """Hold SIGTERM/SIGINT from now until ``Service.run`` takes them over; ``run`` then stops
    at once, through the ordered shutdown. A service announces itself while it is still
    being built (a worker's Register leaves from ``__init__``), so a supervisor or a test
    that stops it on that sign used to catch it before ``run`` had set its handlers: the
    default action killed it without a Leave (the flake of test_sigterm_sends_leave)."""
    signal.signal(signal.SIGTERM, _on_early_signal)
    signal.signal(signal.SIGINT, _on_early_signal)


class BindError(RuntimeError):
    """An address a service must listen on is taken: said in one line naming the address
    and the option that sets it (``services.serve``), not as a traceback."""

    def __init__(self, address: str, option: str):
        super().__init__(f"cannot listen on {address} ({option}): address already in use; "
                         f"stop what holds it or set {option} to a free one")
        self.address, self.option = address, option


class Service:
    role = "service"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A service whose constructor fails (an address taken, a bad config) closes what it
        had opened before the exception leaves: its sockets and its ZeroMQ context. Left to
        the garbage collector, the context's ``term()`` blocked whatever code happened to
        run the collection, in a test process for minutes (services are built in-process
        by tests and tools, not only by ``keel serve``)."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def __init__(self, *args: Any, **kw: Any) -> None:
            try:
                init(self, *args, **kw)
            except BaseException:
                self._abandon()
                raise

        cls.__init__ = __init__

    def _abandon(self) -> None:
        """Close the sockets and the context of a service that never ran (no drain)."""
        ctx = self.__dict__.get("ctx")
        if ctx is None or ctx.closed:
            return
        for sock in self.__dict__.get("sockets", []):
            sock.close(0)
        curve.stop(ctx)
        ctx.destroy(linger=0)

    def __init__(self, name: str, metrics_port: int | None = None):
        self.name = name
        self.ctx = zmq.Context()
        self.poller = zmq.Poller()
        self.handlers: dict[zmq.Socket, Callable[[zmq.Socket], None]] = {}
        self.sockets: list[zmq.Socket] = []
        self.chores: list[Chore] = []
        self.timers: list[Timer] = []
        self.running = False
        self._signals = 0
        self.log = logs.setup(name)
        self.metrics = Metrics(name)
        self.metrics_port = metrics_port
        tracing.start(name)  # only when this process was started with a trace rate (keel serve --trace-rate)

    def add_socket(self, sock: zmq.Socket, handler: Callable[[zmq.Socket], None] | None = None) -> zmq.Socket:
        self.sockets.append(sock)
        if handler is not None:
            self.handlers[sock] = handler
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def remove_socket(self, sock: zmq.Socket, linger_ms: int = 0) -> None:
        """Close a socket this service made (a replaced connection, an evicted peer)."""
        if sock in self.handlers:
            self.poller.unregister(sock)
            del self.handlers[sock]
        self.sockets.remove(sock)
        sock.close(linger_ms)

    def messages(self, sock: zmq.Socket, router: bool = False, limit: int = 1000) -> Iterator[tuple[list, Any]]:
        """(envelope, message) for each message waiting on ``sock``, without blocking; a
        malformed one is logged and skipped (peers inside Keel have no one to answer)."""
        for frames in transport.drain(sock, limit):
            envelope, body = protocol.split_envelope(frames) if router else ([], frames)
            try:
                msg = protocol.decode(body)
            except protocol.ProtocolError as exc:
                self.log.error("bad message", socket=sock.type, error=str(exc))
                continue
            yield envelope, msg

    def serve_status(self, endpoint: str | None) -> None:
        """Answer ``Status`` requests on a ROUTER at ``endpoint`` (services with no ROUTER of
        their own: workers, encoder, decoder)."""
        if endpoint:
            self.add_socket(transport.make_socket(self.ctx, zmq.ROUTER, bind=endpoint), self._on_status)

    def _on_status(self, sock: zmq.Socket) -> None:
        for envelope, msg in self.messages(sock, router=True):
            if isinstance(msg, protocol.Status):
                transport.try_send(sock, protocol.Status(service=self.name, info=self.status()), envelope)

    def ready(self) -> bool:
        """Whether this service is registered and serving: what ``/readyz`` on its metrics
        port answers (``common.metrics``), asked from the metrics thread, so it only reads.
        Running its loop, by default; a worker also needs its dispatcher to know it."""
        return self.running

    def status(self) -> dict:
        """What ``keel status`` shows of this service; services add their own figures."""
        return {"service": self.name, "role": self.role}

    def every(self, interval: float, fn: Callable[[float], None]) -> None:
        self.chores.append(Chore(fn, interval))

    def link_manager(self, link: Any, on_change: Callable[[str, dict | None], None] | None = None, **options: Any) -> Any:
        """This process's ``common.control.ManagerLink`` to the manager group of ``link`` (a
        ``ManagerLinkConfig``), its sockets polled by this loop, kept as ``self.manager``;
        ``options`` are ManagerLink's (``me``, ``on_role``, ``may_register``, ``ready``). None
        (and no import of the control plane) when there is no manager."""
        self.manager = None  # until the link is made: its constructor may already call on_change
        if link is None:
            return None
        from keel.common.control import ManagerLink

        self.manager = ManagerLink(self, link.endpoints, link.publish_endpoints, on_change=on_change, **options)
        return self.manager

    def timer(self, fn: Callable[[float], None]) -> Timer:
        timer = Timer(fn)
        self.timers.append(timer)
        return timer

    def next_timeout(self) -> float:
        """Seconds until the next chore or timer is due (the poll timeout)."""
        dues = [c.due for c in self.chores] + [t.due for t in self.timers if t.due is not None]
        if not dues:
            return 0.1
        return max(0.0, min(dues) - time.monotonic())

    def tick(self, timeout: float | None = None) -> None:
        timeout = self.next_timeout() if timeout is None else timeout
        for sock, _ in self.poller.poll(timeout * 1000):
            handler = self.handlers.get(sock)
            if handler is not None:  # an earlier handler of this poll may have replaced the socket
                self._guarded("handler", handler, sock)
        now = time.monotonic()
        for chore in self.chores:
            if now >= chore.due:
                chore.due = now + chore.interval
                self._guarded("chore", chore.fn, now)
        for timer in self.timers:
            if timer.due is not None and now >= timer.due:
                timer.due = None
                self._guarded("timer", timer.fn, now)

    def _guarded(self, what: str, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        except Exception:  # a bug in one message's or one chore's handling must not stop the service
            self.log.exception(f"{what} failed", role=self.role, fn=getattr(fn, "__name__", repr(fn)))

    def run(self) -> None:
        self.running = True
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if _early_signals:  # asked to stop while it was being built
            self._signals = _early_signals
            self.stop()
        try:
            self.metrics.serve(self.metrics_port, ready=self.ready)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            self.shutdown()
            raise BindError(f"port {self.metrics_port}", "metrics_port") from None
        # Latency: a collection walks every young tracked object, so its pause grows with
        # the threshold: 50,000 gave ~20 ms gen-0 pauses at a loaded frontend (the p99 SLO
        # is 20 ms), 10,000 gives < 5 ms at the same total cost. Full collections over the
        # de-duplication table stall for tens of ms: Keel's loops make few reference
        # cycles, so the older generations are collected rarely, and what start-up
        # allocated (torch, the model, configs) is never scanned.
        gc.collect()
        gc.freeze()
        gc.set_threshold(10_000, 50, 1000)
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
            curve.stop(self.ctx)  # its ZAP thread's sockets would hold term() up
            self.ctx.term()
            self.metrics.close()
            if tracing.ON:
                tracing.stop()  # what the exporter still holds leaves now
            self.log.info("stopped")
