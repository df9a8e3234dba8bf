"""Frontend: the clients' ROUTER; answers every accepted request exactly once.

Per request (Clipper §4): validate the query against the model's declared input (a bad
one is answered ``bad_request``); de-duplicate by (sender, request id) -- a retried id is
computed once and answered the same, the same id with another input is refused; look it
up in the CLOCK prediction cache; attach it to an identical query already in flight (one
computation, many waiters); admit it only while fewer than ``admission_limit`` queries are
pending (else ``overloaded``); hand its model queries to the dispatcher. The first of
{prediction, reconstruction} answers; if the deadline (monotonic clock) passes first the
model's default output answers, marked ``default``. Every reply names its source. Late
predictions are counted, and checked against earlier reconstructions. An output with NaN
or infinity (from a worker or a reconstruction: inputs are finite, checked at admission)
is a ``model_error`` for its query, counted (``nonfinite_outputs``), logged once per model
and never cached.

Routes: what a request is sent to is chosen by its target (``Predict.model``): a model
(this module: cache, dispatcher, reconstructions, dispatcher failover), an application
(``services.selection.runtime``), a HAMS service graph (``services.graph.route``: origins
of this incarnation, the hold until durable). Admission, validation, de-duplication, the
request lifecycle, metrics (per ``target`` and ``kind``) and the one log line per request
are the frontend's for all three. ``Predict.key`` is the one per-call key: an
application's context, a graph's stream (``route.stream_of``); a plain model refuses one.
A name that is none of these is ``unknown_model``, the reply listing what is served.

Model selection (Clipper §5, ``services.selection.runtime``): a request may name an
application instead of a model (with a ``key``); its policy picks the models to query
(in the context's state), their outputs are combined when all arrived, or at the deadline
with those that did (stragglers count as disagreeing, the reply says ``partial``), and the
reply names the models used and the confidence. A ``Feedback`` message with the true class
updates the context's state from the outputs kept in the feedback log.

A request's states are in ``services.requests``; de-duplication is by (``Predict.client``
when the client sends it, else the connection, request id). Query ids come from this
incarnation's ``IdSpace``: a prediction for a query of an earlier incarnation (the
frontend restarted on the same endpoint) is counted ``stale`` and dropped, never matched
to a new query. A query answered by a
reconstruction is reported to the dispatcher (``Answered``) so it is not run again.

Clients are outside Keel's control, so a reply to one never blocks: the client ROUTER
has a per-client queue of ``client_hwm`` replies, a reply that does not fit is dropped and
counted (``reply_dropped``); a client that reads bundles (``Predict.bundle``) gets the replies
a batch of several predictions answers for it in one message (``_bundle``; those that share
source, model and version as columns, one ``Replies``); a client may
send several requests in one message (``Client.cork``; those to one model as columns, one
``Predicts``), each admitted and answered on its own (a malformed one refuses the message,
answered under its first request id); and a frame above ``max_payload_bytes`` (or
``MAX_COLUMN_BYTES``, 64 KiB, if that is more: a ``Predicts`` carries up to that, each row
still bounded by ``max_payload_bytes``) plus a header is refused before it is read (the
sender is disconnected). At most ``max_clients``
connections are kept (past it, the one that sent least recently is hung up, counted
``clients_hung_up``): with
``client_hwm`` and the de-duplication table's limits, that bounds the process's memory,
and what closed connections and expired entries held is handed back to the system
(``base.release_memory``). A client may send ``Predict``,
``Feedback`` and ``Status`` requests; any other kind is answered ``bad_request`` and
counted (``refused_kind``). ``Configure(model, version)`` -- a finished rollout -- is an
operator's, and comes on the prediction endpoint, Keel's side of the frontend.
"""
from __future__ import annotations

import socket
import time
import zlib
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import numpy as np
import zmq

from keel.common import protocol, tracing, transport
from keel.common.config import FrontendConfig
from keel.common.ids import SEQ_BITS, IdSpace
from keel.common.metrics import MODEL_LABELS, model_labels
from keel.common.protocol import (
    Answered, Configure, ErrorCode, Feedback, Predict, Predictions, Predicts, Queries, Reply, Source, Status,
)
from keel.services.base import Service, release_memory
from keel.services.cache import ClockCache
from keel.services.graph.route import GraphRoute
from keel.services.requests import Deadlines, DedupTable, Request, State, carry_trace, stack_rows
from keel.services.selection.runtime import Applications, Call

