"""The frontend of a HAMS service graph: its entry and exit, and its last stateful node
(§IV-D).

A client's ``Predict`` (ROUTER, ``client_endpoint``) gets the next sequence number (its
*origin*) and goes to the operators the frontend feeds. The graph's output comes back on
``endpoint``; its reply is held (``services.requests`` HELD) until every stateful state on
its lineage is durable (``ReleaseGate``: the backups' ``GraphDurable`` notices), so no
client sees an output that a failure could contradict. A stateless-only graph (or mode
bare or strawman: no state reaches a backup) holds nothing. Every request gets one answer: its output, or an error that says
why (bad input, overloaded, an operator's model error, timed out in the graph).

Behind an interleaving join a request has several outputs (``replies_per_origin``): the
frontend waits for all of them, answers with the one the last operator numbered last (it
saw every input of the request) and holds it until the lineages of all are durable.

Every 50 ms it tells the operators (and backups) the highest origin up to which every
reply has left, so their saved outputs can be freed (state GC).

HAMS II: a ``GraphDurable`` at a newer epoch than the operator's last is a promoted
backup's word that its state is durable up to ``seq`` (max_seq): held outputs whose
lineage has a larger seq of that operator came from the failed primary and can never be
durable; they are dropped and their requests wait again for the re-run's output. With a
manager the frontend follows each group's holder in the change feed (where inputs and GC
notices go). It keeps each input until answered: when an operator it feeds was taken over,
a ``GraphAck`` (from the new primary, or from the failed stateless operator's successor)
names the highest origin the operator's state or successors hold, and the frontend resends
the waiting requests above it, in origin order (new requests for it wait until then).
"""
from __future__ import annotations

import time

import numpy as np
import zmq

from keel.common import transport
from keel.common.config import GraphFrontendConfig
from keel.common.protocol.fields import ErrorCode, request_key
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest, Predict, Reply, Status
from keel.common.spec.graph import FRONTEND, read_graph
from keel.common.spec.modes import MODES
from keel.services.base import Service
from keel.services.graph.lineage import ReleaseGate, join
from keel.services.graph.trace import Trace
from keel.services.requests import Request, State


