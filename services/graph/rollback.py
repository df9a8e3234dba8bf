"""A stateful primary's roll-backs (HAMS §IV-E, Fig. 6): a predecessor recovered at its
``max_seq`` and my state took its outputs above it, or my backup died. I roll back in
place to the newest state I shipped that took none of them (``saved_without``), at a new
epoch the manager's compare-and-set grants, and go on from it degraded; with no such
state I step down and have the manager promote my backup (its state never took them).
The manager's decision is asked, not waited for: its answer is handled in the loop.

An object of its own (``RollBack``), wired by ``services.graph.operator.GraphOperator``
beside ``services.graph.recovery.Recovery``, which asks it to roll back (a takeover
upstream) and hears when the manager decided (``on_decided``).
"""
from __future__ import annotations

from typing import Callable

import zmq

from keel.common import transport
from keel.services.graph import lineage as lin
from keel.services.graph.roles import OperatorRole, RoleRecord
from keel.services.graph.tables import Inputs, Serving, Tables

#: a primary whose backup disconnected waits this long for a predecessor's takeover note (Fig. 6:
#: roll back to a state that took nothing above its max_seq) before it goes on alone
BACKUP_GRACE_S = 0.2

#: how long a rolling-back primary waits for the manager's decision (it re-asks meanwhile:
#: a compare-and-set is safe to repeat) before it steps down
PROMOTE_TIMEOUT_S = 10.0


def saved_without(statemgr, ships_state: bool, pred: str | None, max_seq: int):
    """(last seq, tensors, lineage) of the newest state ``statemgr`` shipped that took
    nothing of ``pred`` above ``max_seq``; a fresh state under the strawman (it keeps
    none, ``ships_state`` False); None."""
    statemgr.wait_copy()  # the newest batch's state is saved once copied
    good = [st for st in statemgr.saved.values()
            if not any(e.operator == pred and e.seq > max_seq for e in st.lineage)]
    if good:
        return good[-1].last_seq, statemgr.state_at(good[-1].last_seq), good[-1].lineage
    # The state before my first batch, when none of mine is durable yet: every state I
    # shipped is still saved (only states older than a durable one are let go), so none
    # took nothing of pred's, and no reply waits on any of them. Fig. 6 right after the
    # start: o3's first state took o2's lost outputs and o3's backup died with o2.
    if not ships_state or statemgr.durable_seq < 0:
        return -1, {}, []
    return None


