"""A stateful operator's backup side (HAMS §IV-C, §IV-D): it runs Algorithm 2
(``services.graph.lineage.Backup``) on its primary's shipped states and, for each applied
state, notifies the next stateful models' backups, the frontend and its primary; it keeps
the applied outputs (with their origin, stream and lineage) until their replies left, for
a takeover. A degraded primary runs the same notify on its own states (``notify``).

An object of its own, wired by ``services.graph.operator.GraphOperator``: it is given the
role record, the shared tables (``services.graph.tables``), the event log and two send
functions, and reads nothing else of the operator.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from keel.common.protocol.messages import GraphAck, GraphRequest, GraphState
from keel.services.graph import lineage as lin
from keel.services.graph.applied import AppliedRequests
from keel.services.graph.roles import OperatorRole, RoleRecord
from keel.services.graph.statemgr import Folded, Packed, header_of
from keel.services.graph.tables import Tables


class BackupSide:
    """Parameters: ``op`` my operator, ``preds`` its predecessors, ``stateful`` the graph's
    stateful operators; ``roles`` my role record; ``tables`` the shared tables; ``events``
    and ``log``; ``to_primary(msg)`` sends to my group's primary; ``announce(epoch, seq,
    primary)`` is Algorithm 2's notify (``Links.announce_durable``)."""

    def __init__(self, op: str, preds: list[str], stateful, roles: RoleRecord, tables: Tables, events, log,
                 to_primary: Callable, announce: Callable):
        self.op, self.preds, self.stateful = op, preds, stateful
        self.roles, self.tables, self.events, self.log = roles, tables, events, log
        self.to_primary, self.announce = to_primary, announce
        self.algorithm2: lin.Backup | None = None  # set while I back my group (BACKUP, REJOINING)
        self.kept: OrderedDict[int, GraphRequest] = OrderedDict()  # applied outputs, for a takeover

    @property
    def max_applied_seq(self) -> int:
        return self.algorithm2.max_applied_seq if self.algorithm2 is not None else -1

    @property
    def backing(self) -> bool:
        """Do I back my group (BACKUP, REJOINING: states arrive and apply)?"""
        return self.algorithm2 is not None

    @property
    def epoch(self) -> int:
        """The epoch I back my group at (my window acks carry it)."""
        return self.algorithm2.epoch

    def start(self, epoch: int) -> None:
        """Back my group at ``epoch`` from nothing: nothing of an older epoch is kept."""
        self.algorithm2 = lin.Backup(self.op, self.stateful, epoch)
        self.kept = OrderedDict()

    def hand_over(self) -> tuple[lin.Backup, OrderedDict]:
        """A takeover: Algorithm 2 as it stands and the kept outputs, for the new primary;
        I back nothing any more."""
        algorithm2, kept = self.algorithm2, self.kept
        self.algorithm2, self.kept = None, OrderedDict()
        return algorithm2, kept

    def on_state(self, msg: GraphState) -> None:
        if msg.operator != self.op:
            return
        header = header_of(msg.blob) if self.roles.role is OperatorRole.REJOINING and self.roles.current(msg.epoch) else {}
        if header.get("whole"):  # the primary's whole state: Algorithm 2 goes on from it
            self.algorithm2.max_applied_seq = msg.first_seq - 1
            for op, seq in header["durable"].items():
                self.algorithm2.durable.notify(op, seq)
            self.tables.consumed.update(header["consumed"])
            self.tables.applied = AppliedRequests.from_json(header.get("table", []))
            self.roles.become("whole_state")
            self.events.write("joined", operator=self.op, epoch=msg.epoch, last_seq=msg.last_seq)
            self.log.warning("joined as backup: the primary's whole state", operator=self.op, epoch=msg.epoch,
                             last_seq=msg.last_seq, outputs=len(header["seqs"]))
        shipped = lin.ShippedState(msg.operator, msg.epoch, msg.first_seq, msg.last_seq, [msg.lineage], {"blob": msg.blob})
        applied = self.algorithm2.receive(shipped)
        self.notify(applied)  # the frontend first: a held reply may be waiting on this state
        self.keep(applied)
        if not any(s.last_seq >= msg.last_seq for s in applied):  # an applied state's notice acks it already
            self.to_primary(GraphAck(self.op, msg.epoch, msg.last_seq))

    def on_notify(self, operator: str, seq: int) -> None:
        """A previous stateful model's durability: the states it lets apply, applied."""
        applied = self.algorithm2.on_notify(operator, seq)
        self.notify(applied)
        self.keep(applied)  # its outputs, what it took and its requests: as for a state applied on arrival

    def forget_after(self, operator: str, seq: int) -> None:
        """A takeover upstream at ``seq``: pending states that took more never apply."""
        self.algorithm2.forget_after(operator, seq)

    def keep(self, applied: list[lin.ShippedState]) -> None:
        """A backup keeps each applied output (never recomputed after a takeover), per
        predecessor the highest of its seqs the applied state holds, and the requests the
        state applied (its table: what the primary recorded with this state)."""
        consumed = self.tables.consumed
        for state in applied:
            entries = state.lineages[0]
            for e in entries:
                if e.operator == self.op and e.predecessor in self.preds:
                    source = lin.source_of(e.predecessor, e.predecessor_seq)
                    consumed[source] = max(consumed.get(source, -1), e.predecessor_seq)
            if self.algorithm2.folded is None:
                self.algorithm2.folded = Folded()
            packed = Packed(state.state["blob"])  # its header read once, for all of what follows
            self.algorithm2.folded.fold(packed)  # the whole state it makes (touched rows written in)
            header = packed.header
            if not header.get("origins"):
                continue
            outs = packed.outputs()  # not the state's tensors: a 16 MiB state is 16 MiB copied
            n = len(header["seqs"])
            requests, reply_to = header.get("requests") or [None] * n, header.get("reply_to") or [None] * n
            origin_of = dict(zip(header["seqs"], header["origins"]))
            for key, seq in header.get("applied", []):  # the same records, in the same order, as the primary's
                self.tables.applied.record(key, seq, origin_of[seq], outs[seq], header["t"])
            for seq, origin, stream, request, to in zip(header["seqs"], header["origins"], header["streams"], requests, reply_to):
                if not self.tables.released.covers(origin):
                    self.kept[seq] = GraphRequest(self.op, seq, origin, stream, lin.lineage_of(entries, self.op, seq),
                                                  outs[seq], request=request, reply_to=to)

    def forget_released(self, stashed: int | None) -> None:
        """Kept outputs whose replies left the graph (and, ``ls``, at or below ``stashed``)."""
        for s in [s for s, m in self.kept.items()
                  if self.tables.released.covers(m.origin) and (stashed is None or s <= stashed)]:
            del self.kept[s]

    def notify(self, applied: list[lin.ShippedState]) -> None:
        """Algorithm 2, after applying: tell the next stateful models, the frontend, my primary."""
        degraded = self.roles.role is OperatorRole.DEGRADED
        for state in applied:
            if self.events:  # the requests this state applied, for the checker's "at most once"
                requests = state.state["applied"] if "applied" in state.state else \
                    header_of(state.state["blob"]).get("applied", []) if "blob" in state.state else []
                self.events.write("apply", operator=self.op, last_seq=state.last_seq, epoch=state.epoch, degraded=degraded,
                                 lineage=[e.to_json() for lineage in state.lineages for e in lineage], requests=requests)
            self.events.flush()  # the checker's record of this durability on disk before the notice (a kill loses the buffer)
            self.announce(self.roles.epoch, state.last_seq, primary=not degraded)

    def status(self) -> dict:
        a = self.algorithm2
        return {"max_applied_seq": a.max_applied_seq, "pending_states": len(a.pending), "durable": dict(a.durable.seqs)}
