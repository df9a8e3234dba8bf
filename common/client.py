"""Keel's client library: sync (``Client``) and asyncio (``AsyncClient``).

Each call has a request id and a deadline (``timeout_ms``, a finite number > 0, sent to
the frontend, which answers with the model's default output if the deadline passes).
Calls are spread over the frontends round-robin. If no answer arrives by the deadline
plus a grace period, the call is retried with the *same* request id against another
frontend (a frontend de-duplicates ids, so a retry is never computed twice there), and
the frontend that timed out is *suspect* for ``suspect_s`` seconds: new calls go to the
others meanwhile (if every frontend is suspect, round-robin again), and any answer from
it clears it. After ``retries`` retries the call ends with source ``error`` and error
code ``timeout``. Every call ends with exactly one ``Result``.

Example
-------
>>> client = Client(["tcp://127.0.0.1:7000"])               # doctest: +SKIP
>>> result = client.predict("digits-mlp", x, timeout_ms=100)  # doctest: +SKIP
>>> result.source, result.output.argmax()                    # doctest: +SKIP
('model', 3)
>>> results = client.predict_batch("digits-mlp", xs)         # doctest: +SKIP

Errors as exceptions: ``Client(..., raise_errors=True)`` (or ``raise_errors=True`` on one
call, or ``result.raise_for_error()``) raises a ``KeelError`` subclass for a reply without
a prediction: ``BadInput``, ``UnknownModel``, ``Overloaded``, ``DeadlineExceeded``,
``ModelError``, ``InternalError``; ``exc.result`` is the reply (source, error code, request
id). Without it, results are values, as before. ``dtypes={"model": "float32"}`` makes the
client convert compatible inputs (float64, ints) to the model's dtype, and refuse the
others with ``BadInput`` naming the dtype expected. Both clients are context managers
(``with Client(...)``, ``async with AsyncClient(...)``).

Model selection (Clipper §5; docs/guide/client.md): an application is called by its name,
with a ``context`` (a user, a session) whose learned state picks and weighs its models;
the result says which models answered (``models``) and the ``confidence``. The true class,
once known, goes back with ``feedback(request_id, y)`` to the frontend that answered:

>>> result = client.predict("digits-ensemble", x, context="alice")  # doctest: +SKIP
>>> result.source, result.models, result.confidence                # doctest: +SKIP
('ensemble', ['mlp-a', 'mlp-b', 'lenet'], 1.0)
>>> client.feedback(result.request_id, 3).ok                       # doctest: +SKIP
True
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import zmq

from keel.common import protocol, transport
from keel.common.protocol import ErrorCode, Feedback, Predict, Reply, Source


@dataclass(slots=True)
class Result:
    request_id: str
    source: str
    output: np.ndarray | None = None
    error: str | None = None
    error_code: str | None = None
    model: str | None = None
    version: str | None = None
    latency_ms: float = 0.0
    frontend: str = ""
    #: an application's call: the models whose outputs the answer used, and its confidence
    models: list[str] | None = None
    confidence: float | None = None

    @property
    def ok(self) -> bool:
        return self.source not in (Source.ERROR,) and self.output is not None


    def raise_for_error(self) -> Result:
        """This result if it carries a prediction; else the ``KeelError`` subclass of its error."""
        if not self.ok:
            raise error_for(self)
        return self


@dataclass(slots=True)
class FeedbackResult:
    """The frontend's answer to ``feedback``: ``ok`` if it learned from it; otherwise why not
    (``error_code`` ``unknown_request``: unknown, repeated or expired request id;
    ``bad_request``: not a class; ``timeout``: no answer)."""

    request_id: str
    ok: bool
    error: str | None = None
    error_code: str | None = None


#: request id -> the frontend that answered it, kept for feedback, at most
ANSWERED_BY = 100_000


class KeelError(Exception):
    """A request that ended without a prediction. ``result`` is its reply: ``source``,
    ``error_code``, ``request_id``, ``model`` stay readable."""

    code: str | None = None

    def __init__(self, result: Result, message: str | None = None):
        super().__init__(message or f"{result.error_code or result.source}: {result.error or 'no output'}"
                         f" (model {result.model}, request {result.request_id})")
        self.result = result

    @property
    def source(self) -> str:
        return self.result.source

    @property
    def error_code(self) -> str | None:
        return self.result.error_code

    @property
    def request_id(self) -> str:
        return self.result.request_id


class BadInput(KeelError, ValueError):
    """The input was refused: wrong shape or dtype, NaN, too large, a reused request id."""

    code = ErrorCode.BAD_REQUEST


class UnknownModel(KeelError, LookupError):
    """No such model (or version) is served."""

    code = ErrorCode.UNKNOWN_MODEL


class Overloaded(KeelError):
    """The frontend's admission limit was reached: back off and retry."""

    code = ErrorCode.OVERLOADED