class RollBack:
    """Parameters: ``op`` my operator, ``spec`` its spec, ``preds`` its predecessors,
    ``stateful`` the graph's stateful operators, ``ships_state`` (the mode's); ``roles`` (the
    role record; its ``clock`` times the backup's grace), ``serving``, ``tables``, ``inputs`` (``services.graph.tables``); ``links``; ``events``
    and ``log``; ``new_model(spec)``; ``drop_computing()`` voids the batch computing;
    ``member()`` my name in the manager's group, ``group_epoch()`` my group's newest epoch
    in the feed; ``on_decided(rolled_back)`` once the manager answered; ``peers`` and
    ``endpoints`` (peer name -> endpoint) to watch my backup, with the loop's ``every``
    and ``add_socket``. The manager's link comes with ``link``."""

    def __init__(self, op: str, spec, preds: list[str], stateful, ships_state: bool, roles: RoleRecord,
                 serving: Serving, tables: Tables, inputs: Inputs, links, events, log, new_model: Callable,
                 drop_computing: Callable, member: Callable, group_epoch: Callable, on_decided: Callable,
                 peers: transport.Peers, endpoints: dict[str, str], every: Callable, add_socket: Callable):
        self.op, self.spec, self.preds, self.stateful, self.ships_state = op, spec, preds, stateful, ships_state
        self.roles, self.serving, self.tables, self.inputs = roles, serving, tables, inputs
        self.links, self.events, self.log = links, events, log
        self.new_model, self.drop_computing, self.member = new_model, drop_computing, member
        self.group_epoch, self.on_decided = group_epoch, on_decided
        self.peers, self.endpoints, self.every, self.add_socket = peers, endpoints, every, add_socket
        self.manager = None  # the manager's link (``link``): roll-backs are its decisions
        self.backup_lost = False  # a primary's socket to its backup disconnected (Fig. 6: roll back in place)

    def link(self, manager) -> None:
        self.manager = manager

    def watch_backup(self) -> None:
        """A stateful primary notes when its socket to its backup disconnects (the backup died)."""
        monitor = self.peers.get(self.endpoints[f"{self.op}.backup"]).get_monitor_socket(zmq.EVENT_DISCONNECTED)

        def on_event(sock: zmq.Socket) -> None:
            if transport.disconnect_seen(sock) and not self.backup_lost:
                self.backup_lost = self.roles.clock()
        self.add_socket(monitor, on_event)
        self.every(0.05, self._on_backup_lost)

    def _on_backup_lost(self, _now: float) -> None:
        """My backup died and no predecessor's takeover made me roll back within a grace
        (its detection, ~100 ms): go on alone from my newest shipped state, degraded, at a
        new epoch (my states no longer reach a backup: the window would stall every batch)."""
        if self.backup_lost and self.roles.role is OperatorRole.PRIMARY and self.serving.statemgr is not None \
                and self.roles.clock() - self.backup_lost > BACKUP_GRACE_S:
            self._roll_back_in_place(None, -1)

    def roll_back(self, pred: str, max_seq: int) -> None:
        """My state took ``pred``'s outputs above its new primary's max_seq: roll back in
        place if I kept a state that took none of them, else step down and have the manager
        promote my backup (its state never took them)."""
        group = f"graph/{self.op}"
        others = [v["name"] for k, v in self.manager.feed.values.items()
                  if k.startswith("service/") and v.get("group") == group and v.get("name") != self.member()]
        self.log.warning("rolling back: my state took outputs of a failed predecessor", predecessor=pred,
                         max_seq=max_seq, took=self.inputs.took.get(pred), backup=others[:1], backup_lost=self.backup_lost)
        if self.serving.statemgr is not None and self._saved_without(pred, max_seq) is not None:
            self._roll_back_in_place(pred, max_seq)
            return
        alone = self.roles.role is OperatorRole.DEGRADED
        self.roles.become("roll_back_to_backup")
        self.serving.model = None
        self.serving.outputs.clear()
        self._drop_pending()
        if not others or alone:
            self.log.error("no backup to roll back to", operator=self.op)
            return
        epoch = self.group_epoch()
        self.manager.request("promote", {"group": group, "name": others[0], "epoch": epoch, "expected_epoch": epoch,
                                         "reason": f"rollback: {pred} recovered at {max_seq}"},
                             lambda result: self.log.warning("rollback decided", result=result),
                             timeout_s=PROMOTE_TIMEOUT_S)  # unanswered: promoted when my heartbeats stop

    def _drop_pending(self, last: int = -1) -> None:
        """A roll-back to the state at seq ``last``: inputs queued or half-joined came after
        it (kept, they would run first, out of seq order, and again when resent), and so did
        held sends of outputs above it."""
        self.serving.queue.clear()
        self.inputs.joining.clear()
        self.drop_computing()
        for seq in [s for s in self.serving.held if s > last]:
            del self.serving.held[seq]

    def _saved_without(self, pred: str | None, max_seq: int):
        return saved_without(self.serving.statemgr, self.ships_state, pred, max_seq)

    def _roll_back_in_place(self, pred: str | None, max_seq: int) -> None:
        """HAMS §IV-E, Fig. 6: ``pred`` recovered at ``max_seq`` and my state took its outputs
        above it (or, ``pred`` None, my backup died): I roll back to my previous state, the
        newest state I shipped (kept until durable) that took none of them, at a new epoch
        (the manager's compare-and-set on my own group), and go on from it degraded, as a
        promoted backup would; a live backup catches up again (its states are of my old
        epoch). Done in place whenever such a state exists: my backup may be dead without my
        knowing yet (Fig. 6: its disconnect can come after the takeover note). The manager's
        decision is asked, not waited for: ``_rolled_back`` takes its answer."""
        good = self._saved_without(pred, max_seq)
        if good is None:
            self.roles.become("no_saved_state")
            self.serving.model = None
            self.serving.outputs.clear()
            self.log.error("no consistent saved state to roll back to", operator=self.op)
            return
        self.roles.become("roll_back_in_place")
        current = self.group_epoch()
        reason = f"rollback in place: {pred} recovered at {max_seq}" if pred else "backup lost: goes on alone"
        self.manager.request("promote", {"group": f"graph/{self.op}", "name": self.member(), "epoch": current,
                                         "expected_epoch": current, "reason": reason},
                             lambda result: self._rolled_back(result, good), timeout_s=PROMOTE_TIMEOUT_S)

    def _rolled_back(self, result: dict, good: tuple) -> None:
        """The manager's answer to my roll-back in place: go on from the saved state ``good``
        at the new epoch, or (refused, or no answer in time) step down."""
        serving = self.serving
        if result.get("status") != "ok":
            self.roles.become("manager_refused")
            serving.model = None
            serving.outputs.clear()
            self.log.error("rollback in place refused", result=result)
            self.on_decided(False)
            return
        last, tensors, lineage = good
        epoch = result["epoch"]
        self._drop_pending(last)  # what came after the state I go on from: my acks below have it resent, in order
        serving.statemgr.close()
        serving.statemgr = None
        serving.model = self.new_model(self.spec)
        serving.model.start()
        if tensors:
            serving.model.load_state(tensors)
        serving.next_seq = last + 1
        for seq in [s for s in serving.outputs if s > last]:
            del serving.outputs[seq]  # numbered after the state I go on from: re-run, never released
        self.tables.applied.forget_after(last)  # the requests applied after it come again and apply again
        consumed = {p: -1 for p in self.preds}
        for e in lineage:
            if e.operator == self.op and e.predecessor in self.preds:
                source = lin.source_of(e.predecessor, e.predecessor_seq)
                consumed[source] = max(consumed.get(source, -1), e.predecessor_seq)
        self.tables.consumed = consumed
        self.inputs.took = dict(consumed)
        self.inputs.taken = {}
        # resync needs consecutive seqs: an operator's, or a frontend numbering its graph requests from
        # 0; a frontend incarnation's origins skip what it sent elsewhere (it waits for my ack instead)
        self.inputs.resync = {p: seq + 1 for p, seq in consumed.items() if "#" not in p}
        serving.own = lin.Backup(self.op, self.stateful, epoch)
        serving.own.max_applied_seq = last
        self.roles.become("manager_ok", epoch=epoch, confirmed=True)
        # the only copy of this state now: it counts as applied (the invariants' record, on disk first)
        if last >= 0:
            self.events.write("apply", operator=self.op, last_seq=last, epoch=epoch, degraded=True,
                              lineage=[e.to_json() for e in lineage])
        self.events.write("takeover", operator=self.op, epoch=epoch, max_seq=last, rollback=True)
        self.events.flush()
        self.links.announce_durable(epoch, last, successors=True)
        for p in self.preds:
            self.links.ack_pred(p, self.op, epoch, consumed)
        self.log.warning("rolled back in place", operator=self.op, epoch=epoch, last_seq=last)
        self.on_decided(True)
