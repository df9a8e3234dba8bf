"""HAMS II for one operator (§IV-E), a mixin of ``services.graph.operator.GraphOperator``:
the manager's word (its change feed and heartbeat answers) and every edge of the role
table it drives (``services.graph.roles``): promotions, fencing and rejoining, a new
backup brought up, roll-backs. No call here waits for the manager: a decision this
operator asks for (``promote``, to roll back) goes through ``ManagerLink.request`` and
its answer is handled in the loop.

A stateful operator's primary and backup are the group ``graph/<operator>``; the backup
reports the primary suspected when its socket to it disconnects, and the manager promotes
it (a new epoch, in the Raft log) when the primary stops heartbeating. Every graph process
follows the group's holder in the change feed (where to send). A holder numbers and sends
only while the manager confirmed it within ``LEASE_S``: a frozen primary (SIGSTOP) keeps
its sockets open, so only the manager's silence window detects it; thawed, it finds its
lease lapsed, sends nothing until the manager answers, and the answer (a newer holder)
fences it; it rejoins as the new primary's backup under a new name.
"""
from __future__ import annotations

import time

import zmq

from keel.common import transport
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphState
from keel.services.graph import lineage as lin
from keel.services.graph.applied import AppliedRequests
from keel.services.graph.roles import BACKING, SERVING, OperatorRole
from keel.services.graph.statemgr import pack

#: a holder numbers and sends only this long after the manager last confirmed it: under
#: the manager's silence window (``ManagerConfig``: 5 heartbeats of 30 ms = 150 ms), so a
#: primary thawed after the manager replaced it cannot release before it learns so
LEASE_S = 0.1

#: a primary whose backup disconnected waits this long for a predecessor's takeover note (Fig. 6:
#: roll back to a state that took nothing above its max_seq) before it goes on alone
BACKUP_GRACE_S = 0.2

#: how long a rolling-back primary waits for the manager's decision (it re-asks meanwhile:
#: a compare-and-set is safe to repeat) before it steps down
PROMOTE_TIMEOUT_S = 10.0


