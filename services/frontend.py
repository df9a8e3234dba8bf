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

Routes: what a request is sent to is chosen by its target (``Predict.model``), behind one
interface (``services.routes``): a model (``routes.model``: cache, dispatcher,
reconstructions), an application (``routes.application``), a HAMS service graph
(``services.graph.route``: origins of this incarnation, the hold until durable). Decoding,
validation (``common.inputs``: the input, the key, the version, the timeout), de-duplication,
admission (one budget of ``admission_limit`` queries for every target), deadlines (one heap),
cancellation, the request lifecycle, metrics (per ``target`` and ``kind``) and the one log
line per request are the frontend's for all of them, and it never asks a target's kind:
the rules are the same for every target (``services.routes``). ``Predict.key`` is the one
per-call key: an application's context, a graph's stream (``route.stream_of``); a plain
model refuses one. A name that is none of these is ``unknown_model``, the reply listing
what is served. The dispatcher failover (below) is the frontend's, for the model queries.

Model selection (Clipper §5, ``services.selection.runtime``): a request may name an
application instead of a model (with a ``key``); its policy picks the models to query
(in the context's state), their outputs are combined when all arrived, or at the deadline
with those that did (stragglers count as disagreeing, the reply says ``partial``), and the
reply names the models used and the confidence. A ``Feedback`` message with the true class
updates the context's state from the outputs kept in the feedback log.

A request's states are in ``services.requests``; de-duplication is by (``Predict.client``
when the client sends it, else the connection, request id); a ``Cancel`` names a request the
same way (``_on_cancel``). Query ids come from this
incarnation's ``IdSpace``: a prediction for a query of an earlier incarnation (the
frontend restarted on the same endpoint) is counted ``stale`` and dropped, never matched
to a new query. A query answered by a
reconstruction is reported to the dispatcher (``Answered``) so it is not run again.

