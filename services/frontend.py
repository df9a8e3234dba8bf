"""Frontend: the clients' ROUTER; answers every accepted request exactly once.

Per request (Clipper §4): validate the query against the model's declared input (a bad
one is answered ``bad_request``); de-duplicate by request id (a retried id is computed
once and answered the same); look it up in the CLOCK prediction cache; attach it to an
identical query already in flight (one computation, many waiters); admit it only while
fewer than ``admission_limit`` are pending (else ``overloaded``); hand it to the
dispatcher. The first of {prediction, reconstruction} answers; if the deadline passes
first the model's default output answers, marked ``default``. Every reply names its
source. Late predictions are counted, and checked against earlier reconstructions.
"""
from __future__ import annotations

import heapq
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

import numpy as np
import zmq

from common import protocol, transport
from common.config import FrontendConfig
from common.protocol import ErrorCode, Predict, Predictions, Queries, Reply, Source, Status
from services.base import Service
from services.cache import ClockCache

#: answered request ids remembered for de-duplication, at most
DEDUP_ENTRIES = 200_000


@dataclass(slots=True)
class Waiter:
    envelope: list
    request_id: str
    start: float  # perf_counter at arrival


@dataclass(slots=True)
class Pending:
    qid: int
    model: str
    version: str
    deadline: float  # wall clock
    key: bytes | None
    waiters: list = field(default_factory=list)


