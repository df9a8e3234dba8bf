"""One operator of a HAMS service graph, as a process: an explicit state machine over the
roles of ``services.graph.roles`` (its module docstring is the table of roles and the
events that move them, to check against HAMS §IV). An interleaving join queues each input
as it arrives; a combining join waits for every predecessor's output of a request and
concatenates them.

Frames in (one PULL, ``endpoint``): ``GraphRequest`` from predecessors, ``GraphState``
(backup, from its primary), ``GraphAck`` and ``GraphDurable`` (primary, from its backup;
backups, from previous stateful models' backups; everyone, from the frontend: replies up
to that origin have left the graph, so saved outputs can go). What each role does with
each, in one place (``GraphOperator.ON``)::

    role          GraphRequest      GraphState   GraphAck                              GraphDurable
    STATELESS     queue             -            successor: resend; mine: number on    GC, upstream takeover
    STANDBY       keep (queue)      -            mine at a newer epoch: promoted       GC
    PRIMARY       queue             -            successor: resend; backup: window     GC, upstream takeover, mine: release
    DEGRADED      queue             -            successor: resend; mine: new backup   GC, upstream takeover, Algorithm 2
    BACKUP        -                 Algorithm 2  successor's, early: kept              GC, upstream takeover, Algorithm 2
    REJOINING     -                 whole state  (as BACKUP)                           (as BACKUP)
    ROLLING_BACK  held until the manager's answer, then handled by the role it gives
    FENCED        -                 -            -                                     GC

The class is put together from one part per piece of the protocol. Objects of their own,
each given what it needs (the role record, the shared tables of ``services.graph.tables``,
the send functions of ``services.graph.links``, the event log) and reading nothing of
another: ``services.graph.batches`` (``batcher``: the batch: compute, number, send or hold,
update, copy) and ``services.graph.backup`` (``backup_side``: Algorithm 2, kept outputs).
Still a mixin: ``services.graph.recovery`` (HAMS II: promotions, fencing, rejoining,
roll-backs, driven by the manager's feed and answers, none waited for in the loop); it
reaches the shared tables through this class's properties (``_shared``).
The ``ls`` baseline's checkpoints are a part of their own
(``services.graph.stash``, held only in that mode); the experiments' padding and delayed
states are ``services.graph.hooks``.

Downstream of a stateful takeover (max_seq at a new epoch, the ``GraphDurable`` the new
primary sends its successors and the next backups): a successor's primary that took an
output above max_seq rolls back; a backup drops pending states that did. Every operator
drops an input whose seq it already took from that sender (resends); the frontend's seqs
are origins, taken per frontend incarnation (several frontends interleave).

Exactly-once effects (docs/design/hams.md): a stateful operator answers an input whose
request key its state applied already from its table (``services.graph.applied``) instead of
applying it again; the table ships with the state and is the backup's as of the state it
applied. An output leaving the graph goes to its request's ``reply_to``; durability notices
go to every frontend (``config.frontends``); the GC horizon is per frontend incarnation.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch
import zmq

from keel.common import tracing, transport
from keel.common.config import GraphOperatorConfig
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest, GraphState
from keel.common.spec.graph import FRONTEND, read_graph
from keel.common.spec.operators import operator_class
from keel.common.spec.modes import MODES
from keel.services.base import Service
from keel.services.graph import hooks
from keel.services.graph import lineage as lin
from keel.services.graph.applied import AppliedRequests
from keel.services.graph.backup import BackupSide
from keel.services.graph.batches import Batches
from keel.services.graph.lineage import source_of
from keel.services.graph.links import Links
from keel.services.graph.recovery import BACKUP_GRACE_S, LEASE_S, Recovery
from keel.services.graph.roles import BACKING, SERVING, OperatorRole, RoleRecord
from keel.services.graph.stash import LineageStash
from keel.services.graph.tables import Serving, Tables
from keel.services.graph.statemgr import StateManager
from keel.services.graph.events import EventLog

__all__ = ["GraphOperator", "source_of", "LEASE_S", "BACKUP_GRACE_S"]

R = OperatorRole

#: a predecessor's batch whose first rows arrived is waited for at most this long (its rows
#: leave in one loop, ~0.1-0.3 ms apart at the most): a sender that died mid-batch stalls nothing
REST_OF_BATCH_S = 0.005


def _shared(table: str, name: str) -> property:
    """``name`` of the shared table ``table`` (``services.graph.tables``), as my attribute."""
    return property(lambda self: getattr(getattr(self, table), name),
                    lambda self, value: setattr(getattr(self, table), name, value))


class GraphOperator(Recovery, Service):
    role = "graph_operator"

    #: each role's handler of each message kind (none: dropped); ROLLING_BACK holds them all
    ON = {
        R.STATELESS: {GraphRequest: "_on_request", GraphAck: "_ack_at_stateless", GraphDurable: "_on_durable"},
        R.STANDBY: {GraphRequest: "_on_request", GraphAck: "_ack_at_standby", GraphDurable: "_on_durable"},
        R.PRIMARY: {GraphRequest: "_on_request", GraphAck: "_ack_at_primary", GraphDurable: "_on_durable"},
        R.DEGRADED: {GraphRequest: "_on_request", GraphAck: "_ack_at_degraded", GraphDurable: "_on_durable"},
        R.BACKUP: {GraphState: "_on_state", GraphAck: "_ack_at_backup", GraphDurable: "_on_durable"},
        R.REJOINING: {GraphState: "_on_state", GraphAck: "_ack_at_backup", GraphDurable: "_on_durable"},
        R.FENCED: {GraphDurable: "_on_durable"},
    }

    def __init__(self, config: GraphOperatorConfig):
        super().__init__(config.name, config.metrics_port)
        self.config = config
        # one torch thread per model here, set by the operator process alone (a spec's reader
        # imports no torch): the loop and the device thread share the host's cores
        torch.set_num_threads(1)
        self.graph = read_graph(config.graph)
        self.spec = self.graph.operators[config.operator]
        self.op = config.operator
        self.mode = MODES[self.graph.mode]
        self.stateful = self.spec.stateful and self.op in self.graph.stateful
        # a backup started at a manager epoch (> the spec's 1) joins a running group whose
        # primary runs degraded: it asks for the primary's whole state (§IV-E)
        joining = config.role == "backup" and config.epoch > 1 and config.manager is not None
        first = {"standby": R.STANDBY, "backup": R.REJOINING if joining else R.BACKUP}.get(
            config.role, R.PRIMARY if self.stateful else R.STATELESS)
        # the one record of my role and epochs (``roles.RoleRecord``): everything else reads it
        self.role_record = RoleRecord(first, config.epoch, on_change=self._role_changed)
        self.deferred: deque = deque()  # what reached a rolling-back primary, handled once it is decided
        self.inbox = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=config.endpoint), self._on_inbox)
        self.serve_status(config.status_endpoint)
        self.peers = transport.Peers(self.ctx, on_new=self.sockets.append)
        # where my messages go (``services.graph.links``): the parts' send functions
        self.links = Links(self.op, self.graph, self.peers, config.peers, config.frontends)
        self.serving = Serving()  # the model, statemgr, queue, seqs and saved outputs: batches and recovery change them
        self.rest_due: dict[str, float] = {}  # predecessor -> until when the rest of its batch is waited for
        # (reply_to, origin) -> predecessor -> its request: origins are unique per frontend only
        self.joining: dict[tuple, dict[str, GraphRequest]] = {}
        self.preds = self.graph.predecessors(self.op)
        self.succs = self.graph.successors(self.op)
        self._shapes = {p: self.graph.input_shape if p == FRONTEND else self.graph.operators[p].output_shape
                        for p in self.preds}
        # shared by the parts (``services.graph.tables``): what my state holds of each source, the
        # requests it applied (a backup: the state it applied; a retry is answered, not applied),
        # each frontend incarnation's released replies
        self.tables = Tables(applied=AppliedRequests() if self.spec.stateful else None)
        self.taken: dict[str, set[int]] | None = None  # after a takeover: inputs taken (resent duplicates dropped)
        self.resend_after: dict[str, tuple[int, int]] = {}  # successor -> (its epoch, my seq it holds)
        self.early_acks: dict[str, tuple[int, int]] = {}  # the same, come while I was still the backup
        self.epochs: dict[str, int] = {}  # operator -> newest epoch of its group seen in the feed
        self.notice_epochs: dict[str, int] = {}  # operator -> newest epoch of its durability notices
        self.fenced = False  # a newer holder of my group existed: I released nothing more at my old epoch
        self.takeovers = 0
        self.took: dict[str, int] = {}  # predecessor -> highest of its seqs taken
        # after a roll-back in place (same inbox: predecessors that have not heard of it keep
        # sending), per predecessor, the seq its resend starts at: a newer input that reaches
        # me first is dropped (it comes again in that resend, in order)
        self.resync: dict[str, int] = {}
        self.took_before: dict[str, dict[str, int]] = {}  # predecessor -> its predecessor -> highest seq on that lineage
        self.numbering = False  # a promoted standby waits for a successor's highest seq before it numbers
        self.holders_seen: set[str] = set()  # who held my group (a joining backup is none of them)
        self.backup_lost = False  # a primary's socket to its backup disconnected (Fig. 6: roll back in place)
        self.relaying = False  # a primary with a joined backup: notices meant for my backup reach me; I pass them on
        self.events = EventLog(config.trace_path)
        if self.events:
            self.every(0.2, self.events.flush)
        # the ls baseline's checkpoints (its own part, called at three points; None in other modes)
        self.stash = LineageStash(self) if self.mode.checkpoints else None
        self.backup_side = BackupSide(self.op, self.preds, self.graph.stateful, self.role_record, self.tables,
                                      self.events, self.log, to_primary=lambda m: self.links.to(self.op, m),
                                      announce=self.links.announce_durable)
        self.standby_for: dict[str, object] = {}  # a standby: operator -> its model, loaded and ready
        if self.role_record.role is R.STANDBY:
            for name, spec in self.graph.operators.items():
                if spec.kind == self.spec.kind:
                    self.standby_for[name] = self._new_model(spec)
        elif self.role_record.role in BACKING:
            self.backup_side.start(self.role_record.epoch)
        else:
            self.model = self._new_model(self.spec)
            if self.model.stateful:
                self.model.start()
            if self.stateful:
                self.statemgr = self._new_statemgr(config.peers[f"{self.op}.backup"])
        self.batcher = Batches(self.op, self.spec, self.mode, self.stateful, self.preds, self.succs, self.role_record,
                               self.serving, self.tables, self.links, self.events, self.log, self.stash,
                               notify=self.backup_side.notify, leased=self.leased,
                               inbox_waiting=lambda: bool(self.inbox.poll(0)))
        # a long batch computes on the device thread while the loop serves (``services.graph.batches``)
        device_fd = self.batcher.open_device()
        self.poller.register(device_fd, zmq.POLLIN)
        self.handlers[device_fd] = self.batcher.on_device_done
        hooks.install(self)
        self.manager = None
        if config.manager is not None:
            self._link_manager()
            if self.statemgr is not None:
                self._watch_backup()

    # the shared tables, read and written by recovery (still a mixin) and the ls stash
    consumed, applied = _shared("tables", "consumed"), _shared("tables", "applied")
    model, statemgr, own = _shared("serving", "model"), _shared("serving", "statemgr"), _shared("serving", "own")
    queue, next_seq, awaiting = _shared("serving", "queue"), _shared("serving", "next_seq"), _shared("serving", "awaiting")
    outputs, held = _shared("serving", "outputs"), _shared("serving", "held")

    # --- the state machine -------------------------------------------------------------------
    def _role_changed(self, event: str, before: OperatorRole, after: OperatorRole) -> None:
        """Every move of my role record (``RoleRecord.become``), in the event log."""
        if self.events:
            self.events.write("role", operator=self.op, event=event, before=before.value, role=after.value)

    def _replay_deferred(self) -> None:
        """What reached me while I rolled back, handled now by the role the manager gave me."""
        while self.deferred and self.role_record.role is not R.ROLLING_BACK:
            self.deferred.popleft()()

    def _on_inbox(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if self.role_record.role is R.ROLLING_BACK:
            self.deferred.append(lambda: self._dispatch(msg))
            return
        name = self.ON[self.role_record.role].get(type(msg))
        if name is not None:
            getattr(self, name)(msg)

    # --- GraphAck, per role ----------------------------------------------------------------
    def _ack_at_standby(self, msg: GraphAck) -> None:
        if msg.operator == self.op and msg.epoch > self.role_record.newest:
            # Addressed to the group's new holder: a successor read my promotion in the feed
            # before I did. Dropping its word left me waiting to number for ever.
            self._on_role(self.member, msg.epoch)
            if self.role_record.role is R.STATELESS:
                self._ack_at_stateless(msg)

    def _ack_at_stateless(self, msg: GraphAck) -> None:
        if msg.operator == self.op and self.numbering:
            self.next_seq = max(self.next_seq, msg.seq + 1)  # a successor's highest: number on from there
            self.numbering = False  # one successor's word (several successors: not yet: docs/design/hams.md, Limits)
        elif msg.operator in self.succs:
            self._on_successor_ack(msg.operator, msg.epoch, msg.seq)

    def _ack_at_primary(self, msg: GraphAck) -> None:
        if msg.operator in self.succs:
            self._on_successor_ack(msg.operator, msg.epoch, msg.seq)
        elif msg.operator == self.op and self.statemgr is not None and self.role_record.current(msg.epoch):
            self.statemgr.on_ack(msg.seq)  # my backup has state msg.seq: the window moves
            self.batcher.release_held(msg.seq)

    def _ack_at_degraded(self, msg: GraphAck) -> None:
        if msg.operator in self.succs:
            self._on_successor_ack(msg.operator, msg.epoch, msg.seq)
        elif msg.operator == self.op and self.role_record.current(msg.epoch):
            self._bring_up_backup()  # a member joined my group and asks for my whole state

    def _ack_at_backup(self, msg: GraphAck) -> None:
        if msg.operator in self.succs:
            # a successor and I failed together, and its takeover's ack reached me before my
            # own promotion did: kept for it (dropped, I waited for it for ever: nothing went on)
            self.early_acks[msg.operator] = (msg.epoch, msg.seq)

    # --- GraphDurable ---------------------------------------------------------------------
    def _on_durable(self, msg: GraphDurable) -> None:
        if self.relaying and msg.operator != self.op:  # others send my backup's notices to the holder: pass them on
            self.links.to(f"{self.op}.backup", msg)
        if msg.epoch > self.notice_epochs.get(msg.operator, 1) and msg.operator != self.op:  # 1: the spec's epoch
            self.notice_epochs[msg.operator] = msg.epoch  # a takeover upstream, its state up to msg.seq
            if self.role_record.role in BACKING:
                self.backup_side.forget_after(msg.operator, msg.seq)
            elif msg.operator in self.preds and self.role_record.role in SERVING and self.took.get(msg.operator, -1) > msg.seq:
                self._roll_back(msg.operator, msg.seq)
                return
        if msg.operator == FRONTEND:
            self._on_released(msg.seq)
        elif self.role_record.role in BACKING:
            self.backup_side.on_notify(msg.operator, msg.seq)
        elif self.role_record.role is R.DEGRADED and msg.operator != self.op:
            self.backup_side.notify(self.own.on_notify(msg.operator, msg.seq))
        elif self.role_record.role is R.PRIMARY and self.statemgr is not None and msg.operator == self.op \
                and self.role_record.current(msg.epoch):
            self.statemgr.on_durable(msg.seq)
            self.batcher.release_held(msg.seq)  # durable implies delivered (S1, Remus hold outputs until then)

    def _on_released(self, seq: int) -> None:
        """The frontend's notice: replies up to origin ``seq`` left the graph (GC)."""
        if seq < 0:
            return  # nothing left yet
        released = self.tables.released
        released.note(seq)  # a frontend's notice frees only its own origins
        stashed = self.stash.stashed() if self.stash is not None else None  # ls: kept until a successor checkpoints
        for s in [s for s, m in self.outputs.items() if released.covers(m.origin) and (stashed is None or s <= stashed)]:
            del self.outputs[s]  # its reply left the graph: no resend will need it
        self.backup_side.forget_released(stashed)
        for key in [k for k in self.joining if released.covers(k[1])]:
            del self.joining[key]  # answered already (another branch's error): the join never completes

    def _new_model(self, spec):
        """A fresh model of ``spec`` (an ``OperatorSpec``): this process's, or a standby's
        (padded to the spec's service time where an experiment asks for one)."""
        model = operator_class(spec.kind)(spec.input_shape, spec.output_shape, seed=self.config.seed, **spec.options)
        return hooks.padded(model, spec)

    def _new_statemgr(self, backup_endpoint: str) -> StateManager:
        """A primary's statemgr, shipping to whichever endpoint my backup has at the time."""
        return StateManager(self.op, self.role_record.epoch, self.graph.window, self.mode.copy_in_background,
                            send=lambda st: self.links.to(f"{self.op}.backup", st),
                            ctx=self.ctx, backup_endpoint=backup_endpoint)

    # --- messages -------------------------------------------------------------------
    def _on_state(self, msg: GraphState) -> None:
        self.backup_side.on_state(msg)  # (hooks.LateStates may hold it first)

    def _on_request(self, msg: GraphRequest) -> None:
        # a standby keeps what reaches it: it is addressed as the new holder by a peer that read
        # its promotion first (the frontend's resend); it computes once its own promotion arrives
        if msg.sender not in self.preds or tuple(msg.input.shape) != self._shapes[msg.sender]:
            self.log.error("dropped a request that is not from a predecessor or has the wrong shape",
                           sender=msg.sender[:64], shape=list(msg.input.shape))
            return  # a stray peer must not poison a batch of others' requests
        if msg.traceparent is not None and tracing.ON:
            tracing.operator_received(self.op, msg)
        if msg.more:  # its batch goes on: the first row of it sets how long the rest is waited for
            now = time.monotonic()
            if self.rest_due.get(msg.sender, 0.0) < now:
                self.rest_due[msg.sender] = now + REST_OF_BATCH_S
        else:
            self.rest_due.pop(msg.sender, None)
        source = source_of(msg.sender, msg.seq)
        if msg.seq <= self.took.get(source, -1) and self.taken is None:
            return  # a resent input taken already (each source's seqs arrive in order, resends aside)
        if source in self.resync:
            if msg.seq > self.resync[source]:
                return  # sent before the sender heard of my roll-back: its resend carries it, in order
            if msg.seq == self.resync[source]:
                del self.resync[source]  # the resend (or the next new input) arrived: in order again
        if msg.lineage:  # for a predecessor's replacement (_report_taken, _roll_back)
            self.took[source] = max(msg.seq, self.took.get(source, -1))
            entry, before = msg.lineage[-1], self.took_before.setdefault(source, {})
            came_from = source_of(entry.predecessor, entry.predecessor_seq)
            before[came_from] = max(before.get(came_from, -1), entry.predecessor_seq)
        if self.taken is not None:  # after a takeover predecessors resend: each input once
            taken = self.taken.setdefault(source, set())
            if msg.seq <= self.consumed.get(source, -1) or msg.seq in taken:
                return
            taken.add(msg.seq)
        if len(self.preds) == 1 or self.spec.join == "interleave":
            self.queue.append(msg)  # interleaving: inputs batch in arrival order (HAMS S1 non-determinism)
            return
        parts = self.joining.setdefault((msg.reply_to, msg.origin), {})
        parts[msg.sender] = msg
        if len(parts) == len(self.preds):  # combine: every input of this origin arrived
            del self.joining[msg.reply_to, msg.origin]
            ins = [parts[p] for p in self.preds]
            lineage = lin.join([m.lineage for m in ins])
            lineage += [lin.LineageEntry(m.sender, m.seq, "?", -1) for m in ins[1:]]  # numbered in step()
            self.queue.append(GraphRequest(ins[0].sender, ins[0].seq, msg.origin, msg.stream, lineage,
                                           np.concatenate([m.input for m in ins], axis=-1),
                                           degraded=True if any(m.degraded for m in ins) else None,
                                           request=msg.request, reply_to=msg.reply_to))

    # --- the batch loop ---------------------------------------------------------------
    def tick(self, timeout: float | None = None) -> None:
        def can_step(rest_s: float) -> bool:
            return bool(self.queue) and self.role_record.role in SERVING and not self.numbering and self.leased() \
                and self.batcher.idle() and not rest_s

        if timeout is None:
            rest_s = self._rest_of_batch_s()
            if can_step(rest_s):
                timeout = 0
            elif self.queue and rest_s:
                timeout = min(self.next_timeout(), rest_s)  # the rest arrives, or the wait ends
        super().tick(timeout)
        self.batcher.after_poll(self._guarded, lambda: can_step(self._rest_of_batch_s()))

    def _rest_of_batch_s(self) -> float:
        """How long the next batch still waits for the rest of a predecessor's batch: a
        batch of a predecessor's (its rows arrive one message each) is taken whole, not in
        a fragment that would leave its rest a whole batch time behind, and keep the two
        operators' batches a batch apart from then on (50 ms chains measured it). 0: none
        open, or a batch's worth queued already."""
        if not self.rest_due or len(self.queue) >= self.spec.max_batch:
            return 0.0
        return max(0.0, max(self.rest_due.values()) - time.monotonic())

    def status(self) -> dict:
        info = super().status()
        info.update(operator=self.op, mode=self.graph.mode, assignment=self.role_record.assignment, epoch=self.role_record.epoch,
                    hams_role=self.role_record.role.value, degraded=self.role_record.role is R.DEGRADED, takeovers=self.takeovers, fenced=self.fenced,
                    queued=len(self.queue),  # applied_requests: bounded by count and age, not by replies leaving
                    applied_requests=len(self.applied) if self.applied is not None else None,
                    saved_outputs=len(self.outputs), **self.batcher.status(),
                    tables={"queue": len(self.queue), "outputs": len(self.outputs), "held": len(self.held),
                            "joining": len(self.joining)})  # state GC: each drains once replies left
        if self.statemgr is not None:
            info["tables"].update(saved_states=len(self.statemgr.saved), in_flight=len(self.statemgr.in_flight))
            info.update(saved_states=len(self.statemgr.saved), in_flight=len(self.statemgr.in_flight),
                        durable_seq=self.statemgr.durable_seq, copy_ms=self.statemgr.copy_ms,
                        copy_ms_mean=1000 * self.statemgr.copy_s / max(1, info["batches"]),
                        handoff_ms=self.statemgr.handoff_ms, copies=self.statemgr.copies,
                        copies_in_background=self.statemgr.in_background)
        if self.standby_for:
            info.update(standby_for=sorted(self.standby_for), ready=True)
        if self.manager is not None:
            info.update(heartbeats=self.manager.beats, manager_requests=sorted(self.manager.pending))
        if self.backup_side.backing:
            backing = self.backup_side.status()
            info["tables"].update(pending_states=backing["pending_states"])
            info.update(backing)
        return info

    def drain(self) -> None:
        self.batcher.close()
        if self.manager is not None:
            self.manager.close()
        if self.statemgr is not None:
            self.statemgr.close()
        self.events.close()
