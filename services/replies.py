"""The frontend's answers (``services.frontend``): the one way a reply leaves, ``Replies.answer``.

A real answer is remembered for de-duplication (a retry of its request id gets the same
frames), counted and logged once per request and target (``requests_total`` and
``request_seconds`` per ``source``, ``target`` and ``kind``); an error answer (a ``code``)
is counted and logged, never remembered. A reply to a client never blocks: one that does
not fit its queue is dropped and counted (``reply_dropped``). A client that reads bundles
(``Predict.bundle``) gets the replies a batch of predictions answers for it in one message,
those that share source, model and version as columns (``protocol.Replies``); the answers
given while the frontend reads predictions are remembered once they have all left
(``answer(later=True)``, ``record``), before any client message is read.
"""
from __future__ import annotations

import time

import numpy as np

from keel.common import protocol, transport
from keel.common.metrics import MODEL_LABELS, model_labels
from keel.common.protocol import Reply
from keel.services.requests import Request, State

#: a bundle of replies to one client (``Predict.bundle``) is sent once it holds this many
#: replies or this many bytes of outputs, at the latest once the predictions read are answered
BUNDLE_REPLIES = protocol.MAX_BUNDLE
BUNDLE_BYTES = 1 << 20
#: a reply's output goes in a bundle's columns (``protocol.Replies``) only up to this size: a column
#: stays under BUNDLE_BYTES, far below the frame a client reads (larger ones go alone)
COLUMN_ROW_BYTES = BUNDLE_BYTES // BUNDLE_REPLIES