class Frontend(Service):
    role = "frontend"

    def __init__(self, cfg: FrontendConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.router = self.add_socket(transport.make_socket(self.ctx, zmq.ROUTER, bind=cfg.client_endpoint), self._on_clients)
        self.pull = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=cfg.prediction_endpoint), self._on_predictions)
        self.push = self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=cfg.dispatcher_endpoint))
        self.reply_to = transport.endpoint_of(self.pull)
        self.cache = ClockCache(cfg.cache_size) if cfg.cache_size else None
        self.pending: dict[int, Pending] = {}
        self.by_request: dict[str, Pending] = {}
        self.by_key: dict[bytes, Pending] = {}
        self.answered: OrderedDict[str, tuple[list, float]] = OrderedDict()  # request id -> (reply frames, time)
        self.deadlines: list[tuple[float, int]] = []
        self.outbox: dict[str, list[tuple[int, float, np.ndarray]]] = defaultdict(list)
        self.reconstructed: OrderedDict[int, np.ndarray] = OrderedDict()
        self.next_qid = 1
        self.counts: dict[str, int] = defaultdict(int)
        self.every(1.0, self._forget_answered)
        self.m_requests = self.metrics.counter("requests_total", "requests answered, by source", ["source"])
        self.m_latency = self.metrics.histogram("request_seconds", "frontend-observed latency", ["source"])
        self.m_pending = self.metrics.gauge("pending_queries", "queries admitted and not yet answered")

    # ------------------------------------------------------------------ clients

    def _on_clients(self, sock: zmq.Socket) -> None:
        for _ in range(2000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            start = time.perf_counter()
            envelope, body = protocol.split_envelope(frames)
            envelope = [f.bytes for f in envelope]
            try:
                msg = protocol.decode(body, self.cfg.max_payload_bytes)
            except protocol.ProtocolError as exc:
                self._error(Waiter(envelope, _request_id_of(body), start), ErrorCode.BAD_REQUEST, str(exc))
                continue
            if isinstance(msg, Predict):
                self._on_predict(msg, Waiter(envelope, msg.request_id, start))
            elif isinstance(msg, Status):
                transport.send(self.router, Status(service=self.name, info=self.status()), envelope)
            else:
                self._error(Waiter(envelope, "", start), ErrorCode.BAD_REQUEST, f"a client may not send {msg.KIND} messages")
        self._flush()

    def _on_predict(self, msg: Predict, waiter: Waiter) -> None:
        info = self.cfg.models.get(msg.model)
        if info is None:
            known = ", ".join(sorted(self.cfg.models)) or "none"
            return self._error(waiter, ErrorCode.UNKNOWN_MODEL, f"unknown model {msg.model!r}; this frontend serves: {known}")
        x = msg.input
        if protocol.DTYPE_NAMES.get(x.dtype) != info.input_dtype:
            return self._error(waiter, ErrorCode.BAD_REQUEST, f"model {msg.model} takes {info.input_dtype} input, got {x.dtype}")
        if list(x.shape) != info.input_shape:
            return self._error(waiter, ErrorCode.BAD_REQUEST, f"model {msg.model} takes input of shape {info.input_shape}, got {list(x.shape)}")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            return self._error(waiter, ErrorCode.BAD_REQUEST, "input contains NaN or infinity")
        if msg.version not in (None, info.version):
            return self._error(waiter, ErrorCode.UNKNOWN_MODEL, f"model {msg.model} serves version {info.version}, not {msg.version}")
        done = self.answered.get(msg.request_id)
        if done is not None:  # a retry of an answered request: the same answer again
            self.router.send_multipart(waiter.envelope + done[0], copy=False)
            self.counts["duplicate"] += 1
            return
        pending = self.by_request.get(msg.request_id)
        if pending is not None:  # a retry while it is still being computed
            pending.waiters.append(waiter)
            return
        key = None
        if self.cache is not None:
            key = b"%s\0%s\0%s" % (msg.model.encode(), info.version.encode(), x.tobytes())
            output = self.cache.get(key)
            if output is not None:
                return self._answer([waiter], Source.CACHE, msg.model, info.version, output)
            shared = self.by_key.get(key)
            if shared is not None:  # the same query is in flight: share its computation
                shared.waiters.append(waiter)
                self.by_request[msg.request_id] = shared
                return
        if len(self.pending) >= self.cfg.admission_limit:
            return self._error(waiter, ErrorCode.OVERLOADED, f"{len(self.pending)} queries pending; try again later")
        timeout_ms = msg.timeout_ms if msg.timeout_ms and msg.timeout_ms > 0 else info.deadline_ms
        deadline = time.time() + timeout_ms / 1000.0
        pending = Pending(self.next_qid, msg.model, info.version, deadline, key, [waiter])
        self.next_qid += 1
        self.pending[pending.qid] = pending
        self.by_request[msg.request_id] = pending
        if key is not None:
            self.by_key[key] = pending
        heapq.heappush(self.deadlines, (deadline, pending.qid))
        self.outbox[msg.model].append((pending.qid, deadline, x))

    def _flush(self) -> None:
        """One Queries message per model for everything admitted in this tick."""
        now = time.time()
        for model, items in self.outbox.items():
            if items:
                transport.send(
                    self.push,
                    Queries(model=model, qids=[q for q, _, _ in items], budgets_ms=[(d - now) * 1000.0 for _, d, _ in items],
                            reply_to=self.reply_to, inputs=np.stack([x for _, _, x in items])),
                )
                items.clear()
        self.m_pending.set(len(self.pending))

    # ------------------------------------------------------------------ predictions

    def _on_predictions(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock, limit=2000):
            if isinstance(msg, Predictions):
                self._on_outputs(msg)

    def _on_outputs(self, msg: Predictions) -> None:
        source = Source.RECONSTRUCTION if msg.source == Source.RECONSTRUCTION else Source.MODEL
        for i, qid in enumerate(msg.qids):
            pending = self.pending.pop(qid, None)
            if pending is None:
                self._late(qid, source, None if msg.outputs is None else msg.outputs[i])
                continue
            self._release(pending)
            if msg.error is not None or msg.outputs is None:
                self._error_all(pending, ErrorCode.MODEL_ERROR, f"model {msg.model} failed on this batch: {msg.error}")
                continue
            output = msg.outputs[i]
            if source == Source.RECONSTRUCTION:
                self.reconstructed[qid] = output
                if len(self.reconstructed) > 50_000:
                    self.reconstructed.popitem(last=False)
            elif self.cache is not None and pending.key is not None:
                self.cache.put(pending.key, output)
            self._answer(pending.waiters, source, pending.model, pending.version, output)

    def _late(self, qid: int, source: str, output: np.ndarray | None) -> None:
        """An answer for a query already answered: count it; grade an earlier reconstruction."""
        self.counts[f"late_{source}"] += 1
        if source == Source.MODEL and output is not None:
            rebuilt = self.reconstructed.pop(qid, None)
            if rebuilt is not None:
                self.counts["reconstructions_graded"] += 1
                self.counts["reconstructions_agree"] += int(np.argmax(rebuilt) == np.argmax(output))

    def _release(self, pending: Pending) -> None:
        for waiter in pending.waiters:
            self.by_request.pop(waiter.request_id, None)
        if pending.key is not None:
            self.by_key.pop(pending.key, None)

    # ------------------------------------------------------------------ answers

    def _answer(self, waiters: list[Waiter], source: str, model: str, version: str, output: np.ndarray | None,
                error: str | None = None, code: str | None = None) -> None:
        now = time.perf_counter()
        for waiter in waiters:
            reply = Reply(request_id=waiter.request_id, source=source, output=output, model=model, version=version,
                          error=error, error_code=code)
            frames = protocol.encode(reply)
            try:
                self.router.send_multipart(waiter.envelope + frames, copy=False)
            except zmq.ZMQError:  # the client is gone; its answer is still remembered below
                self.counts["client_gone"] += 1
            if waiter.request_id:
                self.answered[waiter.request_id] = (frames, time.monotonic())
            latency = now - waiter.start
            self.counts[str(source)] += 1
            self.m_requests.labels(source=source).inc()
            self.m_latency.labels(source=source).observe(latency)
            if self.cfg.log_requests:
                self.log.info("request", request_id=waiter.request_id, model=model, source=source,
                              latency_ms=round(latency * 1000, 3), error=code)

    def _error(self, waiter: Waiter, code: str, text: str) -> None:
        self._answer([waiter], Source.ERROR, "", "", None, text, code)

    def _error_all(self, pending: Pending, code: str, text: str) -> None:
        self._answer(pending.waiters, Source.ERROR, pending.model, pending.version, None, text, code)

    # ------------------------------------------------------------------ chores

    def tick(self, timeout: float | None = None) -> None:
        if timeout is None:
            timeout = self.next_timeout()
            if self.deadlines:
                timeout = min(timeout, max(0.0, self.deadlines[0][0] - time.time()))
        super().tick(timeout)
        self._expire(time.time())

    def _expire(self, now: float) -> None:
        """Clipper's SLO behaviour: at its deadline a query gets the model's default output."""
        while self.deadlines and self.deadlines[0][0] <= now:
            _, qid = heapq.heappop(self.deadlines)
            pending = self.pending.pop(qid, None)
            if pending is None:
                continue
            self._release(pending)
            info = self.cfg.models[pending.model]
            if info.default_output is not None:
                self._answer(pending.waiters, Source.DEFAULT, pending.model, pending.version,
                             np.asarray(info.default_output, np.float32))
            else:
                self._answer(pending.waiters, Source.DEFAULT, pending.model, pending.version, None,
                             "deadline passed before a prediction; no default output is configured", ErrorCode.DEADLINE)
        # Heap entries of answered queries are dropped lazily; keep the heap from growing.
        if len(self.deadlines) > 4 * len(self.pending) + 1024:
            self.deadlines = [(d, q) for d, q in self.deadlines if q in self.pending]
            heapq.heapify(self.deadlines)

    def _forget_answered(self, now: float) -> None:
        horizon = now - self.cfg.dedup_ttl_s
        while self.answered:
            _, (_, when) = next(iter(self.answered.items()))
            if when >= horizon and len(self.answered) <= DEDUP_ENTRIES:
                break
            self.answered.popitem(last=False)

    def drain(self) -> None:
        """On shutdown, every pending query still gets an answer that says why."""
        for pending in list(self.pending.values()):
            self._error_all(pending, ErrorCode.INTERNAL, "frontend shutting down")
        self.pending.clear()

    def status(self) -> dict:
        cache = None
        if self.cache is not None:
            cache = {"size": len(self.cache), "hits": self.cache.hits, "misses": self.cache.misses}
        return {"service": self.name, "role": self.role, "pending": len(self.pending), "answered": dict(self.counts),
                "cache": cache, "models": sorted(self.cfg.models)}


def _request_id_of(body: list) -> str:
    """Best-effort request id of a malformed message, so its error reaches the right call."""
    try:
        header = protocol.decode_header(body[0])
        rid = header.get("request_id", "")
        return rid if isinstance(rid, str) else ""
    except (protocol.ProtocolError, IndexError):
        return ""
