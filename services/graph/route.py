"""The graph route: what the frontend does for a request to a HAMS service graph, the
frontend being the graph's entry and exit and its last stateful node (§IV-D).

The frontend admits, validates and de-duplicates the request, keeps its deadline and
answers it (``services.frontend``; the rules every route shares are ``services.routes``');
the route then gives it the next *origin* of this frontend's origin space (an ``IdSpace``
of its own incarnation: a restarted frontend never reuses an origin, so a new request
never looks like one whose saved outputs the operators freed, ``released_origin``), and
sends a ``GraphRequest`` to the operators the frontend feeds, naming the client request
end to end (``request``: operators apply it at most once) and this frontend's graph
endpoint (``reply_to``: where the graph's output comes back, a PULL bound per graph).

The output is held (``ReleaseGate``, the request HELD) until every stateful state on its
lineage is durable (the backups' ``GraphDurable`` notices), so no client sees an output
that a failure could contradict. A stateless-only graph (or mode bare or strawman: no
state reaches a backup) holds nothing. Every request gets one answer: its output, or an
error that says why (an operator's ``model_error``), or at its deadline (the call's
``timeout_ms``, else ``request_timeout_s``) the deadline rule's: the graph's default
output, else ``deadline``.

A cancelled request is answered ``cancelled`` only while it has not entered the graph
(``cancel``): once sent, the frontend cannot know whether its first stateful operator
applied it, and a request is never stopped half-way (exactly once).

Behind an interleaving join a request has several outputs (``replies_per_origin``): the
route waits for all of them, answers with the one the last operator numbered last (it saw
every input of the request) and holds it until the lineages of all are durable.

Every 50 ms it tells the operators (and backups) the highest origin up to which every
reply has left (``GraphDurable`` from "frontend", epoch 1), so their saved outputs can be
freed (state GC). Only outputs for this route's own origins are taken; others (another
frontend's, an earlier incarnation's) are counted ``foreign`` and dropped.

HAMS II: a ``GraphDurable`` at a newer epoch than the operator's last is a promoted
backup's word that its state is durable up to ``seq``: held outputs whose lineage has a
larger seq of that operator came from the failed primary and can never be durable; they
are dropped and their requests wait again for the re-run's output. With a manager the
route follows each group's holder in the change feed. It keeps each input until answered:
when an operator it feeds was taken over, a ``GraphAck`` names the highest origin its
state holds, and the route resends the waiting requests above it in origin order (every
waiting request when that origin is not its own: the operators drop by request key what
they already applied); new requests for it wait until then.

Example
-------
>>> stream_of("42"), stream_of("42") == stream_of(" 42"), 0 <= stream_of("user-7") < 2**63
(42, False, True)
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from math import prod

import numpy as np
import zmq

from keel.common import protocol, targets, tracing, transport
from keel.common.config import GraphRouteConfig, ModelInfo
from keel.common.ids import EPOCH_BITS, IdSpace, new_epoch
from keel.common.protocol import ErrorCode, Predict, Source
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest
from keel.common.spec.graph import FRONTEND, read_graph
from keel.common.spec.modes import MODES
from keel.services.graph.lineage import ReleaseGate, join
from keel.services.graph.events import EventLog
from keel.services.requests import Request, State
from keel.services.routes import FULL, Route

#: how often GC notices go out and the trace is flushed (s)
CHORES_S = 0.05


def stream_of(key: str | None) -> int:
    """A graph's stream (whose per-stream state a stateful operator keeps) for a call's
    ``key``: the same on every frontend, so a client's stream survives a failover. A
    decimal key below 2**63 is its own number (``"7"`` -> 7: old clients' int streams);
    any other key is the first 63 bits of its blake2b digest. No key: stream 0."""
    if not key:
        return 0
    if key.isascii() and key.isdigit() and int(key) < 1 << 63:
        return int(key)
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 1


def origin_space(lane: int, lanes: int) -> IdSpace:
    """This incarnation's origins: an ``IdSpace`` whose epoch is this start's, moved to
    ``lane`` modulo ``lanes`` so that frontends of one graph started in the same 10 ms tick
    still number apart (a later start of the same frontend still has a larger epoch)."""
    epoch = (new_epoch() // lanes * lanes + lane) % (1 << EPOCH_BITS)
    return IdSpace(epoch or lanes)


@dataclass(slots=True)
class GraphCall:
    """One request in the graph: the client requests waiting for it (a retry of the same
    request attaches here), what went in (kept for resends), and its held output."""

    origin: int
    qids: tuple[int]  # the frontend's query id: its place in the admission budget and deadlines
    models: tuple[str]  # (the graph's name,): no model's prediction is its answer
    requests: list[Request]
    message: GraphRequest  # what went in
    deadline: float  # monotonic
    route: GraphRoute
    sent: bool = False  # sent to an operator: from then on it cannot be cancelled (``cancel``)
    parts: dict[int, GraphRequest] = field(default_factory=dict)  # seq -> output, until all arrived
    output: np.ndarray | None = None  # held until durable
    lineage: list | None = None
    held_at: float | None = None
    degraded: bool = False


class GraphRoute(Route):
    """The frontend's route to one graph: driven by the frontend's loop (its sockets are
    the frontend's, ``chores`` its timed chore)."""

    kind = "graph"

    def __init__(self, name: str, config: GraphRouteConfig, service):
        self.name, self.config = name, config
        self.service = self.fe = service
        self.graph = read_graph(config.graph, f"graphs.{name}")
        last = self.graph.predecessors(FRONTEND)[0]
        #: what the frontend validates a call against; a graph has no versions
        self.info = ModelInfo(list(self.graph.input_shape), prod(self.graph.operators[last].output_shape),
                              deadline_ms=1000 * config.request_timeout_s, default_output=config.default_output)
        self.dtype = np.dtype(self.info.input_dtype)
        self.what = f"{self.kind} {name}"  # how refusals name it
        self.default = None if config.default_output is None else np.asarray(config.default_output, np.float32)
        self.endpoints = dict(config.peers)  # node -> endpoint, followed in the manager's feed
        self.inbox = service.add_socket(transport.make_socket(service.ctx, zmq.PULL, bind=config.endpoint), self.on_inbox)
        self.reply_to = transport.endpoint_of(self.inbox)
        self.peers = transport.Peers(service.ctx, on_new=service.sockets.append)
        self.gate = ReleaseGate(self.graph.stateful if MODES[self.graph.mode].ships_state else ())
        self.ids = origin_space(config.lane, config.lanes)
        self.calls: dict[int, GraphCall] = {}  # origin -> request in the graph, until answered
        self.expect = self.graph.replies_per_origin
        self.hold_s = 0.0  # total time held replies waited for durability (what NSPB costs a reply)
        self.answered_below = self.ids.base + 1  # every origin below it is answered
        self.announced_below = self.answered_below
        self.answered: set[int] = set()  # answered origins at or above answered_below
        self.counts = {"answered": 0, "held": 0, "errors": 0, "degraded": 0, "voided": 0, "resent": 0, "foreign": 0,
                       "expired": 0}
        self.trace = EventLog(config.trace_path)
        self.epochs: dict[str, int] = {}  # stateful operator -> newest epoch of its durability notices
        self.group_epochs: dict[str, int] = {}  # operator -> newest epoch of its group in the manager's feed
        self.awaiting: set[str] = set()  # operators I feed that were taken over: their ack is awaited
        self.resend_after: dict[str, tuple[int, int]] = {}  # operator -> (its new epoch, origin it holds up to)
        service.every(CHORES_S, self.chores)

    # ------------------------------------------------------------------ requests in

    def admit(self, request: Request, msg: Predict, x: np.ndarray, deadline: float, full: bool):
        """Send ``request`` into the graph (the client request named end to end: operators
        apply it at most once); ``FULL`` when the admission budget is spent."""
        if full:
            return FULL
        origin = self.ids.next()
        request_key = protocol.request_key(msg.client or request.envelope[0].hex(), msg.request_id)
        out = GraphRequest(FRONTEND, origin, origin, stream_of(msg.key), [], x, request=request_key,
                           reply_to=self.reply_to)
        if tracing.ON:  # OpenTelemetry: a sampled request's span; its context enters the graph
            out.traceparent = tracing.graph_admit(self.name, origin, msg)
        call = self.calls[origin] = GraphCall(origin, (self.service.ids.next(),), (self.name,), [request], out, deadline,
                                              self)
        for op in self.graph.successors(FRONTEND):
            if op not in self.awaiting:
                self.peers.send(self.endpoints[op], out)
                call.sent = True
        return call

    def cancel(self, call: GraphCall, dkey: tuple) -> list[Request] | None:
        """The requests of ``call`` (its retries all share ``dkey``) if it never entered the
        graph (every operator it goes to was taken over and its ack is awaited); None once
        sent: the frontend cannot know whether the first stateful operator applied it, and a
        request is never stopped half-way (exactly once): it completes, its answer kept for
        a retry."""
        if call.sent:
            return None
        self.service.settle(call)
        self._forget(call)
        return call.requests

    # ------------------------------------------------------------------ the graph's messages

    def on_inbox(self, sock: zmq.Socket) -> None:
        for _, msg in self.service.messages(sock):
            if isinstance(msg, GraphRequest):
                self.on_output(msg)
            elif isinstance(msg, GraphAck) and msg.operator in self.graph.successors(FRONTEND):
                if self.service.manager is not None and msg.epoch > self.group_epochs.get(msg.operator, 0):
                    self.resend_after[msg.operator] = (msg.epoch, msg.seq)  # once the feed says where it is
                else:
                    self._resend(msg.operator, msg.seq)
            elif isinstance(msg, GraphDurable):
                self._on_durable(msg)

    def on_output(self, msg: GraphRequest) -> None:
        """An output of the graph for one of this route's requests (its inbox)."""
        if not self.ids.owns(msg.origin):
            self.counts["foreign"] += 1  # another frontend's, or an earlier incarnation's: not mine to answer
            return
        call = self.calls.get(msg.origin)
        if call is None or call.output is not None:
            return  # a duplicate, or a request already answered
        if msg.error is not None:  # an operator's model failed on it: no output to hold
            self._answer(call, Source.ERROR, None, msg.error, ErrorCode.MODEL_ERROR)
            return
        call.parts[msg.seq] = msg
        if len(call.parts) < self.expect:
            return
        parts, call.parts = call.parts, {}
        # a re-run after a void is its own word: only this run's outputs say degraded
        call.degraded = any(m.degraded for m in parts.values())
        call.lineage = join(m.lineage for m in parts.values())
        output = parts[max(parts)].input
        if self.gate.hold(msg.origin, call.lineage):
            call.output, call.held_at = output, time.perf_counter()
            for request in call.requests:
                request.to(State.HELD)
            self.counts["held"] += 1
        else:
            call.output = output
            self._answer(call, Source.MODEL, output)

    def _on_durable(self, msg: GraphDurable) -> None:
        if msg.epoch < self.epochs.get(msg.operator, 1):
            return  # an older incarnation's word (a backup whose primary rolled back in place)
        if msg.epoch > self.epochs.get(msg.operator, 1):  # 1: the spec's epoch (HAMS I)
            self._void(msg.operator, msg.epoch, msg.seq)
        for origin in self.gate.on_notify(msg.operator, msg.seq):
            call = self.calls.get(origin)
            if call is not None:
                self._answer(call, Source.MODEL, call.output)

    def _resend(self, op: str, after: int) -> None:
        """``op`` was taken over and holds origins up to ``after``: resend the waiting rest,
        in origin order (all of them when ``after`` is not one of mine)."""
        self.awaiting.discard(op)
        mine = self.ids.owns(after)
        for origin in sorted(o for o, c in self.calls.items() if c.output is None and (o > after or not mine)):
            self.peers.send(self.endpoints[op], self.calls[origin].message)
            self.calls[origin].sent = True
            self.counts["resent"] += 1

    def _void(self, operator: str, epoch: int, max_seq: int) -> None:
        """``operator``'s backup took over with its state up to ``max_seq``: held outputs
        beyond it depend on a state that died with the primary; wait for the re-run."""
        self.epochs[operator] = epoch
        for origin, lineage in list(self.gate.waiting.items()):
            if any(e.operator == operator and e.seq > max_seq for e in lineage):
                del self.gate.waiting[origin]
                call = self.calls[origin]
                call.output = call.lineage = call.held_at = None
                for request in call.requests:
                    request.to(State.WAITING)
                self.counts["voided"] += 1

    # ------------------------------------------------------------------ answers

    def _answer(self, call: GraphCall, source: str, output: np.ndarray | None, error: str | None = None,
                code: str | None = None) -> None:
        self.service.settle(call)
        self._forget(call)
        if tracing.ON:
            tracing.graph_answered(self.name, call.origin, source)
        degraded = call.degraded and error is None
        if self.trace and error is None:
            self.trace.write("release", origin=call.origin, lineage=[e.to_json() for e in call.lineage])
        self.counts["answered" if error is None else "errors"] += 1
        self.counts["degraded"] += degraded
        self.service.answer(call.requests, source, self.name, None, output, error, code, degraded=degraded or None)

    def _forget(self, call: GraphCall) -> None:
        """``call`` is decided: out of the graph's tables; its origin counts as answered (GC)."""
        del self.calls[call.origin]
        self.gate.waiting.pop(call.origin, None)
        if call.held_at is not None:
            self.hold_s += time.perf_counter() - call.held_at
        self.answered.add(call.origin)
        while self.answered_below in self.answered:
            self.answered.discard(self.answered_below)
            self.answered_below += 1

    def expire(self, call: GraphCall) -> None:
        """No durable answer by its deadline: the deadline rule (a held output that is not
        durable is never answered)."""
        self.service.settle(call)
        self._forget(call)
        self.counts["expired"] += 1
        if tracing.ON:
            tracing.graph_answered(self.name, call.origin, "deadline")
        self.deadline_answer(call.requests)

    def chores(self, now: float) -> None:
        self.trace.flush()
        if self.answered_below > self.announced_below:  # GC notice, only when it moved
            self.announced_below = self.answered_below
            # epoch 1: an operator reads a frontend notice at a newer epoch as a takeover
            note = GraphDurable(FRONTEND, 1, self.answered_below - 1)
            for op in [*self.graph.operators, *(f"{n}.backup" for n in self.graph.stateful)]:
                if op in self.endpoints:
                    self.peers.send(self.endpoints[op], note)

    def close(self) -> None:
        """On shutdown every request still in the graph is answered (``internal``)."""
        for call in list(self.calls.values()):
            self._answer(call, Source.ERROR, None, "frontend shutting down", ErrorCode.INTERNAL)
        self.trace.close()

    # ------------------------------------------------------------------ the manager's feed

    def on_manager_change(self, key: str, value: dict | None) -> None:
        """A group of this graph has a (new) holder: send there; a takeover of an operator
        I feed waits for its ack to resend in origin order."""
        if not (key.startswith("group/graph/") and value and value.get("holder")):
            return
        op = key[len("group/graph/"):]
        if op not in self.graph.operators:
            return
        svc = self.service.manager.feed.values.get(f"service/{value['holder']}") or {}
        endpoint = (svc.get("endpoints") or {}).get("inbox")
        if not endpoint or value.get("epoch", 0) <= self.group_epochs.get(op, 0):
            return
        if op in self.group_epochs and op in self.graph.successors(FRONTEND):
            self.awaiting.add(op)  # a takeover: resend in origin order once its ack says from where
        if op in self.group_epochs and op in self.graph.stateful:
            self.endpoints[f"{op}.backup"] = endpoint  # GC notices: the new primary passes them on
        self.group_epochs[op] = value.get("epoch", 0)
        self.endpoints[op] = endpoint
        pending = self.resend_after.get(op)
        if pending is not None and pending[0] <= self.group_epochs[op]:
            del self.resend_after[op]
            self._resend(op, pending[1])

    # ------------------------------------------------------------------ status

    def describe(self) -> dict:
        """This graph as one of the frontend's targets (``Frontend.targets``)."""
        return targets.describe(self.kind, self.info, None, mode=self.graph.mode)

    def status(self) -> dict:
        held = [c for c in self.calls.values() if c.output is not None]
        return {"mode": self.graph.mode, "operators": list(self.graph.order), "stateful": sorted(self.graph.stateful),
                "epoch": self.ids.epoch, "endpoint": self.reply_to,
                "hold_ms_mean": 1000 * self.hold_s / max(1, self.counts["held"]),
                "in_graph": len(self.calls), "held_now": len(held), "durable": dict(self.gate.durable.seqs),
                # state GC: each drains once the load stops
                "tables": {"calls": len(self.calls), "waiting": len(self.gate.waiting),
                           "answered_above_horizon": len(self.answered)},
                **self.counts}