#: reconstructed outputs kept to grade against their late predictions, at most
GRADED = 50_000
#: a bundle of replies to one client (``Predict.bundle``) is sent once it holds this many
#: replies or this many bytes of outputs, at the latest once the predictions read are answered
BUNDLE_REPLIES = protocol.MAX_BUNDLE
BUNDLE_BYTES = 1 << 20
#: a reply's output goes in a bundle's columns (``Replies``) only up to this size: a column
#: stays under BUNDLE_BYTES, far below the frame a client reads (larger ones go alone)
COLUMN_ROW_BYTES = BUNDLE_BYTES // BUNDLE_REPLIES
#: freed memory is handed back to the system once the de-duplication table has shrunk by
#: this many bytes (half its limit if that is less: a table of a few MB that emptied must
#: count), or this many client connections have closed, since it last was
TRIM_STEP = 8 << 20
TRIM_CLIENTS = 64


@dataclass(slots=True)
class Pending:
    """One computation: the model queries a request made (one, or an application's
    selection), shared by its retries and by identical requests that arrived while it was
    in flight."""

    qids: tuple[int, ...]  # one per selected model
    models: tuple[str, ...]
    model: str  # the model (or application) the requests asked for
    version: str | None
    deadline: float  # monotonic
    key: bytes | None  # cache key
    requests: list[Request]
    #: the query's input, kept (with a manager) to re-send it to a newly active dispatcher
    input: np.ndarray | None = None
    call: Call | None = None  # an application's call (model selection)