class DeadlineExceeded(KeelError, TimeoutError):
    """The deadline passed with no prediction and no default output, or no frontend answered."""

    code = ErrorCode.DEADLINE


class ModelError(KeelError):
    """The model raised on this query's batch."""

    code = ErrorCode.MODEL_ERROR


class InternalError(KeelError):
    """Anything else that went wrong inside Keel."""

    code = ErrorCode.INTERNAL


_ERRORS: dict[str, type[KeelError]] = {
    ErrorCode.BAD_REQUEST: BadInput, ErrorCode.UNKNOWN_MODEL: UnknownModel, ErrorCode.OVERLOADED: Overloaded,
    ErrorCode.DEADLINE: DeadlineExceeded, ErrorCode.TIMEOUT: DeadlineExceeded, ErrorCode.MODEL_ERROR: ModelError,
}


def error_for(result: Result) -> KeelError:
    """The typed exception of a result without a prediction."""
    return _ERRORS.get(result.error_code or "", InternalError)(result)


def coerce_input(model: str, x, dtype: str | None) -> np.ndarray:
    """``x`` as an array of the model's ``dtype`` when that is safe (float64 -> float32,
    ints -> floats); ``BadInput`` naming the dtype expected otherwise. Unknown dtype: as is."""
    arr = np.asarray(x)
    if dtype is None or arr.dtype == dtype:
        return arr
    want = np.dtype(dtype)
    if np.can_cast(arr.dtype, want, "same_kind") and not (arr.dtype.kind == "f" and want.kind in "iub"):
        return arr.astype(want)
    result = Result("", Source.ERROR, error=f"model {model} takes {want.name} input; {arr.dtype.name} cannot be "
                    f"converted to it safely", error_code=ErrorCode.BAD_REQUEST, model=model)
    raise BadInput(result, result.error)


@dataclass(slots=True)
class _Call:
    model: str
    x: np.ndarray
    timeout_ms: float
    sent: float  # perf_counter of the first send
    expires: float  # perf_counter after which this attempt counts as lost
    attempt: int
    frontend: int
    context: str | None = None


#: calls ``predict_batch`` keeps in flight at once
WINDOW = 1000


