"""One operator of a HAMS service graph, as a process: an explicit state machine over the
roles of ``services.graph.roles`` (its module docstring is the table of roles and the
events that move them, to check against HAMS §IV). An interleaving join queues each input
as it arrives; a combining join waits for every predecessor's output of a request and
concatenates them.

Frames in (one PULL, ``endpoint``): ``GraphRequest`` from predecessors, ``GraphState``
(backup, from its primary), ``GraphAck`` and ``GraphDurable`` (primary, from its backup;
backups, from previous stateful models' backups; everyone, from the frontend: replies up
to that origin have left the graph, so saved outputs can go). What each role does with
each, in one place (``GraphOperator.ON``, naming this class's handlers and its parts')::

    role          GraphRequest      GraphState   GraphAck                              GraphDurable
    STATELESS     queue             -            successor: resend; mine: number on    GC, upstream takeover
    STANDBY       keep (queue)      -            mine at a newer epoch: promoted       GC
    PRIMARY       queue             -            successor: resend; backup: window     GC, upstream takeover, mine: release
    DEGRADED      queue             -            successor: resend; mine: new backup   GC, upstream takeover, Algorithm 2
    BACKUP        -                 Algorithm 2  successor's, early: kept              GC, upstream takeover, Algorithm 2
    REJOINING     -                 whole state  (as BACKUP)                           (as BACKUP)
    ROLLING_BACK  held until the manager's answer, then handled by the role it gives
    FENCED        -                 -            -                                     GC

The class wires one part per piece of the protocol: objects of their own, each given what
it needs (the role record, the shared tables of ``services.graph.tables``, the send
functions of ``services.graph.links``, the event log, the clock of the loop's timers) and
reading nothing of another: ``services.graph.batches`` (``batcher``: the batch: compute,
number, send or hold, update, copy), ``services.graph.backup`` (``backup_side``: Algorithm
2, kept outputs), ``services.graph.recovery`` (``recovery``: HAMS II: promotions, fencing,
rejoining, resends, driven by the manager's feed and answers, none waited for in the loop)
and ``services.graph.rollback`` (``rollback``: Fig. 6's roll-backs). What the inbox takes
and recovery resets is the shared ``Inputs`` table. The ``ls`` baseline's checkpoints are a
part of their own (``services.graph.stash``, held only in that mode); the experiments'
padding and delayed states are ``services.graph.hooks``.

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
from operator import attrgetter

import numpy as np
import torch
import zmq

from keel.common import tracing, transport
from keel.common.config import GraphOperatorConfig
from keel.common.protocol.fields import MAX_PAYLOAD_BYTES
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
from keel.services.graph.recovery import LEASE_S, Recovery
from keel.services.graph.rollback import BACKUP_GRACE_S, RollBack
from keel.services.graph.roles import BACKING, SERVING, OperatorRole, RoleRecord
from keel.services.graph.stash import LineageStash
from keel.services.graph.tables import Inputs, Serving, Tables
from keel.services.graph.statemgr import StateManager
from keel.services.graph.events import EventLog

__all__ = ["GraphOperator", "source_of", "LEASE_S", "BACKUP_GRACE_S"]

R = OperatorRole

#: a predecessor's batch whose first rows arrived is waited for at most this long (its rows
#: leave in one loop, ~0.1-0.3 ms apart at the most): a sender that died mid-batch stalls nothing
REST_OF_BATCH_S = 0.005
#: the largest state a primary ships: one message's payload less a MiB for the inputs of the
#: batch and the lineage it carries beside the state (``statemgr.pack``)
STATE_MAX_BYTES = MAX_PAYLOAD_BYTES - (1 << 20)


class GraphOperator(Service):
    role = "graph_operator"

    #: each role's handler of each message kind (none: dropped; ``recovery.``: that part's);
    #: ROLLING_BACK holds them all
    ON = {
        R.STATELESS: {GraphRequest: "_on_request", GraphAck: "recovery.ack_at_stateless", GraphDurable: "_on_durable"},
        R.STANDBY: {GraphRequest: "_on_request", GraphAck: "recovery.ack_at_standby", GraphDurable: "_on_durable"},
        R.PRIMARY: {GraphRequest: "_on_request", GraphAck: "_ack_at_primary", GraphDurable: "_on_durable"},
        R.DEGRADED: {GraphRequest: "_on_request", GraphAck: "recovery.ack_at_degraded", GraphDurable: "_on_durable"},
        R.BACKUP: {GraphState: "_on_state", GraphAck: "recovery.ack_at_backup", GraphDurable: "_on_durable"},
        R.REJOINING: {GraphState: "_on_state", GraphAck: "recovery.ack_at_backup", GraphDurable: "_on_durable"},
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
        self.inbox = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=config.endpoint), self._on_inbox)
        self.serve_status(config.status_endpoint)
        self.peers = transport.Peers(self.ctx, on_new=self.sockets.append)
        # where my messages go (``services.graph.links``): the parts' send functions
        self.links = Links(self.op, self.graph, self.peers, config.peers, config.frontends)
        self.serving = Serving()  # the model, statemgr, queue, seqs and saved outputs: batches and recovery change them
        self.rest_due: dict[str, float] = {}  # predecessor -> until when the rest of its batch is waited for
        self.inputs = Inputs()  # what my inbox took of each source: recovery reads and resets it
        self.preds = self.graph.predecessors(self.op)
        self.succs = self.graph.successors(self.op)
        self._shapes = {p: self.graph.input_shape if p == FRONTEND else self.graph.operators[p].output_shape
                        for p in self.preds}
        # shared by the parts (``services.graph.tables``): what my state holds of each source, the
        # requests it applied (a backup: the state it applied; a retry is answered, not applied),
        # each frontend incarnation's released replies
        self.tables = Tables(applied=AppliedRequests() if self.spec.stateful else None)
        self.events = EventLog(config.trace_path)
        if self.events:
            self.every(0.2, self.events.flush)
        # the ls baseline's checkpoints (its own part, called at three points; None in other modes)
        self.stash = LineageStash(self.op, self.graph, self.role_record, self.serving, self.tables, self.events,
                                  recovered=lambda: self.recovery.takeovers > 0) if self.mode.checkpoints else None
        self.backup_side = BackupSide(self.op, self.preds, self.graph.stateful, self.role_record, self.tables,
                                      self.events, self.log, to_primary=lambda m: self.links.to(self.op, m),
                                      announce=self.links.announce_durable)
        # what reaches the backup roles' GraphState handler (late, where an experiment asks for it)
        self.take_state = hooks.state_handler(self.spec, self.backup_side.on_state,
                                              lambda: self.backup_side.backing, self.every)
        standby_for = {}  # a standby (a backup): operator -> its model, loaded and ready
        if self.role_record.role is R.STANDBY:
            for name, spec in self.graph.operators.items():
                if spec.kind == self.spec.kind:
                    standby_for[name] = self._new_model(spec)
        elif self.role_record.role in BACKING:
            self.backup_side.start(self.role_record.epoch)
            standby_for[self.op] = self._new_model(self.spec)  # a hot backup: built now, not at its promotion
        else:
            self.serving.model = self._new_model(self.spec)
            if self.serving.model.stateful:
                self.serving.model.start()
                if self.mode.ships_state:
                    self._check_state_fits()
            if self.stateful:
                self.serving.statemgr = self._new_statemgr(config.peers[f"{self.op}.backup"])
        # HAMS II (``services.graph.recovery``, ``services.graph.rollback``): each told of the other
        # through the functions given here; both void the batch computing when they drop a state
        def drop_computing() -> None:
            self.batcher.drop_computing()  # made below, after the lease it is given
        self.rollback = RollBack(self.op, self.spec, self.preds, self.graph.stateful, self.mode.ships_state,
                                 self.role_record, self.serving, self.tables, self.inputs, self.links, self.events,
                                 self.log, self._new_model, drop_computing, member=lambda: self.recovery.member,
                                 group_epoch=lambda: self.recovery.group_epoch(),
                                 on_decided=lambda rolled_back: self.recovery.on_decided(rolled_back),
                                 peers=self.peers, endpoints=config.peers, every=self.every, add_socket=self.add_socket)
        self.recovery = Recovery(self.op, self.name, self.graph, self.stateful, self.role_record, self.serving,
                                 self.tables, self.inputs, self.links, config.peers, self.peers, self.backup_side,
                                 self.stash, self.events, self.log, self._new_model, self._new_statemgr,
                                 drop_computing, self.rollback.roll_back, standby_for, self.every)
        self.batcher = Batches(self.op, self.spec, self.mode, self.stateful, self.preds, self.succs, self.role_record,
                               self.serving, self.tables, self.links, self.events, self.log, self.stash,
                               notify=self.backup_side.notify, leased=self.recovery.leased,
                               inbox_waiting=lambda: bool(self.inbox.poll(0)))
        # a long batch computes on the device thread while the loop serves (``services.graph.batches``)
        device_fd = self.batcher.open_device()
        self.poller.register(device_fd, zmq.POLLIN)
        self.handlers[device_fd] = self.batcher.on_device_done
        self.manager = None
        if config.manager is not None:
            self._link_manager()
            if self.serving.statemgr is not None:
                self.rollback.watch_backup()

    def _link_manager(self) -> None:
        """The manager's link, its feed and answers to recovery (the parts that act on them)."""
        role = self.role_record.role
        me = None
        if self.stateful or role in BACKING or role in (R.STATELESS, R.STANDBY):
            me = {"name": self.name, "group": f"graph/{self.op}", "host": "local", "endpoints": {"inbox": self.config.endpoint}}
        primary_first = role in BACKING or role is R.STANDBY  # the spec's primary takes the role first
        self.link_manager(self.config.manager, on_change=self.recovery.on_manager_change, me=me,
                          on_role=self.recovery.on_role, ready=lambda: self.role_record.role is not R.REJOINING,
                          may_register=lambda: not primary_first or self.manager.holder(f"graph/{self.op}")[0])
        self.rollback.link(self.manager)
        self.recovery.link(self.manager)

    # --- the state machine -------------------------------------------------------------------
    def _role_changed(self, event: str, before: OperatorRole, after: OperatorRole) -> None:
        """Every move of my role record (``RoleRecord.become``), in the event log."""
        if self.events:
            self.events.write("role", operator=self.op, event=event, before=before.value, role=after.value)

    def _on_inbox(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if self.role_record.role is R.ROLLING_BACK:
            self.recovery.defer(lambda: self._dispatch(msg))
            return
        name = self.ON[self.role_record.role].get(type(msg))
        if name is not None:
            attrgetter(name)(self)(msg)

    # --- GraphAck and GraphDurable: what recovery leaves to the batch's window and to GC --------
    def _ack_at_primary(self, msg: GraphAck) -> None:
        if msg.operator in self.succs:
            self.recovery.on_successor_ack(msg.operator, msg.epoch, msg.seq)
        elif msg.operator == self.op and self.serving.statemgr is not None and self.role_record.current(msg.epoch):
            self.serving.statemgr.on_ack(msg.seq)  # my backup has state msg.seq: the window moves
            self.batcher.release_held(msg.seq)

    def _on_durable(self, msg: GraphDurable) -> None:
        if self.recovery.on_notice(msg):  # relayed to a joined backup; a takeover upstream rolled me back
            return
        if msg.operator == FRONTEND:
            self._on_released(msg.seq)
        elif self.role_record.role in BACKING:
            self.backup_side.on_notify(msg.operator, msg.seq)
        elif self.role_record.role is R.DEGRADED and msg.operator != self.op:
            self.backup_side.notify(self.serving.own.on_notify(msg.operator, msg.seq))
        elif self.role_record.role is R.PRIMARY and self.serving.statemgr is not None and msg.operator == self.op \
                and self.role_record.current(msg.epoch):
            self.serving.statemgr.on_durable(msg.seq)
            self.batcher.release_held(msg.seq)  # durable implies delivered (S1, Remus hold outputs until then)

    def _on_released(self, seq: int) -> None:
        """The frontend's notice: replies up to origin ``seq`` left the graph (GC)."""
        if seq < 0:
            return  # nothing left yet
        released = self.tables.released
        released.note(seq)  # a frontend's notice frees only its own origins
        stashed = self.stash.stashed() if self.stash is not None else None  # ls: kept until a successor checkpoints
        outputs, joining = self.serving.outputs, self.inputs.joining
        for s in [s for s, m in outputs.items() if released.covers(m.origin) and (stashed is None or s <= stashed)]:
            del outputs[s]  # its reply left the graph: no resend will need it
        self.backup_side.forget_released(stashed)
        for key in [k for k in joining if released.covers(k[1])]:
            del joining[key]  # answered already (another branch's error): the join never completes

    def _check_state_fits(self) -> None:
        """A state too large for one message would never reach the backup (its socket drops
        the frame): nothing would become durable and every reply would wait for its deadline.
        Refuse to start instead, saying why."""
        size = sum(a.nbytes for a in self.serving.model.state_arrays().values())
        if size > STATE_MAX_BYTES:
            raise ValueError(f"operator {self.op!r}: its state is {size / 2**20:.1f} MiB, over the "
                             f"{STATE_MAX_BYTES / 2**20:.0f} MiB one state message carries to its backup "
                             f"(transport.MAX_FRAME_BYTES, less room for the batch's inputs): a smaller "
                             f"state, or mode \"bare\" (no backup)")

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
        self.take_state(msg)  # the backup side's (``hooks.LateStates`` may hold it first)

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
        if not self.inputs.take(msg, self.tables.consumed):
            return  # a resend of an input taken already, or one its resend will carry in order
        if len(self.preds) == 1 or self.spec.join == "interleave":
            self.serving.queue.append(msg)  # interleaving: inputs batch in arrival order (HAMS S1 non-determinism)
            return
        joining = self.inputs.joining
        parts = joining.setdefault((msg.reply_to, msg.origin), {})
        parts[msg.sender] = msg
        if len(parts) == len(self.preds):  # combine: every input of this origin arrived
            del joining[msg.reply_to, msg.origin]
            ins = [parts[p] for p in self.preds]
            lineage = lin.join([m.lineage for m in ins])
            lineage += [lin.LineageEntry(m.sender, m.seq, "?", -1) for m in ins[1:]]  # numbered in step()
            self.serving.queue.append(GraphRequest(ins[0].sender, ins[0].seq, msg.origin, msg.stream, lineage,
                                           np.concatenate([m.input for m in ins], axis=-1),
                                           degraded=True if any(m.degraded for m in ins) else None,
                                           request=msg.request, reply_to=msg.reply_to))

    # --- the batch loop ---------------------------------------------------------------
    def tick(self, timeout: float | None = None) -> None:
        queue = self.serving.queue

        def can_step(rest_s: float) -> bool:
            return bool(queue) and self.role_record.role in SERVING and self.recovery.may_number() \
                and self.batcher.idle() and not rest_s

        if timeout is None:
            rest_s = self._rest_of_batch_s()
            if can_step(rest_s):
                timeout = 0
            elif queue and rest_s:
                timeout = min(self.next_timeout(), rest_s)  # the rest arrives, or the wait ends
        super().tick(timeout)
        self.batcher.after_poll(self._guarded, lambda: can_step(self._rest_of_batch_s()))

    def _rest_of_batch_s(self) -> float:
        """How long the next batch still waits for the rest of a predecessor's batch: a
        batch of a predecessor's (its rows arrive one message each) is taken whole, not in
        a fragment that would leave its rest a whole batch time behind, and keep the two
        operators' batches a batch apart from then on (50 ms chains measured it). 0: none
        open, or a batch's worth queued already."""
        if not self.rest_due or len(self.serving.queue) >= self.spec.max_batch:
            return 0.0
        return max(0.0, max(self.rest_due.values()) - time.monotonic())

    def status(self) -> dict:
        info = super().status()
        serving, statemgr, applied = self.serving, self.serving.statemgr, self.tables.applied
        info.update(operator=self.op, mode=self.graph.mode, assignment=self.role_record.assignment, epoch=self.role_record.epoch,
                    hams_role=self.role_record.role.value, degraded=self.role_record.role is R.DEGRADED,
                    **self.recovery.status(),  # takeovers, fenced; a standby's models
                    queued=len(serving.queue),  # applied_requests: bounded by count and age, not by replies leaving
                    applied_requests=len(applied) if applied is not None else None,
                    saved_outputs=len(serving.outputs), **self.batcher.status(),
                    tables={"queue": len(serving.queue), "outputs": len(serving.outputs), "held": len(serving.held),
                            "joining": len(self.inputs.joining)})  # state GC: each drains once replies left
        if statemgr is not None:
            info["tables"].update(saved_states=len(statemgr.saved), in_flight=len(statemgr.in_flight))
            info.update(saved_states=len(statemgr.saved), in_flight=len(statemgr.in_flight),
                        durable_seq=statemgr.durable_seq, copy_ms=statemgr.copy_ms,
                        copy_ms_mean=1000 * statemgr.copy_s / max(1, info["batches"]),
                        handoff_ms=statemgr.handoff_ms, copies=statemgr.copies,
                        copies_in_background=statemgr.in_background)
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
        if self.serving.statemgr is not None:
            self.serving.statemgr.close()
        self.events.close()
