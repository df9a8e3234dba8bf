"""A stateful operator's backup side (HAMS §IV-C, §IV-D), a mixin of
``services.graph.operator.GraphOperator``: it runs Algorithm 2
(``services.graph.lineage.Backup``) on its primary's shipped states and, for each applied
state, notifies the next stateful models' backups, the frontend and its primary; it keeps
the applied outputs (with their origin, stream and lineage) until their replies left, for
a takeover. A degraded primary runs the same notify on its own states.
"""
from __future__ import annotations

from keel.common.ids import epoch_of
from keel.common.protocol.messages import GraphAck, GraphRequest, GraphState
from keel.services.graph import lineage as lin
from keel.services.graph.applied import AppliedRequests
from keel.services.graph.roles import OperatorRole
from keel.services.graph.statemgr import Folded, Packed, header_of


class BackupSide:
    def _on_state(self, msg: GraphState) -> None:
        if msg.operator != self.op:
            return
        header = header_of(msg.blob) if self.role_record.role is OperatorRole.REJOINING and self.role_record.current(msg.epoch) else {}
        if header.get("whole"):  # the primary's whole state: Algorithm 2 goes on from it
            self.backup.max_applied_seq = msg.first_seq - 1
            for op, seq in header["durable"].items():
                self.backup.durable.notify(op, seq)
            self.consumed.update(header["consumed"])
            self.applied = AppliedRequests.from_json(header.get("table", []))
            self.role_record.become("whole_state")
            self.events.write("joined", operator=self.op, epoch=msg.epoch, last_seq=msg.last_seq)
            self.log.warning("joined as backup: the primary's whole state", operator=self.op, epoch=msg.epoch,
                             last_seq=msg.last_seq, outputs=len(header["seqs"]))
        shipped = lin.ShippedState(msg.operator, msg.epoch, msg.first_seq, msg.last_seq, [msg.lineage], {"blob": msg.blob})
        applied = self.backup.receive(shipped)
        self._notify(applied)  # the frontend first: a held reply may be waiting on this state
        self._keep(applied)
        if not any(s.last_seq >= msg.last_seq for s in applied):  # an applied state's notice acks it already
            self.peers.send(self.config.peers[self.op], GraphAck(self.op, msg.epoch, msg.last_seq))

    def _keep(self, applied: list[lin.ShippedState]) -> None:
        """A backup keeps each applied output (never recomputed after a takeover), per
        predecessor the highest of its seqs the applied state holds, and the requests the
        state applied (its table: what the primary recorded with this state)."""
        for state in applied:
            entries = state.lineages[0]
            for e in entries:
                if e.operator == self.op and e.predecessor in self.preds:
                    source = lin.source_of(e.predecessor, e.predecessor_seq)
                    self.consumed[source] = max(self.consumed.get(source, -1), e.predecessor_seq)
            if self.backup.folded is None:
                self.backup.folded = Folded()
            packed = Packed(state.state["blob"])  # its header read once, for all of what follows
            self.backup.folded.fold(packed)  # the whole state it makes (touched rows written in)
            header = packed.header
            if not header.get("origins"):
                continue
            outs = packed.outputs()  # not the state's tensors: a 16 MiB state is 16 MiB copied
            n = len(header["seqs"])
            requests, reply_to = header.get("requests") or [None] * n, header.get("reply_to") or [None] * n
            origin_of = dict(zip(header["seqs"], header["origins"]))
            for key, seq in header.get("applied", []):  # the same records, in the same order, as the primary's
                self.applied.record(key, seq, origin_of[seq], outs[seq], header["t"])
            for seq, origin, stream, request, to in zip(header["seqs"], header["origins"], header["streams"], requests, reply_to):
                if not self._released(origin):
                    self.kept[seq] = GraphRequest(self.op, seq, origin, stream, lin.lineage_of(entries, self.op, seq),
                                                  outs[seq], request=request, reply_to=to)

    def _released(self, origin: int) -> bool:
        """Has the reply of ``origin`` left the graph (its frontend incarnation's notice)?"""
        return origin <= self.released.get(epoch_of(origin), -1)

    def _notify(self, applied: list[lin.ShippedState]) -> None:
        """Algorithm 2, after applying: tell the next stateful models, the frontend, my primary."""
        degraded = self.role_record.role is OperatorRole.DEGRADED
        for state in applied:
            if self.events:  # the requests this state applied, for the checker's "at most once"
                requests = state.state["applied"] if "applied" in state.state else \
                    header_of(state.state["blob"]).get("applied", []) if "blob" in state.state else []
                self.events.write("apply", operator=self.op, last_seq=state.last_seq, epoch=state.epoch, degraded=degraded,
                                 lineage=[e.to_json() for lineage in state.lineages for e in lineage], requests=requests)
            self.events.flush()  # the checker's record of this durability on disk before the notice (a kill loses the buffer)
            self._announce_durable(self.role_record.epoch, state.last_seq, primary=not degraded)
