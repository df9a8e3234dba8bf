"""Keel's client library: sync (``Client``, here) and asyncio (``AsyncClient``, ``common.async_client``).

Each call has a request id and a deadline (``timeout_ms``, a finite number > 0, sent to
the frontend, which answers with the model's default output if the deadline passes).
Every call ends by its deadline plus ``grace_ms`` (default 50 ms: time for the
frontend's answer at its deadline to arrive; waited only while a frontend is connected),
whatever is at the other end, with exactly one ``Result``. Sends never block: a message
a socket cannot take yet waits in the client's send queue, drained as the socket takes
it, so a peer that refuses the connection, a socket that is not a frontend's or a frozen
frontend costs a call its deadline, never the caller's thread or event loop.

Calls are spread over the frontends round-robin. A call's time is cut into ``retries + 1``
slices: if no answer came in its slice, the call is sent again with the *same* request id
to another frontend (a frontend de-duplicates ids, so a retry is never computed twice
there), and the frontend that stayed silent is *suspect* for ``suspect_s`` seconds: new
calls go to the others meanwhile (if every frontend is suspect, round-robin again), and
any answer from it clears it. A frontend whose connection drops, is refused, or cannot be
made hands its calls to another at once instead of at the end of their slice. One retry
engine (``RetryEngine``, no sockets) does this for both clients.

A call no frontend answered ends with source ``error``, error code ``timeout`` and a
``reason`` saying why when the client can tell (``Reason``): ``refused`` (the CURVE
handshake failed, or the port is not a frontend's), ``unreachable`` (nothing accepted a
connection), ``timeout`` (connected, no answer); as exceptions ``Refused``,
``Unreachable`` and ``DeadlineExceeded``, the first two subclasses of the third.

Example
-------
>>> client = Client(["tcp://127.0.0.1:7000"])               # doctest: +SKIP
>>> result = client.predict("digits-mlp", x, timeout_ms=100)  # doctest: +SKIP
>>> result.source, result.output.argmax()                    # doctest: +SKIP
('model', 3)
>>> results = client.predict_batch("digits-mlp", xs)         # doctest: +SKIP

Cancelling (docs/guide/client.md): ``Client.cancel(request_id)`` for a submitted call,
``AsyncClient.cancel`` or cancelling the task awaiting ``predict``, and a cancelled future
of ``common.futures_client.FuturesClient``: the call ends at once (error code
``cancelled``, ``Cancelled``; the task or future cancelled) and a ``Cancel`` goes to each
frontend that may hold it, which drops its work. A call ending at its own deadline sends
none: the frontend holds the same deadline and drops the request there itself.

Errors as exceptions: ``Client(..., raise_errors=True)`` (or ``raise_errors=True`` on one
call, or ``result.raise_for_error()``) raises a ``KeelError`` subclass for a reply without
a prediction: ``BadInput``, ``UnknownModel``, ``Overloaded``, ``DeadlineExceeded`` (and
its ``Refused``, ``Unreachable``), ``ModelError``, ``Cancelled``, ``InternalError``;
``exc.result`` is the reply (source, error code, request id). Without it, results are
values, as before.
``dtypes={"model": "float32"}`` makes the client convert compatible inputs (float64, ints)
to the model's dtype, and refuse the others with ``BadInput`` naming the dtype expected
(the rules of ``common.inputs``, the gateways' too).
Both clients are context managers (``with Client(...)``, ``async with AsyncClient(...)``).

One call for every target (docs/guide/client.md): ``predict(name, x, key=None,
version=None, timeout_ms=None, request_id=None, raise_errors=None)`` reaches a model, an
application or a graph by its name. ``key`` is the call's key: an application's selection
context, a graph's stream (a plain model refuses one; ``context=`` is its deprecated name);
``version`` pins a model version (answered by it or refused). Every query carries the
client's id (``client_id``, one per client object unless given), so with the request id it
names the request on every connection and frontend: a retry anywhere is recognised.

Model selection (Clipper §5): an application is called by its name, with a key (a user, a
session) whose learned state picks and weighs its models; the result says which models
answered (``models``) and the ``confidence``. The true class, once known, goes back with
``feedback(request_id, y)`` to the frontend that answered:

>>> result = client.predict("digits-ensemble", x, key="alice")  # doctest: +SKIP
>>> result.source, result.models, result.confidence                # doctest: +SKIP
('ensemble', ['mlp-a', 'mlp-b', 'lenet'], 1.0)
>>> client.feedback(result.request_id, 3).ok                       # doctest: +SKIP
True
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
import uuid
import warnings
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from keel.common import inputs, protocol, transport
from keel.common.protocol import Cancel, ErrorCode, Feedback, Replies, Reply, Source
from keel.common.results import (BadInput, Cancelled, DeadlineExceeded, FeedbackResult, InternalError, KeelError,
                                 ModelError, Overloaded, Reason, Refused, Result, UnknownModel, Unreachable, error_for)
from keel.common.signature import INPUT, as_bytes
from keel.common.retry import LINK_EVENTS, Link, RetryEngine, _Call, link_events

# the results, errors and retry engine live in their own modules; their names stay importable from here
__all__ = ["ANSWERED_BY", "GRACE_MS", "WINDOW", "AsyncClient", "BadInput", "Cancelled", "Client", "DeadlineExceeded",
           "FeedbackResult", "InternalError", "KeelError", "Link", "ModelError", "Overloaded", "Reason", "Refused", "Result",
           "RetryEngine", "UnknownModel", "Unreachable", "coerce_input", "error_for"]

#: request id -> the frontend that answered it, kept for feedback, at most
ANSWERED_BY = 100_000
#: the attempt a ``Cancel`` waits in the send queue with (a query's attempts count from 0,
#: a feedback's is -1)
CANCEL = -2


def coerce_input(model: str, x, dtype: str | None) -> np.ndarray:
    """``x`` as an array of the model's ``dtype`` when that is safe (``common.inputs``: float64
    -> float32, ints -> floats, ints that fit); ``BadInput`` naming the dtype expected
    otherwise. Unknown dtype: as is."""
    if dtype is None:
        return np.asarray(x)
    try:
        return inputs.coerce(x, dtype, f"model {model}")  # the frontend checks shape and values
    except inputs.InputError as exc:
        result = Result("", Source.ERROR, error=str(exc), error_code=ErrorCode.BAD_REQUEST, model=model)
        raise BadInput(result, result.error) from None


def named_input(model: str, x: Mapping) -> dict[str, np.ndarray]:
    """A call's named tensors (``Predict.inputs``) as the wire carries them: each an array,
    C-contiguous; text (``str``, ``bytes``) an object array of ``bytes``. The frontend checks
    them against the model's signature (``BadInput`` naming what is wrong)."""
    out = {}
    for name, value in x.items():
        if not isinstance(name, str):
            raise TypeError(f"named inputs are keyed by their names (str), got {name!r}")
        arr = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object if _is_text(value) else None)
        if arr.dtype.kind in "OSU":
            try:
                arr = as_bytes(arr, f"input {name!r}")
            except inputs.InputError as exc:
                result = Result("", Source.ERROR, error=str(exc), error_code=ErrorCode.BAD_REQUEST, model=model)
                raise BadInput(result, result.error) from None
        # (ascontiguousarray would make a 0-d array, one value a query, of shape (1,))
        out[name] = arr if arr.dtype.kind == "O" or arr.flags.c_contiguous else np.ascontiguousarray(arr)
    return out


