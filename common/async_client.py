"""The asyncio client: ``AsyncClient``, the blocking ``Client``'s twin on one event loop
(the same calls, retries, deadlines and cancellation; ``common.client._Base`` holds what
they share). Imported from ``keel.common.client`` (or ``keel``) as before.
"""
from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import zmq

from keel.common import transport
from keel.common.client import (WINDOW, _Base, _check_timeout, _check_traceparent, _check_version, _key_of,
                                _rows_and_keys)
from keel.common.protocol import Cancel
from keel.common.results import Cancelled, FeedbackResult


class AsyncClient(_Base):
    """asyncio client: ``await client.predict(...)``; many calls may be in flight.

    Its sockets are plain ZeroMQ sockets watched with ``loop.add_reader``: a reply
    resolves its call's future in the reader callback itself, with no reader task and no
    ``wait_for`` task per call between them (each of those costs a turn of the loop; with
    ``zmq.asyncio`` one outstanding call was 6-17% slower than the blocking ``Client``).
    A ZeroMQ socket's descriptor is edge-triggered, so after every send the socket is
    drained too, and each socket is read once when the loop starts watching it (a descriptor
    signals only after a read found its socket empty). The same callback hands the socket
    the messages it could not take before.

    One loop timer, set to the retry engine's next slice end, drives every call's retries
    and expiry (as ``Client``'s poll timeout does).

    A call sent while others are in flight waits for the end of the loop's turn (a
    ``call_soon``), so the calls made in one turn -- a gateway's requests that arrived
    together, ``predict_batch``'s rows -- leave for each frontend as one message (a bundle,
    as ``Client.cork``'s). A call alone is sent at once: one request outstanding does not
    wait the turn. Through the HTTP gateway at 2,500 req/s this took the frontend's CPU a
    request from 194 to 172 µs and the p99 from 12.4 to 5.7 ms (docs/results/core.md)."""

    def __init__(self, frontends: list[str] | str, timeout_ms: float = 1000.0, retries: int = 1, grace_ms: float | None = None,
                 suspect_s: float = 5.0, **options):
        super().__init__(frontends, timeout_ms, retries, grace_ms, suspect_s, **options)
        self.futures: dict[str, asyncio.Future] = {}
        self.ack_futures: dict[str, asyncio.Future] = {}  # feedback answers awaited
        self.loop: asyncio.AbstractEventLoop | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf  # perf_counter the timer fires at
        self.turn_end: asyncio.Handle | None = None  # the sends held for the end of this turn
        for i in range(len(self.frontends)):  # connect now: the first call finds its link up
            self._socket(i)

    def _start(self) -> None:
        """Watch the sockets from the running loop (again, if the client moved to another)."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:
            self._unwatch()
            self.loop = loop
            for i, sock in enumerate(self.sockets):
                if sock is not None:
                    self._watch(i)

    def _watch(self, i: int) -> None:
        if self.loop is None:
            return  # _start watches it
        self.loop.add_reader(self.sockets[i].getsockopt(zmq.FD), self._drain, i)
        self.loop.add_reader(self.monitors[i].getsockopt(zmq.FD), self._on_monitor, i)
        # a descriptor signals only after a read found its socket empty: each read arms it
        # (soon, not here: a socket is made in the middle of a send)
        self.loop.call_soon(self._drain, i)
        self.loop.call_soon(self._on_monitor, i)

    def _unwatch_one(self, i: int) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self.sockets[i].getsockopt(zmq.FD))
            self.loop.remove_reader(self.monitors[i].getsockopt(zmq.FD))

    def _unwatch(self) -> None:
        for i, sock in enumerate(self.sockets):
            if sock is not None:
                self._unwatch_one(i)
        if self.timer is not None:
            self.timer.cancel()
        if self.turn_end is not None:  # the new loop (or close) sends what waits
            self.turn_end.cancel()
            self.turn_end = None
        self.timer, self.timer_at, self.loop = None, math.inf, None

    def _on_monitor(self, i: int) -> None:
        """Frontend ``i``'s link changed: calls the engine moved go to their new frontend now."""
        for rid in self._link_changed(i):
            self._send_call(rid)
        self._arm()

    def _send(self, i: int, rid: str, attempt: int, msg) -> None:
        if len(self.futures) > 1 and self.loop is not None:  # others in flight: leave with this turn's sends
            self.outbox[i].append((rid, attempt, msg))
            if self.turn_end is None:
                self.turn_end = self.loop.call_soon(self._end_turn)
            return
        super()._send(i, rid, attempt, msg)
        self._drain(i)  # the send may have consumed the descriptor's edge

    def _end_turn(self) -> None:
        self.turn_end = None
        self._flush_all()

    def _flush_all(self) -> None:
        """Every socket's waiting sends, each socket then drained (a send may consume the
        descriptor's edge)."""
        for i, box in enumerate(self.outbox):
            if box:
                self._drain(i)

    def _drain(self, i: int) -> None:
        """Hand frontend ``i``'s socket what waits for it; read every reply waiting on it."""
        if self.outbox[i]:
            self._flush(i)
        sock = self.sockets[i]
        if sock is None:
            return
        while transport.readable(sock):
            results = self._finish(transport.recv_nowait(sock), i)
            for rid, future in self.ack_futures.items():
                if self.acks.get(rid) is not None and not future.done():
                    future.set_result(None)
            for result in results:
                self._resolve(result)

    def _resolve(self, result: Result) -> None:
        future = self.futures.pop(result.request_id, None)
        if future is not None and not future.done():
            future.set_result(result)

    def _arm(self) -> None:
        """Set the loop timer to the engine's next slice end, if that is sooner."""
        at = self.engine.next_due()
        if at is None or self.loop is None or at >= self.timer_at:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = at
        self.timer = self.loop.call_later(max(0.0, at - time.perf_counter()), self._tick)

    def _tick(self) -> None:
        self.timer, self.timer_at = None, math.inf
        again, ended = self.engine.due(time.perf_counter())
        for result in ended:
            self._resolve(result)
        for rid in again:
            self._send_call(rid)
        self._flush_all()
        self._arm()

    async def predict(self, name: str, x: np.ndarray | dict, key: str | None = None, version: str | None = None,
                      timeout_ms: float | None = None, request_id: str | None = None, raise_errors: bool | None = None,
                      *, context: str | None = None, traceparent: str | None = None) -> Result:
        """One query of a model, an application or a graph (as ``Client.predict``)."""
        result = await self._predict(name, x, _key_of(key, context), version, timeout_ms, request_id,
                                     _check_traceparent(traceparent))
        return self._outcome(result, raise_errors)

    async def feedback(self, request_id: str, y: int, timeout_ms: float | None = None) -> FeedbackResult:
        """As ``Client.feedback``."""
        self._start()
        timeout = self.timeout_ms if timeout_ms is None else _check_timeout(timeout_ms)
        frontend, msg = self._feedback_message(request_id, y)
        future = self.ack_futures[request_id] = self.loop.create_future()
        self.acks[request_id] = None
        timer = self.loop.call_later(timeout / 1000.0, _give_up, future)
        try:
            self._send(frontend, request_id, -1, msg)
            await future
            return self.acks[request_id] or self._no_ack(request_id, timeout)
        finally:
            timer.cancel()
            del self.acks[request_id]
            self.ack_futures.pop(request_id, None)

    async def _predict(self, name: str, x: np.ndarray, key: str | None, version: str | None,
                       timeout_ms: float | None, request_id: str | None, traceparent: str | None = None) -> Result:
        self._start()
        rid, call = self._new_call(name, x, timeout_ms, request_id, key, _check_version(version))
        call.traceparent = traceparent
        future = self.futures[rid] = self.loop.create_future()
        try:
            self._send_call(rid)
            self._arm()
            return await future
        finally:
            if not future.done() or future.cancelled():  # its task was cancelled: so is the request
                self.futures.pop(rid, None)
                self._withdraw(rid)

    def cancel(self, request_id: str) -> bool:
        """Cancel a call in flight: its ``predict`` returns at once with error code
        ``cancelled`` (raises ``Cancelled`` with ``raise_errors``), and its frontend is told to
        stop its work. Cancelling the task awaiting ``predict`` does the same (the task ends
        with ``CancelledError``). False when the call is not in flight."""
        result = self._withdraw(request_id)
        if result is None:
            return False
        self._resolve(result)
        return True

    async def predict_batch(self, name: str, xs, key: str | list[str] | None = None, version: str | None = None,
                            timeout_ms: float | None = None, request_id: str | None = None,
                            raise_errors: bool | None = None, *, window: int = WINDOW,
                            context: str | None = None) -> list[Result]:
        """One query per row of ``xs``, at most ``window`` in flight at once (see
        ``Client.predict_batch``: keys and request ids); results in input order."""
        if timeout_ms is not None:
            _check_timeout(timeout_ms)
        xs, keys = _rows_and_keys(xs, _key_of(key, context) if not isinstance(key, list) else key)
        gate = asyncio.Semaphore(window)

        async def one(i: int, x: np.ndarray) -> Result:
            async with gate:
                return await self._predict(name, x, keys[i], version, timeout_ms,
                                           f"{request_id}-{i}" if request_id else None)

        return self._outcomes(list(await asyncio.gather(*(one(i, x) for i, x in enumerate(xs)))), raise_errors)

    async def close(self) -> None:
        self._unwatch()
        self._close_sockets()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _give_up(future: asyncio.Future) -> None:
    """A feedback's time ran out: wake its caller with no answer."""
    if not future.done():
        future.set_result(None)