class GraphFrontend(Service):
    role = "graph_frontend"

    def __init__(self, config: GraphFrontendConfig):
        super().__init__(config.name, config.metrics_port)
        self.config = config
        self.graph = read_graph(config.graph)
        self.clients = self.add_socket(transport.make_socket(self.ctx, zmq.ROUTER, bind=config.client_endpoint),
                                       self._on_client)
        self.inbox = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=config.endpoint), self._on_inbox)
        self.peers = transport.Peers(self.ctx, on_new=self.sockets.append)
        self.gate = ReleaseGate(self.graph.stateful if MODES[self.graph.mode].ships_state else ())
        self.next_origin = 0
        self.requests: dict[int, Request] = {}  # origin -> request in the graph
        self.outputs: dict[int, np.ndarray] = {}  # origin -> held output
        self.arriving: dict[int, dict[int, GraphRequest]] = {}  # origin -> seq -> output, until all arrived
        self.expect = self.graph.replies_per_origin
        self.held_since: dict[int, float] = {}  # origin -> when its output arrived and was held
        self.hold_s = 0.0  # total time held replies waited for durability (what NSPB costs a reply)
        self.answered_below = 0  # every origin < this is answered
        self.announced_below = 0
        self.answered: set[int] = set()
        self.counts = {"answered": 0, "held": 0, "errors": 0}
        self.every(0.05, self._chores)
        self.trace = Trace(config.trace_path)
        self.lineages: dict[int, list] = {}  # origin -> lineage of its held reply (traced at release)
        self.epochs: dict[str, int] = {}  # stateful operator -> newest epoch of its durability notices
        self.group_epochs: dict[str, int] = {}  # operator -> newest epoch of its group in the manager's feed
        self.voided = 0  # held outputs dropped because their primary failed before they were durable
        self.inputs: dict[int, GraphRequest] = {}  # origin -> what went into the graph, until answered (resend)
        self.awaiting: set[str] = set()  # operators I feed that were taken over: their ack is awaited
        self.resent = 0
        self.resend_after: dict[str, tuple[int, int]] = {}  # operator -> (its new epoch, origin it holds up to)
        self.degraded: set[int] = set()  # origins whose output a primary without a backup computed (Reply.degraded)
        self.counts["degraded"] = 0
        if self.link_manager(config.manager, on_change=self._on_manager_change):
            for key, value in list(self.manager.feed.values.items()):
                self._on_manager_change(key, value)

    def _on_manager_change(self, key: str, value: dict | None) -> None:
        if self.manager is not None and key.startswith("group/graph/") and value and value.get("holder"):
            svc = self.manager.feed.values.get(f"service/{value['holder']}") or {}
            endpoint = (svc.get("endpoints") or {}).get("inbox")
            op = key[len("group/graph/"):]
            if endpoint and value.get("epoch", 0) > self.group_epochs.get(op, 0):
                if op in self.group_epochs and op in self.graph.successors(FRONTEND):
                    self.awaiting.add(op)  # a takeover: resend in origin order once its ack says from where
                if op in self.group_epochs and op in self.graph.stateful:
                    self.config.peers[f"{op}.backup"] = endpoint  # GC notices: the new primary passes them on
                self.group_epochs[op] = value.get("epoch", 0)
                self.config.peers[op] = endpoint
                pending = self.resend_after.get(op)
                if pending is not None and pending[0] <= self.group_epochs[op]:
                    del self.resend_after[op]
                    self._resend(op, pending[1])

    def _reply(self, envelope, reply: Reply) -> None:
        transport.try_send(self.clients, reply, envelope)

    def _on_client(self, sock: zmq.Socket) -> None:
        for envelope, msg in self.messages(sock, router=True):
            if not isinstance(msg, Predict):
                if isinstance(msg, Status):
                    self._reply_status(envelope)
                continue
            shape = tuple(self.graph.input_shape)
            if tuple(msg.input.shape) != shape:
                self.counts["errors"] += 1
                self._reply(envelope, Reply(msg.request_id, "error", error=f"input shape {list(msg.input.shape)} is not "
                                            f"the graph's {list(shape)}", error_code="bad_request"))
                continue
            if len(self.requests) >= self.config.admission_limit:
                self.counts["errors"] += 1
                self._reply(envelope, Reply(msg.request_id, "error", error="graph is full", error_code="overloaded"))
                continue
            origin, self.next_origin = self.next_origin, self.next_origin + 1
            req = Request(envelope, msg.request_id, time.monotonic())
            req.to(State.WAITING)
            self.requests[origin] = req
            client = msg.client if msg.client is not None else bytes(envelope[0]).hex()  # anonymous: its connection
            out = self.inputs[origin] = GraphRequest(FRONTEND, origin, origin, msg.stream or 0, [], msg.input,
                                                     request=request_key(client, msg.request_id),
                                                     reply_to=self.config.endpoint)
            for op in self.graph.successors(FRONTEND):
                if op not in self.awaiting:
                    self.peers.send(self.config.peers[op], out)

    def _reply_status(self, envelope) -> None:
        transport.try_send(self.clients, Status(service=self.name, info=self.status()), envelope)

    def _on_inbox(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            if isinstance(msg, GraphRequest):
                req = self.requests.get(msg.origin)
                if req is None or req.state != State.WAITING:
                    continue  # a duplicate, or a request already answered with an error
                if msg.error is not None:  # an operator's model failed on it: no output to hold
                    self.arriving.pop(msg.origin, None)
                    self._answer(msg.origin, Reply(req.request_id, "error", error=msg.error,
                                                           error_code=ErrorCode.MODEL_ERROR))
                    continue
                parts = self.arriving.setdefault(msg.origin, {})
                parts[msg.seq] = msg
                if len(parts) < self.expect:
                    continue
                del self.arriving[msg.origin]
                output = parts[max(parts)].input
                if any(m.degraded for m in parts.values()):
                    self.degraded.add(msg.origin)
                else:
                    self.degraded.discard(msg.origin)  # a re-run after a void: its own word
                lineage = join(m.lineage for m in parts.values())
                self.lineages[msg.origin] = lineage
                if self.gate.hold(msg.origin, lineage):
                    req.to(State.HELD)
                    self.outputs[msg.origin] = output
                    self.held_since[msg.origin] = time.perf_counter()
                    self.counts["held"] += 1
                else:
                    self._answer(msg.origin, Reply(req.request_id, "model", output=output))
            elif isinstance(msg, GraphAck) and msg.operator in self.graph.successors(FRONTEND):
                if self.manager is not None and msg.epoch > self.group_epochs.get(msg.operator, 0):
                    self.resend_after[msg.operator] = (msg.epoch, msg.seq)  # once the feed says where it is
                else:
                    self._resend(msg.operator, msg.seq)
            elif isinstance(msg, GraphDurable):
                if msg.epoch < self.epochs.get(msg.operator, 1):
                    continue  # an older incarnation's word (a backup whose primary rolled back in place)
                if msg.epoch > self.epochs.get(msg.operator, 1):  # 1: the spec's epoch (HAMS I)
                    self._void(msg.operator, msg.epoch, msg.seq)
                for origin in self.gate.on_notify(msg.operator, msg.seq):
                    req = self.requests.get(origin)
                    if req is not None:
                        self._answer(origin, Reply(req.request_id, "model", output=self.outputs.pop(origin)))

    def _resend(self, op: str, after: int) -> None:
        """``op`` was taken over and holds origins up to ``after``: resend the waiting rest, in order."""
        self.awaiting.discard(op)
        for origin in sorted(o for o, r in self.requests.items() if o > after and r.state == State.WAITING):
            self.peers.send(self.config.peers[op], self.inputs[origin])
            self.resent += 1

    def _void(self, operator: str, epoch: int, max_seq: int) -> None:
        """``operator``'s backup took over with its state up to ``max_seq``: held outputs
        beyond it depend on a state that died with the primary; wait for the re-run."""
        self.epochs[operator] = epoch
        for origin, lineage in list(self.gate.waiting.items()):
            if any(e.operator == operator and e.seq > max_seq for e in lineage):
                del self.gate.waiting[origin]
                self.outputs.pop(origin, None)
                self.lineages.pop(origin, None)
                self.held_since.pop(origin, None)
                old = self.requests[origin]
                req = self.requests[origin] = Request(old.envelope, old.request_id, old.start)
                req.to(State.WAITING)
                self.voided += 1

    def _answer(self, origin: int, reply: Reply) -> None:
        held = self.held_since.pop(origin, None)
        if held is not None:
            self.hold_s += time.perf_counter() - held
        req = self.requests.pop(origin)
        self.inputs.pop(origin, None)
        if origin in self.degraded:
            self.degraded.discard(origin)
            if reply.error is None:
                reply.degraded = True
                self.counts["degraded"] += 1
        req.to(State.ANSWERED)
        lineage = self.lineages.pop(origin, None)
        if self.trace and reply.error is None:
            self.trace.write("release", origin=origin, lineage=[e.to_json() for e in lineage])
        self._reply(req.envelope, reply)
        self.counts["answered" if reply.error is None else "errors"] += 1
        self.answered.add(origin)
        while self.answered_below in self.answered:
            self.answered.discard(self.answered_below)
            self.answered_below += 1

    def _chores(self, now: float) -> None:
        horizon = now - self.config.request_timeout_s
        for origin in [o for o, r in self.requests.items() if r.start < horizon]:
            self.outputs.pop(origin, None)
            self.arriving.pop(origin, None)
            self.lineages.pop(origin, None)
            self.gate.waiting.pop(origin, None)
            req = self.requests[origin]
            self._answer(origin, Reply(req.request_id, "error", error=f"no durable answer within "
                                       f"{self.config.request_timeout_s} s ({req.state})", error_code="timeout"))
        self.trace.flush()
        if self.answered_below > self.announced_below:  # GC notice, only when it moved
            self.announced_below = self.answered_below
            note = GraphDurable(FRONTEND, 1, self.answered_below - 1)
            for op in [*self.graph.operators, *(f"{n}.backup" for n in self.graph.stateful)]:
                if op in self.config.peers:
                    self.peers.send(self.config.peers[op], note)

    def status(self) -> dict:
        info = super().status()
        info.update(mode=self.graph.mode, operators=list(self.graph.order), stateful=sorted(self.graph.stateful),
                    hold_ms_mean=1000 * self.hold_s / max(1, self.counts["held"]), voided=self.voided, resent=self.resent,
                    in_graph=len(self.requests), held_now=len(self.gate.waiting), durable=dict(self.gate.durable.seqs),
                    tables={"requests": len(self.requests), "outputs": len(self.outputs), "arriving": len(self.arriving),
                            "lineages": len(self.lineages), "waiting": len(self.gate.waiting), "inputs": len(self.inputs),
                            "held_since": len(self.held_since),
                            "answered_above_horizon": len(self.answered)},  # state GC: each drains
                    **self.counts)
        return info

    def drain(self) -> None:
        if self.manager is not None:
            self.manager.close()
        self.trace.close()