def _is_text(value) -> bool:
    """Whether ``value`` is text or a (nested) list of it: it goes as bytes."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return isinstance(value, (str, bytes))


def _key_of(key: str | None, context: str | None) -> str | None:
    """The call's key; ``context`` is its old name (a DeprecationWarning)."""
    if context is not None:
        if key is not None and key != context:
            raise ValueError(f"key {key!r} and context {context!r} differ: pass key only")
        warnings.warn("context= is deprecated: pass key= (the same value)", DeprecationWarning, stacklevel=3)
        key = context
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string, got {key!r} (timeout_ms and the rest are keyword arguments)")
    return key


def _rows_and_keys(xs, key: str | list[str] | None) -> tuple[list, list[str | None]]:
    """The rows of a batch and each row's key: one key for all, or a list of one per row."""
    rows = list(xs)
    if not isinstance(key, list):
        return rows, [key] * len(rows)
    if len(key) != len(rows):
        raise ValueError(f"{len(key)} keys for {len(rows)} rows: pass one key, or one per row")
    return rows, [_key_of(k, None) for k in key]


def _check_version(version: str | None) -> str | None:
    if version is not None and not isinstance(version, str):
        raise TypeError(f"version must be a string such as '2', got {version!r}")
    return version


#: calls ``predict_batch`` keeps in flight at once
WINDOW = 1000
#: default ``grace_ms``: a frontend answers at the deadline at the latest; this is the time
#: its answer has to arrive before the call gives up on it
GRACE_MS = 50.0