def _check_timeout(value: float, what: str = "timeout_ms") -> float:
    """A deadline must be a finite number > 0: NaN or infinity would never expire."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)


class _Base:
    def __init__(self, frontends: list[str] | str, timeout_ms: float = 1000.0, retries: int = 1, grace_ms: float | None = None,
                 suspect_s: float = 5.0, *, raise_errors: bool = False, dtypes: dict[str, str] | None = None,
                 curve_keys: str | None = None, curve_name: str = "client"):
        #: CURVE (common.curve): this client's keypair ``curve_name`` from the keys folder
        from keel.common import curve

        self.curve = curve.load(curve_keys, curve_name) if curve_keys else None
        #: raise a KeelError subclass instead of returning a result without a prediction
        self.raise_errors = raise_errors
        #: model -> input dtype: compatible inputs are converted, others refused (BadInput)
        self.dtypes = dict(dtypes or {})
        self.frontends = [frontends] if isinstance(frontends, str) else list(frontends)
        if not self.frontends:
            raise ValueError("a client needs at least one frontend endpoint")
        if type(retries) is not int or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        if grace_ms is not None and grace_ms != 0:
            _check_timeout(grace_ms, "grace_ms")
        if not (isinstance(suspect_s, (int, float)) and math.isfinite(suspect_s) and suspect_s >= 0):
            raise ValueError(f"suspect_s must be a finite number >= 0, got {suspect_s!r}")
        self.timeout_ms, self.retries = _check_timeout(timeout_ms), retries
        self.grace_ms, self.suspect_s = grace_ms, suspect_s
        self.turn = 0  # round-robin: the frontend the next call tries first
        self.suspect_until = [0.0] * len(self.frontends)  # perf_counter; a frontend that timed out
        self.prefix = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.counter = itertools.count(1)
        self.calls: dict[str, _Call] = {}
        self.expiry: list[tuple[float, str]] = []  # heap of (expires, request id); stale entries skipped
        self.answered_by: OrderedDict[str, int] = OrderedDict()  # request id -> frontend, for feedback
        self.acks: dict[str, FeedbackResult] = {}  # feedback answers awaited (request id -> answer)

    def _new_call(self, model: str, x: np.ndarray, timeout_ms: float | None, request_id: str | None,
                  context: str | None = None) -> tuple[str, _Call]:
        timeout = self.timeout_ms if timeout_ms is None else _check_timeout(timeout_ms)
        x = coerce_input(model, x, self.dtypes.get(model))
        rid = request_id or f"{self.prefix}-{next(self.counter)}"
        now = time.perf_counter()
        call = _Call(model, np.ascontiguousarray(x), timeout, now, now + self._patience(timeout), 0, self._pick(now),
                     context)
        self.calls[rid] = call
        heapq.heappush(self.expiry, (call.expires, rid))
        return rid, call

    def _pick(self, now: float, avoid: int = -1) -> int:
        """The frontend for the next attempt: round-robin over those not suspect (and not
        ``avoid``, the one that just timed out); round-robin over all if none is left."""
        n = len(self.frontends)
        if n == 1:
            return 0
        start = self.turn
        self.turn = (start + 1) % n
        for j in range(n):
            i = (start + j) % n
            if i != avoid and self.suspect_until[i] <= now:
                return i
        return start if start != avoid else (start + 1) % n

    def _timed_out(self, frontend: int, now: float) -> None:
        self.suspect_until[frontend] = now + self.suspect_s

    def _patience(self, timeout_ms: float) -> float:
        grace = self.grace_ms if self.grace_ms is not None else max(250.0, 0.5 * timeout_ms)
        return (timeout_ms + grace) / 1000.0

    def _message(self, rid: str, call: _Call) -> Predict:
        return Predict(request_id=rid, model=call.model, input=call.x, timeout_ms=call.timeout_ms, context=call.context)

    def _finish(self, frames: list, frontend: int) -> Result | None:
        try:
            reply = protocol.decode(frames)
        except protocol.ProtocolError:
            return None
        if isinstance(reply, Feedback):
            if reply.request_id in self.acks and reply.ok is not None:
                self.acks[reply.request_id] = FeedbackResult(reply.request_id, reply.ok, reply.error, reply.error_code)
            return None
        if not isinstance(reply, Reply):
            return None
        self.suspect_until[frontend] = 0.0  # it answers
        call = self.calls.pop(reply.request_id, None)
        if call is None:
            return None  # a duplicate answer to a retried call: the first one counted
        if reply.models is not None:  # an application's call: its feedback goes to this frontend
            self.answered_by[reply.request_id] = frontend
            if len(self.answered_by) > ANSWERED_BY:
                self.answered_by.popitem(last=False)
        output = None if reply.output is None else np.array(reply.output)
        return Result(reply.request_id, reply.source, output, reply.error, reply.error_code, reply.model, reply.version,
                      (time.perf_counter() - call.sent) * 1000.0, self.frontends[frontend], reply.models,
                      reply.confidence)

    def _feedback_message(self, request_id: str, y: int) -> tuple[int, Feedback]:
        """(frontend, message) of a feedback: it goes to the frontend that answered the call."""
        if isinstance(y, bool) or not isinstance(y, (int, np.integer)) or y < 0:
            raise ValueError(f"feedback is a class index >= 0, got {y!r}")
        return self.answered_by.get(request_id, 0), Feedback(request_id=request_id, label=int(y))

    def _no_ack(self, request_id: str, timeout_ms: float) -> FeedbackResult:
        return FeedbackResult(request_id, False, f"no answer to the feedback within {timeout_ms:.0f} ms", ErrorCode.TIMEOUT)

    def _overdue(self, now: float) -> tuple[list[tuple[str, _Call]], list[Result]]:
        """Calls whose attempt timed out: (to retry, given up)."""
        retry, failed = [], []
        while self.expiry and self.expiry[0][0] <= now:
            _, rid = heapq.heappop(self.expiry)
            call = self.calls.get(rid)
            if call is None or call.expires > now:
                continue  # answered, or a stale entry of an earlier attempt
            self._timed_out(call.frontend, now)
            if call.attempt < self.retries:
                call.attempt += 1
                call.frontend = self._pick(now, avoid=call.frontend)
                call.expires = now + self._patience(call.timeout_ms)
                heapq.heappush(self.expiry, (call.expires, rid))
                retry.append((rid, call))
            else:
                del self.calls[rid]
                failed.append(Result(rid, Source.ERROR, None, f"no answer within {call.timeout_ms:.0f} ms after {call.attempt + 1} attempt(s)",
                                     ErrorCode.TIMEOUT, call.model, None, (now - call.sent) * 1000.0))
        return retry, failed

    def _disconnected(self, frontend: int, now: float) -> list[tuple[str, _Call]]:
        """A frontend's connection dropped (its process died, its host went away): its calls
        with attempts left go to another frontend at once, under the same request id,
        instead of waiting for their timeout (issue 10)."""
        self._timed_out(frontend, now)
        moved = []
        for rid, call in self.calls.items():
            if call.frontend == frontend and call.attempt < self.retries:
                call.attempt += 1
                call.frontend = self._pick(now, avoid=frontend)
                call.expires = now + self._patience(call.timeout_ms)
                heapq.heappush(self.expiry, (call.expires, rid))
                moved.append((rid, call))
        return moved

    def _outcome(self, result: Result, raise_errors: bool | None) -> Result:
        if (self.raise_errors if raise_errors is None else raise_errors) and not result.ok:
            raise error_for(result)
        return result

    def _outcomes(self, results: list[Result], raise_errors: bool | None) -> list[Result]:
        """Results in order; with errors raised, the first failure's exception (``.results``: all)."""
        if self.raise_errors if raise_errors is None else raise_errors:
            failed = next((r for r in results if not r.ok), None)
            if failed is not None:
                exc = error_for(failed)
                exc.results = results
                raise exc
        return results

    def _next_expiry(self) -> float | None:
        while self.expiry and self.expiry[0][1] not in self.calls:
            heapq.heappop(self.expiry)
        return self.expiry[0][0] if self.expiry else None