class Frontend(Service):
    role = "frontend"

    def __init__(self, cfg: FrontendConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.apps = Applications(cfg, self.metrics) if cfg.applications else None
        #: what one client message's tensors may hold: a query's input up to max_payload_bytes,
        #: a columns' (``Predicts``) up to MAX_COLUMN_BYTES, each of its rows still bounded by
        #: max_payload_bytes at admission (``_on_predict``)
        self.max_read = max(cfg.max_payload_bytes, protocol.MAX_COLUMN_BYTES)
        self.router = self.add_socket(transport.make_socket(
            self.ctx, zmq.ROUTER, bind=cfg.client_endpoint, hwm=cfg.client_hwm,
            max_frame_bytes=self.max_read + protocol.MAX_HEADER_BYTES), self._on_clients)
        if cfg.local_client_endpoint:
            self.router.bind(cfg.local_client_endpoint)
        #: client connections open, by descriptor, the one that sent least recently first
        self.clients: OrderedDict[int, None] = OrderedDict()
        self.add_socket(self.router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED), self._on_connections)
        self.pull = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=cfg.prediction_endpoint), self._on_predictions)
        # a frontend of graphs only has no dispatcher to send to
        self.push = self.add_socket(transport.make_socket(self.ctx, zmq.PUSH,
                                                          connect=cfg.dispatcher_query_endpoint if cfg.models else None))
        self.reply_to = transport.endpoint_of(self.pull)
        self.ids = IdSpace()
        self.cache = ClockCache(cfg.cache_size) if cfg.cache_size else None
        #: model -> the version its workers serve: what cache keys and replies say before a
        #: query's own prediction names its version. Until a rollout's ``Configure`` names it,
        #: the version the workers answered with last; after, only the next rollout moves it
        #: (a prediction of the old version still in flight must not move it back)
        self.serving: dict[str, str] = {}
        self.configured: set[str] = set()
        self.pending: dict[int, Pending] = {}  # qid -> its computation
        self.by_request: dict[tuple, tuple[Pending, int]] = {}  # (sender, request id) -> (computation, input digest)
        self.by_key: dict[bytes, Pending] = {}
        self.dedup = DedupTable(cfg.dedup_ttl_s, cfg.dedup_max_entries, cfg.dedup_max_bytes)
        self.deadlines = Deadlines()
        self.deadline = self.timer(self._expire)
        self.outbox: dict[str, list[tuple[int, float, np.ndarray]]] = defaultdict(list)
        self.unrecorded: list[tuple] = []  # answers sent and not yet remembered (``_answer(later=True)``)
        #: client envelope -> [(Reply, its frames, its column key) of each reply bundled for it, their outputs' bytes]
        self.bundles: dict[tuple, list] = {}
        #: qid -> the stamps of a traced request (``Predict.trace``) until its Queries leaves:
        #: only traced requests are kept here, so the untraced path pays one emptiness test a flush
        self.traces: dict[int, list[float]] = {}
        self.reconstructed_by: dict[str, list[int]] = defaultdict(list)  # model -> qids, for Answered
        self.reconstructed: dict[int, np.ndarray] = {}  # qid -> output, oldest first
        self.counts: dict[str, int] = defaultdict(int)
        self.nonfinite_models: set[str] = set()  # logged once each
        self.trim_mark, self.closed_clients = 0, 0  # since memory was last handed back
        self.memory_released = 0  # times freed memory was handed back to the system
        self.every(1.0, self._forget_answered)
        # per target: ``target`` its name ("" for a request refused before it named one), ``kind``
        # model, application or graph
        self.m_requests = self.metrics.counter("requests_total", "requests answered, by source and target",
                                               ["source", "target", "kind", *MODEL_LABELS])
        self.m_latency = self.metrics.histogram("request_seconds", "frontend-observed latency",
                                                ["source", "target", "kind", *MODEL_LABELS])
        self.meters: dict[tuple[str, str, str], tuple] = {}  # (source, target, kind) -> (counter, histogram)
        self.m_pending = self.metrics.gauge("pending_queries", "queries admitted and not yet answered")
        self.m_refused = self.metrics.counter("client_messages_refused_total",
                                              "messages of a kind clients may not send, refused", ["kind"])
        #: HAMS service graphs: a route each, answering through ``_answer`` like every target
        self.graphs = {name: GraphRoute(name, route, self, self._answer_graph, cfg.admission_limit)
                       for name, route in cfg.graphs.items()}
        self.dispatcher_name = None
        self.fence: int | None = None  # with a manager: the dispatcher epoch stamped on Queries
        if self.link_manager(cfg.manager, on_change=self._on_manager_change):
            self._on_manager_change("group/dispatcher", None)
            for key, value in list(self.manager.feed.values.items()):
                if key.startswith("group/graph/"):
                    self._on_manager_change(key, value)

    # ------------------------------------------------------------------ clients

    def _on_clients(self, sock: zmq.Socket) -> None:
        for frames in transport.drain(sock, 2000):
            start = time.perf_counter()
            fd = frames[-1].get(zmq.SRCFD)
            if fd in self.clients:
                self.clients.move_to_end(fd)
            envelope, body = protocol.split_envelope(frames)
            envelope = [f.bytes for f in envelope]
            try:  # one request, or several a client sent together (``Client.cork``), some as columns
                msgs = protocol.decode_all(body, self.max_read)
            except protocol.ProtocolError as exc:
                self._refuse(Request(envelope, _request_id_of(body), start), ErrorCode.BAD_REQUEST, str(exc))
                continue
            for msg in msgs:
                if isinstance(msg, Predict):
                    self._on_predict(msg, envelope, start)
                elif isinstance(msg, Predicts):  # columns: each row its own request
                    for row in msg.predicts():
                        self._on_predict(row, envelope, start)
                elif isinstance(msg, Feedback) and msg.ok is None:
                    self._on_feedback(msg, envelope)
                elif isinstance(msg, Status) and msg.info is None:
                    self._send(envelope, protocol.encode(Status(service=self.name, info=self.status())))
                else:  # a control message (Configure), or an answer kind: not a client's to send
                    self.counts["refused_kind"] += 1
                    self.m_refused.labels(kind=msg.KIND).inc()
                    self._refuse(Request(envelope, "", start), ErrorCode.BAD_REQUEST,
                                 f"a client may not send {msg.KIND} messages")
        self._flush()

    def _on_connections(self, sock: zmq.Socket) -> None:
        """Keep the client connections; past ``max_clients``, hang up the one idle longest."""
        from zmq.utils.monitor import recv_monitor_message

        for _ in range(10_000):
            try:
                event = recv_monitor_message(sock, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.clients[fd] = None
                if len(self.clients) > self.cfg.max_clients:
                    # the connection idle longest goes (a live client's DEALER reconnects)
                    # rather than the newest: idle ones must not lock clients out
                    self.counts["clients_hung_up"] += 1
                    _hang_up(self.clients.popitem(last=False)[0])
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.clients.pop(fd, None)
                self.closed_clients += 1

    def _on_predict(self, msg: Predict, envelope: list, start: float) -> None:
        rid = msg.request_id
        # de-duplication: the client's own id when it sends one (the same on every
        # connection and frontend), else the connection it came on
        dkey = (msg.client.encode() if msg.client else envelope[0], rid)
        request = Request(envelope, rid, start, dkey, bundle=msg.bundle is True, columns=msg.columns is True)
        if msg.input.nbytes > self.cfg.max_payload_bytes:
            return self._refuse(request, ErrorCode.BAD_REQUEST, f"payload of {msg.input.nbytes} bytes exceeds the limit of "
                                                                f"{self.cfg.max_payload_bytes} (max_payload_bytes)")
        kind = self._kind(msg.model)
        if kind is None:
            known = ", ".join(sorted(self.targets())) or "none"
            return self._refuse(request, ErrorCode.UNKNOWN_MODEL, f"unknown model {msg.model!r}; this frontend serves: {known}")
        info = (self.cfg.models[msg.model] if kind == "model" else self.apps.infos[msg.model] if kind == "application"
                else self.graphs[msg.model].info)
        key = msg.key
        x = msg.input
        if protocol.DTYPE_NAMES.get(x.dtype) != info.input_dtype:
            return self._refuse(request, ErrorCode.BAD_REQUEST, f"{kind} {msg.model} takes {info.input_dtype} input, got {x.dtype}")
        if list(x.shape) != info.input_shape:
            return self._refuse(request, ErrorCode.BAD_REQUEST, f"{kind} {msg.model} takes input of shape {info.input_shape}, got {list(x.shape)}")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            return self._refuse(request, ErrorCode.BAD_REQUEST, "input contains NaN or infinity")
        if kind != "model" and msg.version is not None:
            return self._refuse(request, ErrorCode.BAD_REQUEST, f"{msg.model} is an {kind}: it has no versions"
                                if kind == "application" else f"{msg.model} is a graph: it has no versions")
        if kind == "model" and key is not None:
            return self._refuse(request, ErrorCode.BAD_REQUEST, f"model {msg.model} takes no key (applications and graphs do)")
        if msg.version is not None and kind == "model":
            served = self.serving.get(msg.model, info.version)  # after a rollout, the rollout's version
            if msg.version != served:
                return self._refuse(request, ErrorCode.UNKNOWN_MODEL, f"model {msg.model} serves version {served}, not {msg.version}")
        # A cheap fingerprint of what was asked: a reused id is only a retry if it matches.
        request.digest = digest = zlib.crc32(x, zlib.crc32(f"{msg.model}\0{key or ''}".encode()))
        done = self.dedup.get(dkey)
        if done is not None:  # a retry of an answered request: the same answer again
            if done[1] != digest:
                return self._refuse(request, ErrorCode.BAD_REQUEST, "request id reused with a different input")
            self.counts["duplicate"] += 1
            request.to(State.ANSWERED)
            self._send(envelope, done[0])
            return
        waiting = self.by_request.get(dkey)
        if waiting is not None:  # a retry while it is still being computed: it joins, in their state
            if waiting[1] != digest:
                return self._refuse(request, ErrorCode.BAD_REQUEST, "request id reused with a different input")
            request.to(waiting[0].requests[0].state)
            waiting[0].requests.append(request)
            return
        if kind == "graph":
            client = msg.client if msg.client else envelope[0].hex()
            call = self.graphs[msg.model].admit(request, x, key, protocol.request_key(client, rid))
            if call is None:
                return self._refuse(request, ErrorCode.OVERLOADED, f"graph {msg.model} is full; try again later")
            self.by_request[dkey] = (call, digest)
            return
        cache_key = None
        version = self.serving.get(msg.model, info.version) if kind == "model" else None
        if self.cache is not None and kind == "model":  # an application's answer depends on its learned state
            cache_key = b"%s\0%s\0%s" % (msg.model.encode(), version.encode(), x.tobytes())
            output = self.cache.get(cache_key)
            if output is not None:
                return self._answer([request], Source.CACHE, msg.model, version, output)
            shared = self.by_key.get(cache_key)
            if shared is not None:  # the same query is in flight: share its computation
                request.to(State.WAITING)
                shared.requests.append(request)
                self.by_request[dkey] = (shared, digest)
                return
        if len(self.pending) >= self.cfg.admission_limit:
            return self._refuse(request, ErrorCode.OVERLOADED, f"{len(self.pending)} queries pending; try again later")
        timeout_ms = msg.timeout_ms if msg.timeout_ms and msg.timeout_ms > 0 else info.deadline_ms
        call = None
        if kind == "application":
            budget = self.apps.apps[msg.model].deadline_ms  # stragglers (§5.2.2): answer with what arrived by then
            if budget is not None:
                timeout_ms = min(timeout_ms, budget) if msg.timeout_ms else budget
            models, call = self.apps.select(msg.model, key or "", x)
        else:
            models = (msg.model,)
        deadline = time.monotonic() + timeout_ms / 1000.0
        qids = tuple(self.ids.next() for _ in models)
        pending = Pending(qids, models, msg.model, version, deadline, cache_key, [request], call=call)
        if self.manager is not None:
            pending.input = x
        request.to(State.WAITING)
        for qid, model in zip(qids, models):
            self.pending[qid] = pending
            self.outbox[model].append((qid, deadline, x))
            self.deadlines.push(deadline, qid)
        self.by_request[dkey] = (pending, digest)
        if cache_key is not None:
            self.by_key[cache_key] = pending
        self.deadline.at_latest(deadline)
        if tracing.ON and kind == "model":  # OpenTelemetry: sampled, it rides the stamps' path
            tracing.admit(self.name, qids[0], msg, self.traces, time.time() - (time.perf_counter() - start))
        if msg.trace is not None and kind == "model":  # receipt, on the wall clock the stamps share
            self.traces[qids[0]] = [*msg.trace, time.time() - (time.perf_counter() - start)]

    def _kind(self, name: str) -> str | None:
        """What ``name`` is to this frontend: "model", "application", "graph", or None."""
        if name in self.cfg.models:
            return "model"
        if self.apps is not None and name in self.apps:
            return "application"
        return "graph" if name in self.graphs else None

    def _flush(self) -> None:
        """One Queries message per model for everything admitted in this tick, and one
        Answered per model for the queries reconstructions answered."""
        now = time.monotonic()
        for model, items in self.outbox.items():
            if items:
                msg = Queries(model=model, qids=[q for q, _, _ in items], budgets_ms=[(d - now) * 1000.0 for _, d, _ in items],
                              reply_to=self.reply_to, inputs=stack_rows([x for _, _, x in items]), fence=self.fence,
                              sent_at=time.time())
                if self.traces:
                    carry_trace(self.traces, msg)
                    if tracing.ON and msg.traced is not None:
                        msg.traceparent = tracing.context_of(self.name, msg.traced)
                transport.send(self.push, msg)
                items.clear()
        for model, qids in self.reconstructed_by.items():
            if qids:
                transport.send(self.push, Answered(model=model, qids=list(qids)))
                qids.clear()
        self.m_pending.set(len(self.pending))

    # ------------------------------------------------------------------ dispatcher failover

    def _on_manager_change(self, key: str, value: dict | None) -> None:
        """The manager named another active dispatcher: send it every query admitted and not
        yet answered (the old one's queue died with it), so none waits for its deadline.
        Query ids stay the same: whichever prediction comes first answers, later ones are
        counted late (de-duplication by qid; ids carry this frontend's incarnation). A graph
        operator's group goes to the graph routes (where each sends)."""
        if self.manager is None:
            return
        if key.startswith("group/graph/"):
            for route in self.graphs.values():
                route.on_manager_change(key, value)
            return
        if key != "group/dispatcher":
            return
        holder, epoch, endpoints = self.manager.holder("dispatcher")
        endpoint = endpoints.get("query")
        if holder:
            self.fence = max(self.fence or 0, epoch)
        if not holder or not endpoint or holder == self.dispatcher_name:
            return
        first = self.dispatcher_name is None
        self.dispatcher_name = holder
        self.remove_socket(self.push)
        self.push = self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=endpoint))
        resent = 0
        for pending in {id(p): p for p in self.pending.values()}.values():
            if pending.input is None:
                continue
            for qid, model in zip(pending.qids, pending.models):
                if qid in self.pending:
                    self.outbox[model].append((qid, pending.deadline, pending.input))
                    resent += 1
        self.counts["resent"] += resent
        self.log.warning("dispatcher changed", dispatcher=holder, epoch=epoch, resent=resent, first=first)
        self._flush()

    # ------------------------------------------------------------------ predictions

    def _on_predictions(self, sock: zmq.Socket) -> None:
        try:
            for _, msg in self.messages(sock, limit=2000):
                if isinstance(msg, Predictions):
                    self._on_outputs(msg)
                elif isinstance(msg, Configure) and msg.model in self.cfg.models and msg.version is not None:
                    # a finished rollout (keel model rollout), on Keel's side of the frontend
                    # (never the clients' port): cache keys and replies name this version now
                    self.serving[msg.model] = msg.version
                    self.configured.add(msg.model)
                    self.counts["configured"] += 1
        finally:  # before any client message is read, even after a failure here
            self._send_bundles()
            self._record()
        self._flush()

    def _on_outputs(self, msg: Predictions) -> None:
        source = Source.RECONSTRUCTION if msg.source == Source.RECONSTRUCTION else Source.MODEL
        outputs, error = msg.outputs, msg.error
        info = self.cfg.models.get(msg.model)
        if outputs is not None:
            if info is None or outputs.size != len(msg.qids) * info.output_size:
                want = "" if info is None else f", not {info.output_size} values per query"
                error, outputs = f"outputs of shape {list(outputs.shape)}{want}", None
            elif outputs.ndim != 2:
                outputs = outputs.reshape(len(msg.qids), info.output_size)
        elif error is None:
            error = "no outputs"
        bad = None  # rows whose output is NaN or infinite: a model error, never an answer
        if outputs is not None and outputs.dtype.kind == "f":
            finite = np.isfinite(outputs).all(axis=1)
            if not finite.all():
                bad = ~finite
                self._nonfinite(msg, int(bad.sum()))
        if msg.version is not None and source == Source.MODEL and info is not None and msg.model not in self.configured:
            self.serving[msg.model] = msg.version
        epoch = self.ids.epoch
        for i, qid in enumerate(msg.qids):
            if qid >> SEQ_BITS != epoch:  # a query of an earlier incarnation of this frontend
                self.counts["stale"] += 1
                continue
            failed = outputs is None or (bad is not None and bad[i])
            pending = self.pending.get(qid)
            if pending is None:
                self._late(qid, source, None if failed else outputs[i])
                continue
            model = pending.models[0] if len(pending.qids) == 1 else pending.models[pending.qids.index(qid)]
            if model != msg.model:  # not this query's model: not its answer
                self.counts["mismatched"] += 1
                continue
            del self.pending[qid]
            if pending.call is not None:
                self._on_app_output(pending, model, None if failed else outputs[i], source)
                continue
            self._settle(pending)
            if failed:
                why = f"failed on this batch: {error}" if outputs is None else "output NaN or infinity for this input"
                self._answer(pending.requests, Source.ERROR, pending.model, pending.version, None,
                             f"model {msg.model} {why}", ErrorCode.MODEL_ERROR)
                continue
            output = outputs[i]
            if source == Source.RECONSTRUCTION:
                self.reconstructed_by[model].append(qid)
                self.reconstructed[qid] = output
                if len(self.reconstructed) > GRADED:
                    del self.reconstructed[next(iter(self.reconstructed))]
            version = pending.version if msg.version is None else msg.version
            # the key names the version expected at admission: another version's output is not cached under it
            if source == Source.MODEL and self.cache is not None and pending.key is not None and version == pending.version:
                self.cache.put(pending.key, output)
            trace = [*msg.trace, time.time()] if msg.trace is not None and msg.traced == qid else None
            if tracing.ON:  # a sampled request's span ends with its answer, a reconstruction's too
                tracing.answered(self.name, qid, source, version)
            self._answer(pending.requests, source, pending.model, version, output, trace=trace, later=True,
                         bundle=len(msg.qids) > 1)

    def _nonfinite(self, msg: Predictions, rows: int) -> None:
        """A model answered NaN or infinity for a finite input (the input was checked at
        admission): counted, and logged once per model so a broken model does not flood
        the log."""
        self.counts["nonfinite_outputs"] += rows
        if msg.model not in self.nonfinite_models:
            self.nonfinite_models.add(msg.model)
            self.log.error("model output NaN or infinity; answered model_error, not cached", model=msg.model,
                           worker=msg.worker, source=str(msg.source), rows=rows)

    def _on_app_output(self, pending: Pending, model: str, output: np.ndarray | None, source: str) -> None:
        """One selected model's output (None: its batch failed) for an application's call:
        the call is answered once every selected model has answered or failed."""
        if output is not None:
            pending.call.outputs[model] = output
            if source == Source.RECONSTRUCTION:
                self.reconstructed_by[model].append(pending.qids[pending.models.index(model)])
        if not self._open(pending):
            self._settle(pending)
            self._answer_app(pending)

    def _answer_app(self, pending: Pending) -> None:
        """Combine what arrived (at the deadline: stragglers count as disagreeing); with
        nothing, the default output or an error."""
        call = pending.call
        answer = self.apps.combine(call, call.outputs)
        if answer is None:
            default = self.apps.default_output(call.app)
            if default is not None:
                self._answer(pending.requests, Source.DEFAULT, call.app, None, default)
            elif time.monotonic() >= pending.deadline:
                self._answer(pending.requests, Source.DEFAULT, call.app, None, None,
                             "deadline passed before any of the application's models answered; no default output",
                             ErrorCode.DEADLINE)
            else:
                self._answer(pending.requests, Source.ERROR, call.app, None, None,
                             f"every model application {call.app} queried failed: {', '.join(call.models)}",
                             ErrorCode.MODEL_ERROR)
            return
        self._answer(pending.requests, answer.source, call.app, None, answer.output,
                     models=answer.models, confidence=answer.confidence)
        for rid in {r.request_id for r in pending.requests}:
            self.apps.remember(rid, call)

    def _on_feedback(self, msg: Feedback, envelope: list) -> None:
        if self.apps is None:
            error, code = "this frontend serves no applications: feedback has nothing to teach", ErrorCode.UNKNOWN_REQUEST
        else:
            error, code = self.apps.feedback(msg.request_id, msg.label)
        self.counts["feedback" if error is None else "feedback_refused"] += 1
        self._send(envelope, protocol.encode(Feedback(request_id=msg.request_id, label=msg.label, ok=error is None,
                                                      error=error, error_code=code)))

    def _open(self, pending: Pending) -> bool:
        """Whether any of a fanned-out computation's queries is still in flight."""
        return any(q in self.pending for q in pending.qids)

    def _late(self, qid: int, source: str, output: np.ndarray | None) -> None:
        """An answer for a query already answered: count it; grade an earlier reconstruction."""
        self.counts[f"late_{source}"] += 1
        if source == Source.MODEL and output is not None:
            rebuilt = self.reconstructed.pop(qid, None)
            if rebuilt is not None:
                self.counts["reconstructions_graded"] += 1
                self.counts["reconstructions_agree"] += int(np.argmax(rebuilt) == np.argmax(output))

    def _settle(self, pending: Pending) -> None:
        """A computation is decided: forget how requests found it, and its other queries."""
        for request in pending.requests:
            self.by_request.pop(request.dedup, None)
        if pending.key is not None:
            self.by_key.pop(pending.key, None)
        if pending.call is not None:
            for qid in pending.qids:
                self.pending.pop(qid, None)

    # ------------------------------------------------------------------ answers

    def _answer(self, requests: list[Request], source: str, model: str, version: str | None, output: np.ndarray | None,
                error: str | None = None, code: str | None = None, models: list[str] | None = None,
                confidence: float | None = None, degraded: bool | None = None, trace: list[float] | None = None,
                later: bool = False, bundle: bool = False) -> None:
        """The one way a reply leaves: remembered for de-duplication (real answers only),
        counted and logged per target. ``trace``: a traced request's stamps, to which the
        reply's send is added. ``later``: the remembering, counting and logging wait for
        ``_record``, so the replies of one batch of predictions all leave first; only for
        answers given while reading predictions, whose reader records them before it
        returns (before any client message is read: a retry always finds its answer).
        ``bundle``: one of several answers of a batch of predictions, sent with the others to
        a client that reads bundles (``_bundle``; a lone answer leaves at once)."""
        now = time.perf_counter()
        remember = code is None
        kind = self._kind(model) or ""
        count, latencies = self._meters(source, model if kind else "", kind)
        for request in requests:
            reply = Reply(request_id=request.request_id, source=source, output=output, model=model, version=version,
                          error=error, error_code=code, models=models, confidence=confidence, degraded=degraded,
                          trace=None if trace is None else [*trace, time.time()])
            frames = protocol.encode(reply)
            request.to(State.ANSWERED)
            if bundle and request.bundle:
                self._bundle(request.envelope, reply, frames, request.columns)
            else:
                self._send(request.envelope, frames)
            answer = (request, frames, now - request.start, remember, count, latencies, model, kind, source, code, degraded)
            if later:
                self.unrecorded.append(answer)
            else:
                self._remember(*answer)

    def _record(self) -> None:
        """The answers ``_answer(later=True)`` sent: remembered, counted and logged now."""
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
        if self.cfg.log_requests:
            self.log.info("request", request_id=request.request_id, model=model, kind=kind, source=source,
                          latency_ms=round(latency * 1000, 3), error=code, **({"degraded": True} if degraded else {}))

    def _meters(self, source: str, target: str, kind: str) -> tuple:
        """The request counter and latency histogram of (source, target, kind), made once
        each: ``labels()`` takes a lock and builds its key on every call, and this is the
        path of every reply. Bounded: targets are the served names, or "" for the rest."""
        meters = self.meters.get((source, target, kind))
        if meters is None:
            served = model_labels(self.cfg.models, target)
            meters = self.meters[(source, target, kind)] = (
                self.m_requests.labels(source=source, target=target, kind=kind, **served),
                self.m_latency.labels(source=source, target=target, kind=kind, **served))
        return meters

    def _answer_graph(self, requests: list[Request], source: str, graph: str, output: np.ndarray | None,
                      error: str | None, code: str | None, degraded: bool | None) -> None:
        """A graph route's answer (it left the hold: durable): its requests are no longer in flight."""
        for request in requests:
            self.by_request.pop(request.dedup, None)
        self._answer(requests, source, graph, None, output, error, code, degraded=degraded)

    def _send(self, envelope: list, frames: list, replies: int = 1) -> None:
        """A reply (or a bundle of ``replies``) to a client, never blocking: one that does not
        fit its queue is dropped."""
        failed = transport.try_send_frames(self.router, [*envelope, *frames])
        if failed is not None:
            self.counts["reply_dropped" if failed == transport.FULL else "client_gone"] += replies

    def _bundle(self, envelope: list, reply: Reply, frames: list, columns: bool) -> None:
        """A reply for a client that reads bundles (``columns``: and columns): kept with its
        others from this batch of predictions, sent as one message by ``_send_bundles`` (or
        now, once the bundle is full)."""
        bundle = self.bundles.get(key := tuple(envelope))
        if bundle is None:
            bundle = self.bundles[key] = [[], 0]
        bundle[0].append((reply, frames, _column_key(reply) if columns else None))
        bundle[1] += 0 if reply.output is None else reply.output.nbytes
        if len(bundle[0]) >= BUNDLE_REPLIES or bundle[1] >= BUNDLE_BYTES:
            del self.bundles[key]
            self._send(envelope, protocol.encode_bundle(bundle[0], BUNDLE_BYTES), len(bundle[0]))

    def _send_bundles(self) -> None:
        for envelope, (entries, _) in self.bundles.items():
            self._send(list(envelope), protocol.encode_bundle(entries, BUNDLE_BYTES), len(entries))
        self.bundles.clear()

    def _refuse(self, request: Request, code: str, text: str) -> None:
        self._answer([request], Source.ERROR, "", "", None, text, code)

    # ------------------------------------------------------------------ chores

    def _expire(self, now: float) -> None:
        """Clipper's SLO behaviour: at its deadline a query gets the model's default output."""
        for qid in self.deadlines.due(now):
            pending = self.pending.pop(qid, None)
            if pending is None:
                continue  # answered already
            self._settle(pending)
            if pending.call is not None:
                self._answer_app(pending)
            else:
                self._default(pending)
        following = self.deadlines.settle(self.pending)
        if following is not None:
            self.deadline.at(following)

    def _default(self, pending: Pending) -> None:
        info = self.cfg.models[pending.model]
        if info.default_output is not None:
            self._answer(pending.requests, Source.DEFAULT, pending.model, pending.version, np.asarray(info.default_output, np.float32))
        else:
            self._answer(pending.requests, Source.DEFAULT, pending.model, pending.version, None,
                         "deadline passed before a prediction; no default output is configured", ErrorCode.DEADLINE)

    def _forget_answered(self, now: float) -> None:
        self.dedup.forget(now)
        kept = self.dedup.bytes
        if kept + min(TRIM_STEP, self.cfg.dedup_max_bytes // 2) < self.trim_mark or self.closed_clients >= TRIM_CLIENTS:
            release_memory()  # the memory freed stays the process's otherwise
            self.memory_released += 1
            self.trim_mark, self.closed_clients = kept, 0
        self.trim_mark = max(self.trim_mark, kept)

    def drain(self) -> None:
        """On shutdown, every pending request still gets an answer that says why."""
        if self.manager is not None:
            self.manager.close()
        for pending in {id(p): p for p in self.pending.values()}.values():
            self._answer(pending.requests, Source.ERROR, pending.model, pending.version, None,
                         "frontend shutting down", ErrorCode.INTERNAL)
        self.pending.clear()
        for route in self.graphs.values():
            route.close()
        if self.apps is not None:
            self.apps.close()

    def status(self) -> dict:
        cache = None
        if self.cache is not None:
            cache = {"size": len(self.cache), "hits": self.cache.hits, "misses": self.cache.misses}
        return {"service": self.name, "role": self.role, "pending": len(self.pending), "answered": dict(self.counts),
                "cache": cache, "models": sorted(self.cfg.models), "epoch": self.ids.epoch,
                # the gateway's model versions: what the workers serve now, not the spec's at start
                "serving": {m: self.serving.get(m, info.version) for m, info in self.cfg.models.items()},
                "dedup": {"entries": len(self.dedup), "bytes": self.dedup.bytes}, "clients": len(self.clients),
                "memory_released": self.memory_released,
                "applications": sorted(self.apps.apps) if self.apps else [],
                "feedback_log": len(self.apps.log) if self.apps else 0,
                "graphs": {name: route.status() for name, route in self.graphs.items()},
                "targets": self.targets()}

    def targets(self) -> dict[str, dict]:
        """Every name a client may call, with what it takes and answers: ``kind`` (model,
        application or graph), ``input_shape``, ``input_dtype``, ``output_size``, the
        ``version`` served (None: the target has no versions) and whether it takes a ``key``;
        a graph also its ``mode``."""
        out = {}
        for name, info in self.cfg.models.items():
            out[name] = {"kind": "model", "input_shape": list(info.input_shape), "input_dtype": info.input_dtype,
                         "output_size": info.output_size, "version": self.serving.get(name, info.version), "key": False}
        for name, info in (self.apps.infos.items() if self.apps else ()):
            out[name] = {"kind": "application", "input_shape": list(info.input_shape), "input_dtype": info.input_dtype,
                         "output_size": info.output_size, "version": None, "key": True}
        for name, route in self.graphs.items():
            out[name] = route.target()
        return out


def _column_key(reply: Reply) -> tuple | None:
    """``protocol.column_key`` of a reply whose output is at most ``COLUMN_ROW_BYTES`` (so a
    column, ``BUNDLE_REPLIES`` rows at most, stays within ``BUNDLE_BYTES``); None for others."""
    out = reply.output
    return protocol.column_key(reply) if out is not None and out.nbytes <= COLUMN_ROW_BYTES else None


def _hang_up(fd: int) -> None:
    """End the TCP connection on ``fd`` (ZeroMQ's: it sees the peer go and frees what the
    connection held; the descriptor stays its to close)."""
    try:
        conn = socket.socket(fileno=fd)
    except OSError:  # gone already
        return
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        conn.detach()


def _request_id_of(body: list) -> str:
    """Best-effort request id of a malformed message, so its error reaches the right call
    (none if it is not a well-formed id: an oversized one is neither echoed nor logged)."""
    try:
        header = protocol.decode_header(body[0])
        rid = header.get("request_id", "")
        if not rid and isinstance(header.get("request_ids"), list) and header["request_ids"]:  # columns: the first row's
            rid = header["request_ids"][0]
        return rid if isinstance(rid, str) and len(rid) <= protocol.MAX_REQUEST_ID else ""
    except (protocol.ProtocolError, IndexError):
        return ""