def _check_traceparent(value: str | None) -> str | None:
    """A W3C ``traceparent`` the call joins (OpenTelemetry, ``common.tracing``), checked here."""
    from keel.common.tracing import valid

    if value is not None and not valid(value):
        raise ValueError(f"traceparent {value!r} is not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)")
    return value


def _check_timeout(value: float, what: str = "timeout_ms") -> float:
    """A deadline must be a finite number > 0: NaN or infinity would never expire."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)



def _poll_ms(wait_s: float) -> int:
    """A wait in whole milliseconds, what ZeroMQ's poll counts in: a wait under one is one,
    not none. Rounded down to none, a caller waiting out a sub-millisecond gap (an
    open-loop sender between two arrivals) spun a core in poll, which on two cores took
    most of one from the processes it was measuring."""
    return math.ceil(wait_s * 1000) if wait_s > 0 else 0


class _Base:
    """What both clients share: options, the retry engine, sockets with their monitors,
    and the send queue that keeps every send non-blocking."""

    def __init__(self, frontends: list[str] | str, timeout_ms: float = 1000.0, retries: int = 1, grace_ms: float | None = None,
                 suspect_s: float = 5.0, *, raise_errors: bool = False, dtypes: dict[str, str] | None = None,
                 curve_keys: str | None = None, curve_name: str = "client", client_id: str | None = None):
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
        self.grace_ms, self.suspect_s = GRACE_MS if grace_ms is None else float(grace_ms), suspect_s
        self.engine = RetryEngine(self.frontends, retries, self.grace_ms / 1000.0, suspect_s)
        self.calls = self.engine.calls  # request id -> call in flight
        self.suspect_until = self.engine.suspect_until
        self.prefix = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        #: this client's id, sent in every Predict: with the request id it names a request on
        #: every connection and frontend, so a retry anywhere is recognised as one
        self.client_id = client_id or self.prefix
        self.counter = itertools.count(1)
        self.answered_by: OrderedDict[str, int] = OrderedDict()  # request id -> frontend, for feedback
        self.acks: dict[str, FeedbackResult | None] = {}  # feedback answers awaited (request id -> answer)
        self.ctx = zmq.Context()
        self.sockets: list[zmq.Socket | None] = [None] * len(self.frontends)  # made on first use
        self.monitors: list[zmq.Socket | None] = [None] * len(self.frontends)
        # per frontend: (request id, attempt or -1 for feedback, message) its socket has not taken yet
        self.outbox: list[deque[tuple[str, int, Any]]] = [deque() for _ in self.frontends]
        #: frontend i answered as columns (``Replies``) on its current connection: it reads a
        #: cork's queries as columns too (an older frontend, or another peer, never gets them)
        self.columns = [False] * len(self.frontends)
        self.corked = 0  # while > 0 (``Client.cork``), sends wait in the outbox to leave together

    @property
    def moved(self) -> int:
        """Calls sent to another frontend because theirs dropped, refused or was unreachable."""
        return self.engine.moved

    @property
    def expiry(self) -> list[tuple[float, str]]:
        return self.engine.expiry

    def _new_call(self, model: str, x: np.ndarray, timeout_ms: float | None, request_id: str | None,
                  key: str | None = None, version: str | None = None) -> tuple[str, _Call]:
        timeout = self.timeout_ms if timeout_ms is None else _check_timeout(timeout_ms)
        if type(x) is not np.ndarray and isinstance(x, Mapping):
            x = named_input(model, x)
        else:
            x = coerce_input(model, x, self.dtypes.get(model))
            # text: bytes go as a named tensor, the model's one input
            x = named_input(model, {INPUT: x}) if x.dtype.kind in "OSU" else np.ascontiguousarray(x)
        rid = request_id or f"{self.prefix}-{next(self.counter)}"
        now = time.perf_counter()
        call = _Call(model, x, timeout, now, now, 0, 0, key, now + timeout / 1000.0, version)
        # a corked call leaves with those before it in the cork: to the same frontend
        self.engine.start(rid, call, now, together=self.corked > 0)
        return rid, call

    # ------------------------------------------------------------------ sockets

    def _socket(self, i: int) -> zmq.Socket:
        """Frontend ``i``'s socket, made (with its monitor) if it has none."""
        sock = self.sockets[i]
        if sock is None:
            sock = self.sockets[i] = transport.make_socket(self.ctx, zmq.DEALER, curve_keys=self.curve)
            self.monitors[i] = sock.get_monitor_socket(LINK_EVENTS)  # before connecting: it sees every event
            self.engine.new_socket(i)
            sock.connect(self.frontends[i])
            self._watch(i)
        return sock

    def _watch(self, i: int) -> None:
        """Hook: start reading frontend ``i``'s new socket and monitor."""

    def _unwatch_one(self, i: int) -> None:
        """Hook: stop reading frontend ``i``'s socket and monitor (about to close)."""

    def _retire(self, i: int) -> None:
        """Close frontend ``i``'s socket: a refused ZeroMQ connection is never made again, so
        the next send makes a new socket (a key allowed since then gets through)."""
        sock, monitor = self.sockets[i], self.monitors[i]
        if sock is None:
            return
        self._unwatch_one(i)
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        self.sockets[i] = self.monitors[i] = None

    def _link_changed(self, i: int) -> list[str]:
        """Read frontend ``i``'s monitor; returns the calls the engine moved to another frontend."""
        monitor = self.monitors[i]
        if monitor is None:
            return []
        now, moved, refused = time.perf_counter(), [], False
        for event in link_events(monitor):
            moved += self.engine.link(i, event, now)
            if event == zmq.EVENT_DISCONNECTED:
                self.columns[i] = False  # the next peer there may be another
            refused |= event == zmq.EVENT_DISCONNECTED and self.engine.links[i] == Link.REFUSED
        if refused:
            self._retire(i)
        return moved

    # ------------------------------------------------------------------ sending

    def _send_call(self, rid: str) -> None:
        """Queue the current attempt of call ``rid`` for its frontend."""
        call = self.calls[rid]
        msg = self.engine.message(rid, call, time.perf_counter(), self.client_id)
        self._send(call.frontend, rid, call.attempt, msg)

    def _send(self, i: int, rid: str, attempt: int, msg) -> None:
        """Queue ``msg`` (encoded when it leaves: a cork's queries may leave as columns)."""
        self.outbox[i].append((rid, attempt, msg))
        if not self.corked:
            self._flush(i)

    def _live(self, i: int, rid: str, attempt: int) -> bool:
        """Is this queued message still wanted (its call's current attempt, its feedback awaited,
        a Cancel while its frontend may be reached: one that refused or cannot be reached has
        no request of ours to stop)?"""
        if attempt == CANCEL:
            return self.engine.reached(i)
        if attempt < 0:
            return rid in self.acks and self.acks[rid] is None
        call = self.calls.get(rid)
        return call is not None and call.frontend == i and call.attempt == attempt

    def _flush(self, i: int) -> None:
        """Hand frontend ``i``'s queued messages to its socket while it takes them, never blocking."""
        if self.ctx.closed:
            return  # a callback the loop ran after close
        box = self.outbox[i]
        while box:
            taken = []  # the live messages of the next bundle (one, unless sends were corked)
            while box and len(taken) < protocol.MAX_BUNDLE:
                entry = box.popleft()
                if self._live(i, entry[0], entry[1]):
                    taken.append(entry)
            if not taken:
                break
            if len(taken) == 1:
                frames = protocol.encode(taken[0][2])
            else:  # a cork's or a turn's: where the frontend reads columns, its queries as columns
                frames = protocol.encode_bundle([(m, None, protocol.column_key(m) if self.columns[i] else None)
                                                 for _, _, m in taken], protocol.MAX_COLUMN_BYTES)
            try:
                transport.send_frames(self._socket(i), frames, zmq.NOBLOCK)
            except zmq.Again:  # no peer takes it now (refused, at its high-water mark): later, or never
                box.extendleft(reversed(taken))
                self.outbox[i] = deque(e for e in box if self._live(i, *e[:2]))
                break
        self._writing(i, bool(self.outbox[i]))

    def _writing(self, i: int, waiting: bool) -> None:
        """Hook: frontend ``i`` has (or no longer has) messages its socket did not take."""

    def _flush_all(self) -> None:
        for i, box in enumerate(self.outbox):
            if box:
                self._flush(i)

    def _close_sockets(self) -> None:
        for i in range(len(self.frontends)):
            self._retire(i)
        self.ctx.term()

    # ------------------------------------------------------------------ cancelling

    def _withdraw(self, rid: str) -> Result | None:
        """End call ``rid`` now as cancelled by its caller: the engine forgets it, and each
        frontend that may hold it gets a ``Cancel`` (the frontend answers it once as
        cancelled and stops its work; that answer finds no call here and is dropped). A query
        still in the send queue is not sent at all. The call's result (error code
        ``cancelled``), or None when no call ``rid`` is in flight (answered, ended, unknown)."""
        call = self.engine.drop(rid)
        if call is None:
            return None
        now = time.perf_counter()
        unsent = any(r == rid and a == call.attempt for r, a, _ in self.outbox[call.frontend])
        held = [] if unsent else [call.frontend]
        if call.attempt:  # earlier attempts went to other frontends (the engine keeps not which)
            held += [i for i, sock in enumerate(self.sockets) if sock is not None and i != call.frontend]
        msg = Cancel(request_id=rid, client=self.client_id)
        for i in held:
            self._send(i, rid, CANCEL, msg)
        return Result(rid, Source.ERROR, None, "cancelled by the caller", ErrorCode.CANCELLED, call.model, None,
                      (now - call.sent) * 1000.0, self.frontends[call.frontend])

    # ------------------------------------------------------------------ answers

    def _finish(self, frames: list, frontend: int) -> list[Result]:
        """The results in one message from frontend ``frontend``: a reply, or a bundle of them
        (this client's queries ask for bundles, ``Predict.bundle``)."""
        try:
            replies = protocol.decode_all(frames)
        except protocol.ProtocolError:
            return []
        results = []
        for msg in replies:
            rows = (msg,)
            if type(msg) is Replies:  # columns: a reply a row; this frontend reads columns too
                rows, self.columns[frontend] = msg.replies(), True
            for reply in rows:
                result = self._result(reply, frontend)
                if result is not None:
                    results.append(result)
        return results

    def _result(self, reply, frontend: int) -> Result | None:
        """The result of one message from frontend ``frontend``, or None (a feedback's answer,
        a duplicate answer, another kind)."""
        if isinstance(reply, Feedback):
            if reply.request_id in self.acks and reply.ok is not None:
                self.acks[reply.request_id] = FeedbackResult(reply.request_id, reply.ok, reply.error, reply.error_code)
            return None
        if not isinstance(reply, Reply):
            return None
        call = self.engine.answered(reply.request_id, frontend)
        if call is None:
            return None  # a duplicate answer to a retried call: the first one counted
        if reply.models is not None:  # an application's call: its feedback goes to this frontend
            self.answered_by[reply.request_id] = frontend
            if len(self.answered_by) > ANSWERED_BY:
                self.answered_by.popitem(last=False)
        output = None if reply.output is None else np.array(reply.output)
        named = None
        if reply.outputs is not None:  # a named model's: copied off the frames; ``output`` the one if one
            named = {k: np.array(v) for k, v in reply.outputs.items()}
            output = next(iter(named.values())) if len(named) == 1 else None
        return Result(reply.request_id, reply.source, output, reply.error, reply.error_code, reply.model, reply.version,
                      (time.perf_counter() - call.sent) * 1000.0, self.frontends[frontend], reply.models,
                      reply.confidence, degraded=bool(reply.degraded), named=named)

    def _feedback_message(self, request_id: str, y: int) -> tuple[int, Feedback]:
        """(frontend, message) of a feedback: it goes to the frontend that answered the call."""
        if isinstance(y, bool) or not isinstance(y, (int, np.integer)) or y < 0:
            raise ValueError(f"feedback is a class index >= 0, got {y!r}")
        return self.answered_by.get(request_id, 0), Feedback(request_id=request_id, label=int(y))

    def _no_ack(self, request_id: str, timeout_ms: float) -> FeedbackResult:
        return FeedbackResult(request_id, False, f"no answer to the feedback within {timeout_ms:.0f} ms", ErrorCode.TIMEOUT)

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