class Replies:
    """Parameters: ``router`` the clients' ROUTER; ``dedup`` the de-duplication table
    (``services.requests.DedupTable``); ``counts`` the frontend's counters; ``metrics`` its
    registry; ``models`` the served models (their metric labels); ``routes`` target name ->
    route (its ``kind``); ``log`` and ``log_requests`` (one line per request)."""

    def __init__(self, router, dedup, counts: dict, metrics, models: dict, routes: dict, log, log_requests: bool):
        self.router, self.dedup, self.counts, self.models, self.routes = router, dedup, counts, models, routes
        self.log, self.log_requests = log, log_requests
        self.unrecorded: list[tuple] = []  # answers sent and not yet remembered (``answer(later=True)``)
        #: client envelope -> [(Reply, its frames, its column key) of each reply bundled for it, their outputs' bytes]
        self.bundles: dict[tuple, list] = {}
        # per target: ``target`` its name ("" for a request refused before it named one), ``kind``
        # model, application or graph
        self.m_requests = metrics.counter("requests_total", "requests answered, by source and target",
                                          ["source", "target", "kind", *MODEL_LABELS])
        self.m_latency = metrics.histogram("request_seconds", "frontend-observed latency",
                                           ["source", "target", "kind", *MODEL_LABELS])
        self.meters: dict[tuple[str, str, str], tuple] = {}  # (source, target, kind) -> (counter, histogram)

    def answer(self, requests: list[Request], source: str, model: str, version: str | None, output: np.ndarray | None,
                error: str | None = None, code: str | None = None, models: list[str] | None = None,
                confidence: float | None = None, degraded: bool | None = None, trace: list[float] | None = None,
                later: bool = False, bundle: bool = False) -> None:
        """The one way a reply leaves: remembered for de-duplication (real answers only),
        counted and logged per target. ``trace``: a traced request's stamps, to which the
        reply's send is added. ``later``: the remembering, counting and logging wait for
        ``record``, so the replies of one batch of predictions all leave first; only for
        answers given while reading predictions, whose reader records them before it
        returns (before any client message is read: a retry always finds its answer).
        ``bundle``: one of several answers of a batch of predictions, sent with the others to
        a client that reads bundles (``_bundle``; a lone answer leaves at once)."""
        now = time.perf_counter()
        remember = code is None
        route = self.routes.get(model)
        kind = route.kind if route is not None else ""
        count, latencies = self._meters(source, model if kind else "", kind)
        outputs = None
        if type(output) is dict:  # a named model's outputs
            outputs, output = output, None
        for request in requests:
            reply = Reply(request_id=request.request_id, source=source, output=output, model=model, version=version,
                          error=error, error_code=code, models=models, confidence=confidence, degraded=degraded,
                          trace=None if trace is None else [*trace, time.time()], outputs=outputs)
            frames = protocol.encode(reply)
            request.to(State.ANSWERED)
            if bundle and request.bundle:
                self._bundle(request.envelope, reply, frames, request.columns)
            else:
                self.send(request.envelope, frames)
            answer = (request, frames, now - request.start, remember, count, latencies, model, kind, source, code, degraded)
            if later:
                self.unrecorded.append(answer)
            else:
                self._remember(*answer)

    def record(self) -> None:
        """The answers ``answer(later=True)`` sent: remembered, counted and logged now."""
        for answer in self.unrecorded:
            self._remember(*answer)
        self.unrecorded.clear()

    def _remember(self, request: Request, frames: list, latency: float, remember: bool, count, latencies, model: str,
                  kind: str, source: str, code: str | None, degraded: bool | None) -> None:
        if remember and request.dedup is not None:
            # copied into the table's segments: orjson's header keeps the ~4 KB buffer it
            # was written in (a 150-byte header held 4.1 KB), so it is never kept itself
            self.dedup.put(request.dedup, frames, request.digest, time.monotonic())
        self.counts[str(source)] += 1
        count.inc()
        latencies.observe(latency)
        if self.log_requests:
            self.log.info("request", request_id=request.request_id, model=model, kind=kind, source=source,
                          latency_ms=round(latency * 1000, 3), error=code, **({"degraded": True} if degraded else {}))

    def _meters(self, source: str, target: str, kind: str) -> tuple:
        """The request counter and latency histogram of (source, target, kind), made once
        each: ``labels()`` takes a lock and builds its key on every call, and this is the
        path of every reply. Bounded: targets are the served names, or "" for the rest."""
        meters = self.meters.get((source, target, kind))
        if meters is None:
            served = model_labels(self.models, target)
            meters = self.meters[(source, target, kind)] = (
                self.m_requests.labels(source=source, target=target, kind=kind, **served),
                self.m_latency.labels(source=source, target=target, kind=kind, **served))
        return meters

    def send(self, envelope: list, frames: list, replies: int = 1) -> None:
        """A reply (or a bundle of ``replies``) to a client, never blocking: one that does not
        fit its queue is dropped."""
        failed = transport.try_send_frames(self.router, [*envelope, *frames])
        if failed is not None:
            self.counts["reply_dropped" if failed == transport.FULL else "client_gone"] += replies

    def _bundle(self, envelope: list, reply: Reply, frames: list, columns: bool) -> None:
        """A reply for a client that reads bundles (``columns``: and columns): kept with its
        others from this batch of predictions, sent as one message by ``send_bundles`` (or
        now, once the bundle is full)."""
        bundle = self.bundles.get(key := tuple(envelope))
        if bundle is None:
            bundle = self.bundles[key] = [[], 0]
        bundle[0].append((reply, frames, column_key(reply) if columns else None))
        bundle[1] += 0 if reply.output is None else reply.output.nbytes
        if len(bundle[0]) >= BUNDLE_REPLIES or bundle[1] >= BUNDLE_BYTES:
            del self.bundles[key]
            self.send(envelope, protocol.encode_bundle(bundle[0], BUNDLE_BYTES), len(bundle[0]))

    def send_bundles(self) -> None:
        for envelope, (entries, _) in self.bundles.items():
            self.send(list(envelope), protocol.encode_bundle(entries, BUNDLE_BYTES), len(entries))
        self.bundles.clear()


def column_key(reply: Reply) -> tuple | None:
    """``protocol.column_key`` of a reply whose output is at most ``COLUMN_ROW_BYTES`` (so a
    column, ``BUNDLE_REPLIES`` rows at most, stays within ``BUNDLE_BYTES``); None for others."""
    out = reply.output
    return protocol.column_key(reply) if out is not None and out.nbytes <= COLUMN_ROW_BYTES else None