class Client(_Base):
    """Blocking client; also open-loop via ``submit`` + ``collect``."""

    def __init__(self, frontends: list[str] | str, timeout_ms: float = 1000.0, retries: int = 1, grace_ms: float | None = None,
                 suspect_s: float = 5.0, **options):
        super().__init__(frontends, timeout_ms, retries, grace_ms, suspect_s, **options)
        self.ctx = zmq.Context()
        self.sockets: list[zmq.Socket | None] = [None] * len(self.frontends)
        self.poller = zmq.Poller()
        self.results: dict[str, Result] = {}
        self.monitors: dict[zmq.Socket, int] = {}  # socket monitor -> its frontend
        self.moved = 0  # calls sent to another frontend because theirs disconnected

    def _socket(self, i: int) -> zmq.Socket:
        sock = self.sockets[i]
        if sock is None:
            sock = self.sockets[i] = transport.make_socket(self.ctx, zmq.DEALER, connect=self.frontends[i],
                                                           curve_keys=self.curve)
            self.poller.register(sock, zmq.POLLIN)
            if len(self.frontends) > 1 and self.retries:
                monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                self.monitors[monitor] = i
                self.poller.register(monitor, zmq.POLLIN)
        return sock

    def _on_monitor(self, monitor: zmq.Socket) -> None:
        if transport.disconnect_seen(monitor):
            for rid, call in self._disconnected(self.monitors[monitor], time.perf_counter()):
                self.moved += 1
                transport.send(self._socket(call.frontend), self._message(rid, call))

    def submit(self, model: str, x: np.ndarray, timeout_ms: float | None = None, request_id: str | None = None,
               context: str | None = None) -> str:
        rid, call = self._new_call(model, x, timeout_ms, request_id, context)
        transport.send(self._socket(call.frontend), self._message(rid, call))
        return rid

    def collect(self, timeout_ms: float = 0.0) -> list[Result]:
        """Results that arrived, waiting up to ``timeout_ms`` for at least one."""
        out = list(self.results.values())
        self.results.clear()
        return out if out else self._poll(timeout_ms)

    def _poll(self, timeout_ms: float) -> list[Result]:
        """Results off the sockets (not those set aside), waiting up to ``timeout_ms``."""
        out: list[Result] = []
        end = time.perf_counter() + timeout_ms / 1000.0
        while True:
            now = time.perf_counter()
            retry, failed = self._overdue(now)
            out.extend(failed)
            for rid, call in retry:
                transport.send(self._socket(call.frontend), self._message(rid, call))
            wait = 0.0 if out else max(0.0, end - now)
            next_expiry = self._next_expiry()
            if next_expiry is not None:
                wait = min(wait, max(0.0, next_expiry - now))
            for sock, _ in self.poller.poll(wait * 1000):
                if sock in self.monitors:
                    self._on_monitor(sock)
                    continue
                i = self.sockets.index(sock)
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    result = self._finish(frames, i)
                    if result is not None:
                        out.append(result)
            if out or any(self.acks.values()) or time.perf_counter() >= end:
                return out

    def _gather(self, wanted: set[str], got: dict[str, Result], limit: int = 0) -> None:
        """Move results of ``wanted`` calls into ``got`` until at most ``limit`` are left;
        others' results are set aside for their ``collect``."""
        for rid in [r for r in wanted if r in self.results]:
            wanted.discard(rid)
            got[rid] = self.results.pop(rid)
        while len(wanted) > limit:
            for result in self._poll(50.0):
                if result.request_id in wanted:
                    wanted.discard(result.request_id)
                    got[result.request_id] = result
                else:
                    self.results[result.request_id] = result  # someone else's submit

    def predict(self, model: str, x: np.ndarray, timeout_ms: float | None = None, request_id: str | None = None,
                raise_errors: bool | None = None, context: str | None = None) -> Result:
        """One query of a model, or of an application (by its name) in ``context``."""
        rid = self.submit(model, x, timeout_ms, request_id, context)
        got: dict[str, Result] = {}
        self._gather({rid}, got)
        return self._outcome(got[rid], raise_errors)

    def feedback(self, request_id: str, y: int, timeout_ms: float | None = None) -> FeedbackResult:
        """The true class ``y`` of an answered application call, to the frontend that
        answered it; the answer says whether it learned from it (once per call)."""
        timeout = self.timeout_ms if timeout_ms is None else _check_timeout(timeout_ms)
        frontend, msg = self._feedback_message(request_id, y)
        self.acks[request_id] = None
        try:
            transport.send(self._socket(frontend), msg)
            end = time.perf_counter() + timeout / 1000.0
            while self.acks[request_id] is None and time.perf_counter() < end:
                for result in self._poll(min(50.0, max(0.0, (end - time.perf_counter()) * 1000.0))):
                    self.results[result.request_id] = result  # a submitted call's: for its collect
            return self.acks[request_id] or self._no_ack(request_id, timeout)
        finally:
            del self.acks[request_id]

    def predict_batch(self, model: str, xs, timeout_ms: float | None = None, window: int = WINDOW,
                      raise_errors: bool | None = None) -> list[Result]:
        """One query per row of ``xs``; results in input order.

        At most ``window`` calls are in flight at once: a frontend drops replies that do
        not fit a client's queue, so a client that sent everything before reading would
        lose answers (and, before that, both sides could block) on a large batch."""
        if timeout_ms is not None:
            _check_timeout(timeout_ms)
        rids: list[str] = []
        wanted: set[str] = set()
        got: dict[str, Result] = {}
        for x in xs:
            if len(wanted) >= window:
                self._gather(wanted, got, window - 1)
            rid = self.submit(model, x, timeout_ms)
            rids.append(rid)
            wanted.add(rid)
        self._gather(wanted, got)
        return self._outcomes([got[r] for r in rids], raise_errors)

    def close(self) -> None:
        for monitor in self.monitors:
            monitor.close(0)
        for sock in self.sockets:
            if sock is not None:
                sock.close(0)
        self.ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Base):
    """asyncio client: ``await client.predict(...)``; many calls may be in flight.

    Its sockets are plain ZeroMQ sockets watched with ``loop.add_reader``: a reply
    resolves its call's future in the reader callback itself, with no reader task and no
    ``wait_for`` task per call between them (each of those costs a turn of the loop; with
    ``zmq.asyncio`` one outstanding call was 6-17% slower than the blocking ``Client``).
    A ZeroMQ socket's descriptor is edge-triggered, so after every send the socket is
    drained too, and each socket is read once when the loop starts watching it (a descriptor
    signals only after a read found its socket empty).

    As in ``Client``, with several frontends and retries, a frontend's socket disconnect
    (its process died, its host went away) ends the current attempt of every call it held
    at once: each goes to another frontend under the same request id."""

    def __init__(self, frontends: list[str] | str, timeout_ms: float = 1000.0, retries: int = 1, grace_ms: float | None = None,
                 suspect_s: float = 5.0, **options):
        super().__init__(frontends, timeout_ms, retries, grace_ms, suspect_s, **options)
        self.ctx = zmq.Context()
        self.sockets = [transport.make_socket(self.ctx, zmq.DEALER, connect=f, curve_keys=self.curve) for f in self.frontends]
        watch = len(self.frontends) > 1 and self.retries
        self.monitors = [s.get_monitor_socket(zmq.EVENT_DISCONNECTED) for s in self.sockets] if watch else []
        self.moved = 0  # calls sent to another frontend because theirs disconnected
        self.futures: dict[str, asyncio.Future] = {}
        self.ack_futures: dict[str, asyncio.Future] = {}  # feedback answers awaited
        self.loop: asyncio.AbstractEventLoop | None = None

    def _start(self) -> None:
        """Watch the sockets from the running loop (again, if the client moved to another)."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:
            self._unwatch()
            self.loop = loop
            # a socket's descriptor signals only after a read found it empty: each read here
            # (of nothing, at first) arms it
            for i, sock in enumerate(self.sockets):
                loop.add_reader(sock.getsockopt(zmq.FD), self._drain, i)
                self._drain(i)
            for i, monitor in enumerate(self.monitors):
                loop.add_reader(monitor.getsockopt(zmq.FD), self._on_monitor, i)
                self._on_monitor(i)

    def _unwatch(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            for sock in self.sockets + self.monitors:
                self.loop.remove_reader(sock.getsockopt(zmq.FD))
        self.loop = None

    def _on_monitor(self, i: int) -> None:
        """Frontend ``i`` disconnected: wake every call it holds (with no answer), so each
        takes its next attempt, on another frontend, now."""
        if not transport.disconnect_seen(self.monitors[i]):
            return
        self._timed_out(i, time.perf_counter())
        for rid, call in self.calls.items():
            future = self.futures.get(rid)
            if call.frontend == i and future is not None and not future.done():
                self.moved += call.attempt < self.retries
                future.set_result(None)

    def _drain(self, i: int) -> None:
        """Read every reply waiting on frontend ``i``'s socket; each resolves its call."""
        sock = self.sockets[i]
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            result = self._finish(sock.recv_multipart(zmq.NOBLOCK, copy=False), i)
            for rid, future in self.ack_futures.items():
                if self.acks.get(rid) is not None and not future.done():
                    future.set_result(None)
            if result is not None:
                future = self.futures.pop(result.request_id, None)
                if future is not None and not future.done():
                    future.set_result(result)

    async def predict(self, model: str, x: np.ndarray, timeout_ms: float | None = None, request_id: str | None = None,
                      raise_errors: bool | None = None, context: str | None = None) -> Result:
        """One query of a model, or of an application (by its name) in ``context``."""
        return self._outcome(await self._predict(model, x, timeout_ms, request_id, context), raise_errors)

    async def feedback(self, request_id: str, y: int, timeout_ms: float | None = None) -> FeedbackResult:
        """As ``Client.feedback``."""
        self._start()
        timeout = self.timeout_ms if timeout_ms is None else _check_timeout(timeout_ms)
        frontend, msg = self._feedback_message(request_id, y)
        future = self.ack_futures[request_id] = self.loop.create_future()
        self.acks[request_id] = None
        timer = self.loop.call_later(timeout / 1000.0, _give_up, future)
        try:
            transport.send(self.sockets[frontend], msg)
            self._drain(frontend)
            await future
            return self.acks[request_id] or self._no_ack(request_id, timeout)
        finally:
            timer.cancel()
            del self.acks[request_id]
            self.ack_futures.pop(request_id, None)

    async def _predict(self, model: str, x: np.ndarray, timeout_ms: float | None, request_id: str | None,
                       context: str | None = None) -> Result:
        self._start()
        rid, call = self._new_call(model, x, timeout_ms, request_id, context)
        for attempt in range(self.retries + 1):
            if attempt:
                call.attempt, call.frontend = attempt, self._pick(time.perf_counter(), avoid=call.frontend)
            # A new future per attempt: the timer resolves it with None; a late answer to an
            # earlier attempt (same request id) resolves the current one.
            future = self.futures[rid] = self.loop.create_future()
            transport.send(self.sockets[call.frontend], self._message(rid, call))
            self._drain(call.frontend)
            timer = self.loop.call_later(self._patience(call.timeout_ms), _give_up, future)
            try:
                result = await future
            finally:
                timer.cancel()
            if result is not None:
                return result
            self._timed_out(call.frontend, time.perf_counter())
        self.calls.pop(rid, None)
        self.futures.pop(rid, None)
        return Result(rid, Source.ERROR, None, f"no answer within {call.timeout_ms:.0f} ms after {self.retries + 1} attempt(s)",
                      ErrorCode.TIMEOUT, model, None, (time.perf_counter() - call.sent) * 1000.0)

    async def predict_batch(self, model: str, xs, timeout_ms: float | None = None, window: int = WINDOW,
                            raise_errors: bool | None = None) -> list[Result]:
        """One query per row of ``xs``, at most ``window`` in flight at once (see
        ``Client.predict_batch``); results in input order."""
        if timeout_ms is not None:
            _check_timeout(timeout_ms)
        gate = asyncio.Semaphore(window)

        async def one(x: np.ndarray) -> Result:
            async with gate:
                return await self._predict(model, x, timeout_ms, None)

        return self._outcomes(list(await asyncio.gather(*(one(x) for x in xs))), raise_errors)

    async def close(self) -> None:
        self._unwatch()
        for sock in self.monitors + self.sockets:
            sock.close(0)
        self.ctx.term()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _give_up(future: asyncio.Future) -> None:
    """An attempt's patience ran out: wake its caller with no answer."""
    if not future.done():
        future.set_result(None)