Clients are outside Keel's control, so a reply to one never blocks: the client ROUTER
has a per-client queue of ``client_hwm`` replies, a reply that does not fit is dropped and
counted (``reply_dropped``); a client that reads bundles (``Predict.bundle``) gets the replies
a batch of several predictions answers for it in one message (``services.replies``; those that share
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
``Cancel``, ``Feedback`` and ``Status`` requests; any other kind is answered ``bad_request`` and
counted (``refused_kind``). ``Configure(model, version)`` -- a finished rollout -- is an
operator's, and comes on the prediction endpoint, Keel's side of the frontend.
"""
from __future__ import annotations

import socket
import time
import zlib
from collections import OrderedDict, defaultdict

import numpy as np
import zmq

from keel.common import inputs, protocol, tracing, transport
from keel.common.config import FrontendConfig
from keel.common.ids import SEQ_BITS, IdSpace
from keel.common.protocol import named
from keel.common.protocol import (
    Answered, Cancel, Configure, ErrorCode, Feedback, Predict, Predictions, Predicts, Queries, Source, Status,
    Withdraw,
)
from keel.common.signature import validate as validate_named
from keel.services.base import Service, release_memory
from keel.services.cache import ClockCache
from keel.services.graph.route import GraphRoute
from keel.services.replies import Replies
from keel.services.requests import Deadlines, DedupTable, Request, State, carry_trace, stack_rows
from keel.services.routes import CACHED, FULL, Pending
from keel.services.routes.application import ApplicationRoute
from keel.services.routes.model import ModelRoute
from keel.services.selection.runtime import Applications
#: freed memory is handed back to the system once the de-duplication table has shrunk by
#: this many bytes (half its limit if that is less: a table of a few MB that emptied must
#: count), or this many client connections have closed, since it last was
TRIM_STEP = 8 << 20
TRIM_CLIENTS = 64


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
        #: qid -> its computation (a route's: ``Pending``, ``GraphCall``): the queries in flight,
        #: what admission counts, whatever their targets
        self.pending: dict[int, object] = {}
        self.by_request: dict[tuple, tuple] = {}  # (sender, request id) -> (computation, input digest)
        self.dedup = DedupTable(cfg.dedup_ttl_s, cfg.dedup_max_entries, cfg.dedup_max_bytes)
        self.deadlines = Deadlines()
        self.deadline = self.timer(self._expire)
        self.outbox: dict[str, list[tuple[int, float, np.ndarray]]] = defaultdict(list)
        #: qid -> the stamps of a traced request (``Predict.trace``) until its Queries leaves:
        #: only traced requests are kept here, so the untraced path pays one emptiness test a flush
        self.traces: dict[int, list[float]] = {}
        self.reconstructed_by: dict[str, list[int]] = defaultdict(list)  # model -> qids, for Answered
        self.withdrawn: dict[str, list[int]] = defaultdict(list)  # model -> cancelled qids already sent, for Withdraw
        self.reconstructed: dict[int, np.ndarray] = {}  # qid -> output, oldest first
        self.counts: dict[str, int] = defaultdict(int)
        self.nonfinite_models: set[str] = set()  # logged once each
        self.trim_mark, self.closed_clients = 0, 0  # since memory was last handed back
        self.memory_released = 0  # times freed memory was handed back to the system
        self.every(1.0, self._forget_answered)
        self.m_pending = self.metrics.gauge("pending_queries", "queries admitted and not yet answered")
        self.m_cancelled = self.metrics.counter("requests_cancelled_total", "requests cancelled by their client "
                                                "before an answer", ["target"])
        self.m_refused = self.metrics.counter("client_messages_refused_total",
                                              "messages of a kind clients may not send, refused", ["kind"])
        #: target name -> its route: models, applications, HAMS service graphs, each answering
        #: through ``answer`` (a name is the first kind's that has it)
        self.routes = {name: ModelRoute(name, info, self) for name, info in cfg.models.items()}
        for name in (self.apps.apps if self.apps else ()):
            self.routes.setdefault(name, ApplicationRoute(name, self.apps, self))
        self.graphs = {name: GraphRoute(name, route, self) for name, route in cfg.graphs.items()}
        for name, route in self.graphs.items():
            self.routes.setdefault(name, route)
        #: the one way a reply leaves (``services.replies``); the routes answer through ``answer``
        self.replies = Replies(self.router, self.dedup, self.counts, self.metrics, cfg.models, self.routes, self.log,
                               cfg.log_requests)
        self.answer = self.replies.answer
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
                elif isinstance(msg, Cancel):
                    self._on_cancel(msg, envelope)
                elif isinstance(msg, Feedback) and msg.ok is None:
                    self._on_feedback(msg, envelope)
                elif isinstance(msg, Status) and msg.info is None:
                    self.replies.send(envelope, protocol.encode(Status(service=self.name, info=self.status())))
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
        x = msg.input
        size = x.nbytes if x is not None else named.nbytes(msg.inputs)  # (a Predict carries one or the other)
        if size > self.cfg.max_payload_bytes:
            return self._refuse(request, ErrorCode.BAD_REQUEST, f"payload of {size} bytes exceeds the limit of "
                                                                f"{self.cfg.max_payload_bytes} (max_payload_bytes)")
        route = self.routes.get(msg.model)
        if route is None:
            known = ", ".join(sorted(self.routes)) or "none"
            return self._refuse(request, ErrorCode.UNKNOWN_MODEL, f"unknown model {msg.model!r}; this frontend serves: {known}")
        key = msg.key
        error = inputs.call_error(msg.model, route.kind, key, msg.version, msg.timeout_ms)
        if error is not None:
            return self._refuse(request, ErrorCode.BAD_REQUEST, error)
        if msg.version is not None:
            served = route.version()  # after a rollout, the rollout's version
            if msg.version != served:
                return self._refuse(request, ErrorCode.UNKNOWN_MODEL,
                                    f"{route.kind} {msg.model} serves version {served}, not {msg.version}")
        signature = route.signature  # a target of named tensors; None: one tensor (the fast path)
        try:
            if signature is not None:  # each input checked: missing, extra, dtype, bounds, NaN
                x = validate_named(signature, x if x is not None else route.named_of(msg.inputs))
            else:
                if x is None:
                    x = route.one_input(msg.inputs)
                inputs.validate(x, route.info.input_shape, route.dtype, what=route.what, convert=False)
        except inputs.InputError as exc:
            return self._refuse(request, ErrorCode.BAD_REQUEST, str(exc))
        # A cheap fingerprint of what was asked: a reused id is only a retry if it matches.
        request.digest = digest = zlib.crc32(x if signature is None else named.fingerprint(x),
                                             zlib.crc32(f"{msg.model}\0{key or ''}".encode()))
        done = self.dedup.get(dkey)
        if done is not None:  # a retry of an answered request: the same answer again
            if done[1] != digest:
                return self._refuse(request, ErrorCode.BAD_REQUEST, "request id reused with a different input")
            self.counts["duplicate"] += 1
            request.to(State.ANSWERED)
            self.replies.send(envelope, done[0])
            return
        waiting = self.by_request.get(dkey)
        if waiting is not None:  # a retry while it is still being computed: it joins, in their state
            if waiting[1] != digest:
                return self._refuse(request, ErrorCode.BAD_REQUEST, "request id reused with a different input")
            request.to(waiting[0].requests[0].state)
            waiting[0].requests.append(request)
            return
        deadline = time.monotonic() + route.deadline_ms(msg.timeout_ms) / 1000.0
        computation = route.admit(request, msg, x, deadline, len(self.pending) >= self.cfg.admission_limit)
        if computation is CACHED:
            return
        if computation is FULL:
            return self._refuse(request, ErrorCode.OVERLOADED, f"{len(self.pending)} queries in flight "
                                                               "(admission_limit); try again later")
        self.by_request[dkey] = (computation, digest)
        if computation.requests[0] is request:  # a new computation (else one in flight it joined)
            request.to(State.WAITING)
            for qid in computation.qids:
                self.pending[qid] = computation
                self.deadlines.push(deadline, qid)
            self.deadline.at_latest(deadline)
            if tracing.ON and route.traced:  # OpenTelemetry: sampled, it rides the stamps' path
                tracing.admit(self.name, computation.qids[0], msg, self.traces, time.time() - (time.perf_counter() - start))
            if msg.trace is not None and route.traced:  # receipt, on the wall clock the stamps share
                self.traces[computation.qids[0]] = [*msg.trace, time.time() - (time.perf_counter() - start)]

    def _flush(self) -> None:
        """One Queries message per model for everything admitted in this tick, and one
        Answered per model for the queries reconstructions answered."""
        now = time.monotonic()
        for model, items in self.outbox.items():
            if items:
                xs = [x for _, _, x in items]
                one = type(xs[0]) is not dict  # a named model's queries go as rows, one dict each
                msg = Queries(model=model, qids=[q for q, _, _ in items], budgets_ms=[(d - now) * 1000.0 for _, d, _ in items],
                              reply_to=self.reply_to, inputs=stack_rows(xs) if one else None, fence=self.fence,
                              sent_at=time.time(), rows=None if one else xs)
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
        for model, qids in self.withdrawn.items():
            if qids:
                transport.send(self.push, Withdraw(model=model, qids=list(qids)))
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
            if not isinstance(pending, Pending) or pending.input is None:  # a graph's, or no input kept
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
            self.replies.send_bundles()
            self.replies.record()
        self._flush()

    def _on_outputs(self, msg: Predictions) -> None:
        source = Source.RECONSTRUCTION if msg.source == Source.RECONSTRUCTION else Source.MODEL
        outputs, error = msg.outputs, msg.error
        info = self.cfg.models.get(msg.model)
        bad = None  # rows whose output is NaN or infinite: a model error, never an answer
        named_model = info is not None and info.signature is not None
        if named_model:  # a dict of named tensors a query
            outputs, bad, error = self._named_outputs(msg, error)
        elif outputs is not None:
            if info is None or outputs.size != len(msg.qids) * info.output_size:
                want = "" if info is None else f", not {info.output_size} values per query"
                error, outputs = f"outputs of shape {list(outputs.shape)}{want}", None
            elif outputs.ndim != 2:
                outputs = outputs.reshape(len(msg.qids), info.output_size)
        elif error is None:
            error = "no outputs"
        if not named_model and outputs is not None and outputs.dtype.kind == "f":
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
            pending = self.pending.pop(qid, None)
            if pending is None:
                self._late(qid, source, None if outputs is None or (bad is not None and bad[i]) else outputs[i])
                continue
            model = pending.models[0] if len(pending.qids) == 1 else pending.models[pending.qids.index(qid)]
            if model != msg.model:  # not this query's model: not its answer
                self.pending[qid] = pending
                self.counts["mismatched"] += 1
                continue
            if outputs is None:
                pending.route.on_output(pending, qid, model, None, f"failed on this batch: {error}", source, msg)
            elif bad is not None and bad[i]:
                pending.route.on_output(pending, qid, model, None, "output NaN or infinity for this input", source, msg)
            else:
                pending.route.on_output(pending, qid, model, outputs[i], None, source, msg)

    def _named_outputs(self, msg: Predictions, error: str | None) -> tuple[list | None, list | None, str | None]:
        """(outputs, bad rows, error) of a named model's predictions: a dict of named tensors a
        query (``Predictions.rows``, cut back by the worker); a query whose float output holds
        NaN or infinity is bad, as in the one-tensor path."""
        rows = msg.rows
        if rows is None:
            return None, None, error or ("one tensor from a model of named outputs" if msg.outputs is not None else "no outputs")
        bad = [any(a.dtype.kind == "f" and a.size and not np.isfinite(a).all() for a in row.values()) for row in rows]
        if not any(bad):
            return rows, None, error
        self._nonfinite(msg, sum(bad))
        return rows, bad, error

    def _nonfinite(self, msg: Predictions, rows: int) -> None:
        """A model answered NaN or infinity for a finite input (the input was checked at
        admission): counted, and logged once per model so a broken model does not flood
        the log."""
        self.counts["nonfinite_outputs"] += rows
        if msg.model not in self.nonfinite_models:
            self.nonfinite_models.add(msg.model)
            self.log.error("model output NaN or infinity; answered model_error, not cached", model=msg.model,
                           worker=msg.worker, source=str(msg.source), rows=rows)

    def _on_cancel(self, msg: Cancel, envelope: list) -> None:
        """A client gave up on a request: if it is in flight, it (and every retry joined to
        it) is answered once, ``cancelled``, and its route drops what it holds for it
        (``route.cancel``): a computation it shares with other requests (an identical query
        of another client) keeps running for them, a model query already sent is withdrawn
        from the dispatcher, a graph request is cancelled only while it has not entered the
        graph. Unknown or answered requests are left alone: an answer stays for a retry."""
        dkey = (msg.client.encode() if msg.client else envelope[0], msg.request_id)
        waiting = self.by_request.get(dkey)
        if waiting is None:
            self.counts["cancel_ignored"] += 1
            return
        computation = waiting[0]
        route = computation.route
        cancelled = route.cancel(computation, dkey)
        if cancelled is None:
            self.counts["cancel_too_late"] += 1  # in a graph: it completes, its answer kept for a retry
            return
        self.answer(cancelled, Source.ERROR, route.name, None, None, "cancelled by the client", ErrorCode.CANCELLED)
        self.counts["cancelled"] += 1
        self.m_cancelled.labels(target=route.name).inc()
        self.log.info("cancelled", request_id=msg.request_id, target=route.name, kind=route.kind,
                      shared=computation.requests is not cancelled and bool(computation.requests))

    def _on_feedback(self, msg: Feedback, envelope: list) -> None:
        if self.apps is None:
            error, code = "this frontend serves no applications: feedback has nothing to teach", ErrorCode.UNKNOWN_REQUEST
        else:
            error, code = self.apps.feedback(msg.request_id, msg.label)
        self.counts["feedback" if error is None else "feedback_refused"] += 1
        self.replies.send(envelope, protocol.encode(Feedback(request_id=msg.request_id, label=msg.label,
                                                             ok=error is None, error=error, error_code=code)))

    def _late(self, qid: int, source: str, output: np.ndarray | None) -> None:
        """An answer for a query already answered: count it; grade an earlier reconstruction."""
        self.counts[f"late_{source}"] += 1
        if source == Source.MODEL and output is not None:
            rebuilt = self.reconstructed.pop(qid, None)
            if rebuilt is not None and not isinstance(rebuilt, dict):  # named outputs: no one top-1 to grade
                self.counts["reconstructions_graded"] += 1
                self.counts["reconstructions_agree"] += int(np.argmax(rebuilt) == np.argmax(output))

    def settle(self, computation) -> None:
        """A computation is decided: forget how requests found it, and its queries."""
        for request in computation.requests:
            self.by_request.pop(request.dedup, None)
        for qid in computation.qids:
            self.pending.pop(qid, None)

    def _refuse(self, request: Request, code: str, text: str) -> None:
        self.answer([request], Source.ERROR, "", "", None, text, code)

    # ------------------------------------------------------------------ chores

    def _expire(self, now: float) -> None:
        """A computation's deadline passed: its route answers it by the deadline rule."""
        for qid in self.deadlines.due(now):
            computation = self.pending.pop(qid, None)
            if computation is not None:  # else answered already
                computation.route.expire(computation)
        following = self.deadlines.settle(self.pending)
        if following is not None:
            self.deadline.at(following)

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
        for route in self.routes.values():  # a graph answers what is in it
            route.close()
        for computation in {id(p): p for p in self.pending.values()}.values():
            self.answer(computation.requests, Source.ERROR, computation.route.name, None, None,
                        "frontend shutting down", ErrorCode.INTERNAL)
        self.pending.clear()
        if self.apps is not None:
            self.apps.close()

    def status(self) -> dict:
        cache = None
        if self.cache is not None:
            cache = {"size": len(self.cache), "hits": self.cache.hits, "misses": self.cache.misses}
        return {"service": self.name, "role": self.role, "pending": len(self.pending),
                "in_flight": len(self.by_request), "answered": dict(self.counts),
                "cache": cache, "models": sorted(self.cfg.models), "epoch": self.ids.epoch,
                # the gateway's model versions: what the workers serve now, not the spec's at start
                "serving": {m: self.serving.get(m, info.version) for m, info in self.cfg.models.items()},
                "dedup": {"entries": len(self.dedup), "bytes": self.dedup.bytes}, "clients": len(self.clients),
                "memory_released": self.memory_released,
                "applications": sorted(self.apps.apps) if self.apps else [],
                "feedback_log": len(self.apps.log) if self.apps else 0,
                "graphs": {name: route.status() for name, route in self.graphs.items()},
                # the other routes' figures (a model's computations shared by identical requests)
                "routes": {name: route.status() for name, route in self.routes.items() if name not in self.graphs},
                "targets": self.targets()}

    def targets(self) -> dict[str, dict]:
        """Every name a client may call, described as ``common.targets.describe`` says (kind,
        what it takes and answers, the version served, whether it takes a key; a graph's
        mode): what the gateways and ``keel status`` show."""
        return {name: route.describe() for name, route in self.routes.items()}


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