class Recovery:
    # --- the manager's word ----------------------------------------------------------------
    def _link_manager(self) -> None:
        me = None
        if self.stateful or self.role_record.role in BACKING or self.role_record.role in (OperatorRole.STATELESS, OperatorRole.STANDBY):
            me = {"name": self.name, "group": f"graph/{self.op}", "host": "local", "endpoints": {"inbox": self.config.endpoint}}
        primary_first = self.role_record.role in BACKING or self.role_record.role is OperatorRole.STANDBY  # the spec's primary takes the role first
        self.link_manager(self.config.manager, on_change=self._on_manager_change, me=me, on_role=self._on_role,
                          ready=lambda: self.role_record.role is not OperatorRole.REJOINING,
                          may_register=lambda: not primary_first or self.manager.holder(f"graph/{self.op}")[0])
        if self.role_record.role in BACKING or self.role_record.role is OperatorRole.STANDBY:  # a disconnect of my socket to the primary: report it at once
            holder = self.manager.holder(f"graph/{self.op}")[0] if self.role_record.role is OperatorRole.REJOINING else None
            self.manager.watch(self.peers.get(self.config.peers[self.op]), holder or f"op-{self.op}")
        for key, value in list(self.manager.feed.values.items()):
            self._on_manager_change(key, value)
        if self.stateful:
            self.every(0.1, self._ask_for_state)  # only while rejoining (a joiner, a fenced old primary)

    def _on_manager_change(self, key: str, value: dict | None) -> None:
        if self.role_record.role is OperatorRole.ROLLING_BACK:  # acted on once my own epoch is decided, in order
            self.deferred.append(lambda: self._on_manager_change(key, value))
            return
        if self.manager is None or not key.startswith("group/graph/") or not value or not value.get("holder"):
            return
        op, holder, epoch = key[len("group/graph/"):], value["holder"], value.get("epoch", 0)
        endpoint = ((self.manager.feed.values.get(f"service/{holder}") or {}).get("endpoints") or {}).get("inbox")
        if endpoint is None or epoch <= self.epochs.get(op, 0):
            return
        if op in self.epochs and op in self.succs and self.stateful:
            self.awaiting.add(op)  # a takeover: its ack says where my resend starts; keep seq order till then
        if op in self.epochs and op in self.preds and not self.graph.operators[op].stateful and self.role_record.role in SERVING:
            self._report_taken(op, epoch, endpoint)  # the serving successor's word (a backup's took nothing)
        if op in self.epochs and op in self.preds and self.taken is not None and self.role_record.role in SERVING:
            # I took over, and so did my predecessor (both failed together): my ack may have gone
            # to its dead primary; its new one waits for it before it sends me anything
            self.links.send(endpoint, GraphAck(self.op, self.role_record.epoch, self.consumed.get(op, -1)))
        if op in self.epochs and op != self.op and op in self.graph.stateful:
            self.config.peers[f"{op}.backup"] = endpoint  # a new primary: its own durability (degraded) or relayed
            self._renotify(op, endpoint)
        if op == self.op:
            self.holders_seen.add(holder)
        self.epochs[op] = epoch
        self.config.peers[op] = endpoint  # where op's inputs, acks and GC notices go from now on
        if op == self.op:
            self._on_role(holder, epoch)
        pending = self.resend_after.get(op)
        if pending is not None and pending[0] <= epoch:
            del self.resend_after[op]
            self._resend(op, pending[1])

    def _on_role(self, holder: str | None, epoch: int) -> None:
        """The manager's applied decision for my group (feed or heartbeat answer); an older
        epoch than one already seen (a lagging replica's answer) changes nothing."""
        if self.role_record.role is OperatorRole.ROLLING_BACK:
            self.deferred.append(lambda: self._on_role(holder, epoch))
            return
        me = self.member
        previous = self.role_record.heard(holder, me, epoch)
        if previous is None:
            return
        if holder not in (None, me) and self.role_record.role is OperatorRole.BACKUP and previous and epoch > previous and self.manager:
            # my primary rolled back in place at a new epoch: my states are of its old one
            self.role_record.become("primary_moved", epoch=epoch)
            self._catch_up(epoch)
            self.log.warning("my primary moved to a new epoch: catching up again", holder=holder, epoch=epoch)
            return
        if holder == me and self.role_record.role in BACKING:
            self.take_over(epoch)
        elif holder == me and self.role_record.role is OperatorRole.STANDBY:
            self.take_over_stateless(epoch)
        elif holder not in (None, me) and self.role_record.role in SERVING:
            rejoin = self.stateful and self.manager is not None
            mine = self.role_record.epoch  # the epoch I held my group in, fenced at
            if rejoin:
                self.role_record.become("newer_holder", epoch=epoch)  # I rejoin at the holder's epoch
            else:
                self.role_record.become("newer_holder_alone")
            self.model = None  # fenced: a newer holder exists; nothing more leaves from here
            self.queue.clear()
            self.batcher.drop_computing()
            self.held.clear()
            self.outputs.clear()
            self.fenced = True
            self.events.write("fenced", operator=self.op, epoch=mine, holder=holder, holder_epoch=epoch)
            self.log.warning("stale primary: stepped down, fenced", holder=holder, epoch=epoch)
            if rejoin:
                self._rejoin(holder, epoch)

    def _renotify(self, op: str, endpoint: str) -> None:
        """``op`` has a new holder that runs Algorithm 2 itself (degraded, from a fresh view
        of durability after a roll-back): my notices so far went to its old backup, and the
        newest may have gone while the manager was slow to tell me; it gets my newest again."""
        role = self.role_record.role
        newest = self.backup_side.max_applied_seq if role in BACKING else \
            self.own.max_applied_seq if role is OperatorRole.DEGRADED else -1
        if op in self.graph.next_stateful(self.op) and newest >= 0:
            self.links.send(endpoint, GraphDurable(self.op, self.role_record.epoch, newest))

    @property
    def member(self) -> str:
        """My name in the manager's group (a fenced primary rejoins under a new one)."""
        return self.manager.me["name"] if self.manager is not None and self.manager.me else self.name

    def leased(self) -> bool:
        """May I number and send? Without a manager always; with one, a holder only while
        the manager confirmed it within ``LEASE_S`` (a thawed primary waits for its word)."""
        return self.manager is None or self.role_record.role not in SERVING or self.role_record.leased(LEASE_S)

    # --- backups: joining, catching up ------------------------------------------------------
    def _catch_up(self, epoch: int) -> None:
        """A backup at ``epoch`` (my role record moved to it) that waits for the holder's
        whole state: nothing of an older epoch is kept, and my notices (the holder's window
        acks) carry ``epoch`` (the holder ignores acks of another epoch: its window would
        never move)."""
        self.backup_side.start(epoch)
        self.consumed = {}
        self.applied = AppliedRequests()  # the holder's whole state brings its table

    def _rejoin(self, holder: str, epoch: int) -> None:
        """HAMS §IV-E: "the old primary can immediately work as a backup by overwriting its
        state with the new primary's". Fenced, I join the group again as a new member (a new
        name: the new primary ships only to a member that never held the group) and ask the
        holder for its whole state, like a backup started after a failover."""
        if self.statemgr is not None:
            self.statemgr.close()
            self.statemgr = None
        self._catch_up(epoch)
        self.took, self.took_before = {}, {}
        self.manager.me = {**self.manager.me, "name": f"{self.name}~{epoch}"}
        self.manager.registered = False  # registers the new name at its next heartbeat
        endpoint = ((self.manager.feed.values.get(f"service/{holder}") or {}).get("endpoints") or {}).get("inbox")
        if endpoint:
            self.config.peers[self.op] = endpoint
            self.manager.watch(self.peers.get(endpoint), holder)

    def _ask_for_state(self, _now: float) -> None:
        """A joining backup asks the group's primary for its whole state until it arrives."""
        if self.role_record.role is OperatorRole.REJOINING:
            self.links.to(self.op, GraphAck(self.op, self.backup_side.epoch, 0))

    def _bring_up_backup(self) -> None:
        """HAMS §IV-E: a new backup joined my group (a member that never held it): ship it my
        whole state (the model's tensors, the outputs saved for a resend, with their lineage,
        what I took from each predecessor, the durability I know), then every batch's state
        as before: I leave degraded mode (Algorithm 2 runs at the backup again)."""
        group = f"graph/{self.op}"
        joined = [v for k, v in self.manager.feed.values.items() if k.startswith("service/") and v.get("group") == group
                  and v.get("name") not in self.holders_seen and (v.get("endpoints") or {}).get("inbox")]
        if not joined:
            return  # its registration has not reached my feed yet: it asks again
        endpoint = joined[-1]["endpoints"]["inbox"]
        self.config.peers[f"{self.op}.backup"] = endpoint
        seqs = sorted(self.outputs)
        last = self.next_seq - 1
        meta = {"whole": True, "origins": [self.outputs[s].origin for s in seqs], "streams": [self.outputs[s].stream for s in seqs],
                "requests": [self.outputs[s].request for s in seqs], "reply_to": [self.outputs[s].reply_to for s in seqs],
                "consumed": dict(self.consumed), "durable": dict(self.own.durable.seqs),
                "table": self.applied.to_json()}  # the requests this state holds travel with it
        blob = pack(self.model.state_arrays(), {s: self.outputs[s].input for s in seqs}, meta)
        lineage = lin.join(self.outputs[s].lineage for s in seqs)
        self.links.send(endpoint, GraphState(self.op, self.role_record.epoch, seqs[0] if seqs else last, last, lineage, blob))
        self.role_record.become("backup_joined")
        self.statemgr = self._new_statemgr(endpoint)
        self.own, self.relaying = None, True
        self.events.write("backup_joined", operator=self.op, epoch=self.role_record.epoch, backup=joined[-1].get("name"),
                         last_seq=last)
        self.events.flush()
        self.log.warning("a backup joined: whole state shipped, no longer degraded", operator=self.op,
                         backup=joined[-1].get("name"), last_seq=last, outputs=len(seqs))

    # --- promotions ---------------------------------------------------------------------------
    def take_over(self, epoch: int) -> None:
        """HAMS §IV-E: the backup becomes the primary with the state it applied."""
        t0 = time.monotonic()
        algorithm2, kept = self.backup_side.hand_over()  # what I applied as the backup, and its outputs
        max_seq = algorithm2.max_applied_seq
        state = algorithm2.folded.at() if algorithm2.applied is not None else {}
        self.role_record.become("promoted", epoch=epoch)
        self.model = self._new_model(self.spec)
        self.model.start()
        if self.stash is not None:  # ls: a cold standby; its state is the latest checkpoint, the rest is replayed
            state, max_seq = self.stash.from_checkpoint(state, max_seq)
        if state:
            self.model.load_state(state)
        if self.stash is not None:
            self.events.write("replay", operator=self.op, epoch=epoch, checkpoint_seq=max_seq,
                             load_ms=round(1000 * (time.monotonic() - t0), 3))
        self.own = lin.Backup(self.op, self.graph.stateful, epoch)
        self.own.durable, self.own.max_applied_seq = algorithm2.durable, max_seq  # what it knew stays known
        self.takeovers += 1
        self.next_seq = max_seq + 1
        self.outputs = kept
        self.taken = {p: set() for p in self.preds}
        self.events.write("takeover", operator=self.op, epoch=epoch, max_seq=max_seq)
        for msg in self.outputs.values():  # saved copies, never recomputed; successors drop duplicates
            for target in self.succs:
                self.links.send_on(target, msg)
        self.links.announce_durable(epoch, max_seq, successors=True)
        for p in self.preds:
            self.links.ack_pred(p, self.op, epoch, self.consumed)
        for successor, (its_epoch, after) in self.early_acks.items():
            self._on_successor_ack(successor, its_epoch, after)
        self.early_acks = {}
        self.log.warning("promoted: primary (degraded, no backup)", operator=self.op, epoch=epoch, max_seq=max_seq,
                         resent=len(self.outputs), ms=round(1000 * (time.monotonic() - t0), 2))

    def take_over_stateless(self, epoch: int) -> None:
        """HAMS §IV-E, a stateless operator: the hot standby serves it, numbering on once
        its successors said the highest seq they took (``GraphAck`` from a successor)."""
        self.role_record.become("promoted", epoch=epoch)
        self.model, self.standby_for = self.standby_for[self.op], {}
        self.takeovers += 1
        self.numbering, self.next_seq = True, 0
        self.events.write("takeover", operator=self.op, epoch=epoch, max_seq=-1)
        self.log.warning("promoted: hot standby serves", operator=self.op, epoch=epoch)

    # --- after a failure elsewhere: resends, roll-backs ---------------------------------------
    def _report_taken(self, op: str, epoch: int, endpoint: str) -> None:
        """A stateless predecessor was replaced: tell its standby the highest seq I took
        from it, and its predecessors the highest of their seqs on those outputs."""
        self.links.send(endpoint, GraphAck(op, epoch, self.took.get(op, -1)))
        before = self.took_before.get(op, {})
        for p in self.graph.predecessors(op):
            self.links.ack_pred(p, op, epoch, before)

    def _on_successor_ack(self, successor: str, epoch: int, after: int) -> None:
        if epoch > self.epochs.get(successor, 0):  # its promotion has not reached my feed yet
            self.resend_after[successor] = (epoch, after)
        else:
            self._resend(successor, after)

    def _resend(self, successor: str, after: int) -> None:
        """A successor's new primary holds my outputs up to ``after``: send the rest again,
        in seq order (a stateful successor's state depends on the order)."""
        self.awaiting.discard(successor)
        msgs = [m for s, m in self.outputs.items() if s > after]
        for msg in msgs:
            self.links.send_on(successor, msg)
        self.log.info("resent by lineage", successor=successor, after=after, count=len(msgs))

    def _watch_backup(self) -> None:
        """A stateful primary notes when its socket to its backup disconnects (the backup died)."""
        monitor = self.peers.get(self.config.peers[f"{self.op}.backup"]).get_monitor_socket(zmq.EVENT_DISCONNECTED)

        def on_event(sock: zmq.Socket) -> None:
            if transport.disconnect_seen(sock) and not self.backup_lost:
                self.backup_lost = time.monotonic()
        self.add_socket(monitor, on_event)
        self.every(0.05, self._on_backup_lost)

    def _on_backup_lost(self, now: float) -> None:
        """My backup died and no predecessor's takeover made me roll back within a grace
        (its detection, ~100 ms): go on alone from my newest shipped state, degraded, at a
        new epoch (my states no longer reach a backup: the window would stall every batch)."""
        if self.backup_lost and self.role_record.role is OperatorRole.PRIMARY and self.statemgr is not None and now - self.backup_lost > BACKUP_GRACE_S:
            self._roll_back_in_place(None, -1)

    def _roll_back(self, pred: str, max_seq: int) -> None:
        """My state took ``pred``'s outputs above its new primary's max_seq: roll back in
        place if I kept a state that took none of them, else step down and have the manager
        promote my backup (its state never took them)."""
        group = f"graph/{self.op}"
        others = [v["name"] for k, v in self.manager.feed.values.items()
                  if k.startswith("service/") and v.get("group") == group and v.get("name") != self.member]
        self.log.warning("rolling back: my state took outputs of a failed predecessor", predecessor=pred,
                         max_seq=max_seq, took=self.took.get(pred), backup=others[:1], backup_lost=self.backup_lost)
        if self.statemgr is not None and self._saved_without(pred, max_seq) is not None:
            self._roll_back_in_place(pred, max_seq)
            return
        alone = self.role_record.role is OperatorRole.DEGRADED
        self.role_record.become("roll_back_to_backup")
        self.model = None
        self.outputs.clear()
        self._drop_pending()
        if not others or alone:
            self.log.error("no backup to roll back to", operator=self.op)
            return
        epoch = self.epochs.get(self.op, 0)
        self.manager.request("promote", {"group": group, "name": others[0], "epoch": epoch, "expected_epoch": epoch,
                                         "reason": f"rollback: {pred} recovered at {max_seq}"},
                             lambda result: self.log.warning("rollback decided", result=result),
                             timeout_s=PROMOTE_TIMEOUT_S)  # unanswered: promoted when my heartbeats stop

    def _drop_pending(self, last: int = -1) -> None:
        """A roll-back to the state at seq ``last``: inputs queued or half-joined came after
        it (kept, they would run first, out of seq order, and again when resent), and so did
        held sends of outputs above it."""
        self.queue.clear()
        self.joining.clear()
        self.batcher.drop_computing()
        for seq in [s for s in self.held if s > last]:
            del self.held[seq]

    def _saved_without(self, pred: str | None, max_seq: int):
        """(last seq, tensors, lineage) of the newest state I shipped that took nothing of
        ``pred`` above ``max_seq``; a fresh state under the strawman (it keeps none); None."""
        self.statemgr.wait_copy()  # the newest batch's state is saved once copied
        good = [st for st in self.statemgr.saved.values()
                if not any(e.operator == pred and e.seq > max_seq for e in st.lineage)]
        if good:
            return good[-1].last_seq, self.statemgr.state_at(good[-1].last_seq), good[-1].lineage
        # The state before my first batch, when none of mine is durable yet: every state I
        # shipped is still saved (only states older than a durable one are let go), so none
        # took nothing of pred's, and no reply waits on any of them. Fig. 6 right after the
        # start: o3's first state took o2's lost outputs and o3's backup died with o2.
        if not self.mode.ships_state or self.statemgr.durable_seq < 0:
            return -1, {}, []
        return None

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
            self.role_record.become("no_saved_state")
            self.model = None
            self.outputs.clear()
            self.log.error("no consistent saved state to roll back to", operator=self.op)
            return
        self.role_record.become("roll_back_in_place")
        current = self.epochs.get(self.op, 0)
        reason = f"rollback in place: {pred} recovered at {max_seq}" if pred else "backup lost: goes on alone"
        self.manager.request("promote", {"group": f"graph/{self.op}", "name": self.member, "epoch": current,
                                         "expected_epoch": current, "reason": reason},
                             lambda result: self._rolled_back(result, good), timeout_s=PROMOTE_TIMEOUT_S)

    def _rolled_back(self, result: dict, good: tuple) -> None:
        """The manager's answer to my roll-back in place: go on from the saved state ``good``
        at the new epoch, or (refused, or no answer in time) step down."""
        if result.get("status") != "ok":
            self.role_record.become("manager_refused")
            self.model = None
            self.outputs.clear()
            self.log.error("rollback in place refused", result=result)
            self._replay_deferred()
            return
        last, tensors, lineage = good
        epoch = result["epoch"]
        self._drop_pending(last)  # what came after the state I go on from: my acks below have it resent, in order
        self.statemgr.close()
        self.statemgr = None
        self.model = self._new_model(self.spec)
        self.model.start()
        if tensors:
            self.model.load_state(tensors)
        self.next_seq = last + 1
        for seq in [s for s in self.outputs if s > last]:
            del self.outputs[seq]  # numbered after the state I go on from: re-run, never released
        self.applied.forget_after(last)  # the requests applied after it come again and apply again
        self.consumed = {p: -1 for p in self.preds}
        for e in lineage:
            if e.operator == self.op and e.predecessor in self.preds:
                source = lin.source_of(e.predecessor, e.predecessor_seq)
                self.consumed[source] = max(self.consumed.get(source, -1), e.predecessor_seq)
        self.took = dict(self.consumed)
        self.taken = {}
        # resync needs consecutive seqs: an operator's, or a frontend numbering its graph requests from
        # 0; a frontend incarnation's origins skip what it sent elsewhere (it waits for my ack instead)
        self.resync = {p: seq + 1 for p, seq in self.consumed.items() if "#" not in p}
        self.own = lin.Backup(self.op, self.graph.stateful, epoch)
        self.own.max_applied_seq = last
        self.role_record.become("manager_ok", epoch=epoch, confirmed=True)
        self.takeovers += 1
        # the only copy of this state now: it counts as applied (the invariants' record, on disk first)
        if last >= 0:
            self.events.write("apply", operator=self.op, last_seq=last, epoch=epoch, degraded=True,
                             lineage=[e.to_json() for e in lineage])
        self.events.write("takeover", operator=self.op, epoch=epoch, max_seq=last, rollback=True)
        self.events.flush()
        self.links.announce_durable(epoch, last, successors=True)
        for p in self.preds:
            self.links.ack_pred(p, self.op, epoch, self.consumed)
        self.log.warning("rolled back in place", operator=self.op, epoch=epoch, last_seq=last)
        self._replay_deferred()