class Client(_Base):
    """Blocking client; also open-loop via ``submit`` + ``collect``.

    Its loop is one ``zmq.Poller`` over the frontends' sockets (readable; writable while a
    message waits for one) and their monitors, woken by the retry engine's next slice end."""

    def __init__(self, frontends: list[str] | str, timeout_ms: float = 1000.0, retries: int = 1, grace_ms: float | None = None,
                 suspect_s: float = 5.0, **options):
        super().__init__(frontends, timeout_ms, retries, grace_ms, suspect_s, **options)
        self.poller = zmq.Poller()
        self.results: dict[str, Result] = {}
        self.owner: dict[zmq.Socket, int] = {}  # socket or monitor -> its frontend
        self.waiting: set[int] = set()  # frontends whose sockets are polled for room too

    def _watch(self, i: int) -> None:
        self.owner[self.sockets[i]] = self.owner[self.monitors[i]] = i
        self.poller.register(self.sockets[i], zmq.POLLIN)
        self.poller.register(self.monitors[i], zmq.POLLIN)

    def _unwatch_one(self, i: int) -> None:
        for sock in (self.sockets[i], self.monitors[i]):
            self.poller.unregister(sock)
            del self.owner[sock]
        self.waiting.discard(i)

    def _writing(self, i: int, waiting: bool) -> None:
        if self.sockets[i] is not None and waiting != (i in self.waiting):
            self.poller.register(self.sockets[i], zmq.POLLIN | zmq.POLLOUT if waiting else zmq.POLLIN)
            (self.waiting.add if waiting else self.waiting.discard)(i)

    @contextlib.contextmanager
    def cork(self):
        """Hold this client's sends until the block ends (or the client next waits for
        answers), then send them together: the queries for one frontend leave as one
        message, up to ``protocol.MAX_BUNDLE`` a message, each still its own request to the
        frontend. With several frontends, a cork's calls go to one while it is not suspect
        (``MAX_BUNDLE`` in a row at most), and corks go round-robin. For a sender with
        several queries due at once (an open-loop sender, ``predict_batch``): one send and
        one wake-up of the frontend for many.

        >>> with client.cork():                      # doctest: +SKIP
        ...     rids = [client.submit("m", x) for x in rows]
        """
        if not self.corked:
            self.engine.last = -1  # the cork's first call picks its frontend anew
        self.corked += 1
        try:
            yield self
        finally:
            self.corked -= 1
            if not self.corked:
                self._flush_all()

    def submit(self, name: str, x: np.ndarray | dict, key: str | None = None, version: str | None = None,
               timeout_ms: float | None = None, request_id: str | None = None, *, context: str | None = None,
               traceparent: str | None = None) -> str:
        """Send one query (as ``predict``) without waiting; its result comes from ``collect``."""
        key = _key_of(key, context)
        rid, call = self._new_call(name, x, timeout_ms, request_id, key, _check_version(version))
        call.traceparent = _check_traceparent(traceparent)
        self._send_call(rid)
        return rid

    def cancel(self, request_id: str) -> bool:
        """Cancel a submitted call: its result (error code ``cancelled``; ``Cancelled`` with
        ``raise_errors``) comes from ``collect`` at once, and its frontend is told to stop
        its work (docs/guide/client.md). False when the call is not in flight (answered,
        ended or unknown): its result stands."""
        result = self._withdraw(request_id)
        if result is None:
            return False
        self.results[request_id] = result  # the Cancel left already (with a cork: at its end)
        return True

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
            again, ended = self.engine.due(now)
            out.extend(ended)
            for rid in again:
                self._send_call(rid)
            self._flush_all()
            wait = 0.0 if out else max(0.0, end - now)
            next_due = self.engine.next_due()
            if next_due is not None:
                wait = min(wait, max(0.0, next_due - now))
            for sock, event in self.poller.poll(_poll_ms(wait)):
                i = self.owner.get(sock)
                if i is None:
                    continue  # closed by an event handled before it in this round
                if sock is self.monitors[i]:
                    for rid in self._link_changed(i):
                        self._send_call(rid)
                    continue
                if event & zmq.POLLOUT:
                    self._flush(i)
                if not event & zmq.POLLIN:
                    continue
                for frames in transport.drain(sock, 100_000):
                    out += self._finish(frames, i)
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

    def predict(self, name: str, x: np.ndarray | dict, key: str | None = None, version: str | None = None,
                timeout_ms: float | None = None, request_id: str | None = None, raise_errors: bool | None = None,
                *, context: str | None = None, traceparent: str | None = None) -> Result:
        """One query of a target: a model, an application or a graph, by its name.

        Parameters
        ----------
        name : str
            The model, application or graph (``keel status`` lists a frontend's targets).
        x : array-like or dict
            One input of the target's input shape; or its named inputs, name -> array-like
            (a model with a signature, ``docs/guide/models.md``; text as ``str`` or ``bytes``).
            The result's ``outputs`` names every output, ``output`` is the one when there is one.
        key : str, optional
            The call's key: an application's selection context (a user, a session: whose
            learned state picks and weighs its models), a graph's stream (whose state it
            keeps). A plain model takes none (``BadInput``). ``context=`` is its deprecated name.
        version : str, optional
            Pins a model version: answered by it, or refused (``UnknownModel``, naming the
            versions served) when the frontend does not serve it.
        timeout_ms : float, optional
            The deadline (default: the client's ``timeout_ms``).
        request_id : str, optional
            The request's id (default: made up); a call sent again with the same id is
            recognised by the frontend as a retry (with this client's ``client_id``).
        raise_errors : bool, optional
            Raise a ``KeelError`` instead of returning a result without a prediction
            (default: the client's ``raise_errors``).
        traceparent : str, optional
            A W3C trace context (``00-<trace id>-<span id>-<flags>``): with tracing on
            (``[tracing]``), a sampled one makes the request's spans part of the caller's trace.
        """
        rid = self.submit(name, x, _key_of(key, context), version, timeout_ms, request_id, traceparent=traceparent)
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
            end = time.perf_counter() + timeout / 1000.0
            self._send(frontend, request_id, -1, msg)
            while self.acks[request_id] is None and time.perf_counter() < end:
                for result in self._poll(min(50.0, max(0.0, (end - time.perf_counter()) * 1000.0))):
                    self.results[result.request_id] = result  # a submitted call's: for its collect
            return self.acks[request_id] or self._no_ack(request_id, timeout)
        finally:
            del self.acks[request_id]

    def predict_batch(self, name: str, xs, key: str | list[str] | None = None, version: str | None = None,
                      timeout_ms: float | None = None, request_id: str | None = None,
                      raise_errors: bool | None = None, *, window: int = WINDOW, context: str | None = None) -> list[Result]:
        """One query per row of ``xs`` (as ``predict``); results in input order.

        ``key`` is one key for every row (a string) or one per row (a list as long as
        ``xs``); ``request_id``, if given, names row ``i`` ``{request_id}-{i}``. At most
        ``window`` calls are in flight at once: a frontend drops replies that do not fit a
        client's queue, so a client that sent everything before reading would lose answers
        on a large batch."""
        if timeout_ms is not None:
            _check_timeout(timeout_ms)
        xs, keys = _rows_and_keys(xs, _key_of(key, context) if not isinstance(key, list) else key)
        rids: list[str] = []
        wanted: set[str] = set()
        got: dict[str, Result] = {}
        with self.cork():  # the rows leave together (a wait for answers sends what is held)
            for i, x in enumerate(xs):
                if len(wanted) >= window:
                    self._gather(wanted, got, window - 1)
                rid = self.submit(name, x, keys[i], version, timeout_ms, f"{request_id}-{i}" if request_id else None)
                rids.append(rid)
                wanted.add(rid)
        self._gather(wanted, got)
        return self._outcomes([got[r] for r in rids], raise_errors)

    def close(self) -> None:
        self._close_sockets()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
