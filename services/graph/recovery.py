"""HAMS II for one operator (§IV-E): the manager's word (its change feed and heartbeat
answers) and every edge of the role table it drives (``services.graph.roles``):
promotions, fencing and rejoining, a new backup brought up, resends by lineage, and the
acks and notices that belong to them; roll-backs are ``services.graph.rollback``. No call
here waits for the manager: a decision this operator asks for (``promote``, to roll back)
goes through ``ManagerLink.request`` and its answer is handled in the loop.

A stateful operator's primary and backup are the group ``graph/<operator>``; the backup
reports the primary suspected when its socket to it disconnects, and the manager promotes
it (a new epoch, in the Raft log) when the primary stops heartbeating. Every graph process
follows the group's holder in the change feed (where to send). A holder numbers and sends
only while the manager confirmed it within ``LEASE_S``: a frozen primary (SIGSTOP) keeps
its sockets open, so only the manager's silence window detects it; thawed, it finds its
lease lapsed, sends nothing until the manager answers, and the answer (a newer holder)
fences it; it rejoins as the new primary's backup under a new name.

An object of its own (``Recovery``), wired by ``services.graph.operator.GraphOperator``:
given the role record, the shared tables (``services.graph.tables``), the send functions,
the backup side and what it needs of the batch, and reading nothing else of the operator.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from keel.common import transport
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphState
from keel.services.graph import lineage as lin
from keel.services.graph.applied import AppliedRequests
from keel.services.graph.roles import BACKING, SERVING, OperatorRole, RoleRecord
from keel.services.graph.statemgr import pack
from keel.services.graph.tables import Inputs, Serving, Tables

#: a holder numbers and sends only this long after the manager last confirmed it: under
#: the manager's silence window (``ManagerConfig``: 5 heartbeats of 30 ms = 150 ms), so a
#: primary thawed after the manager replaced it cannot release before it learns so
LEASE_S = 0.1


R = OperatorRole


class Recovery:
    """Parameters: ``op`` my operator, ``name`` my process's name, ``graph`` its graph
    (``read_graph``), ``stateful`` (am I a stateful operator of it); ``roles`` my role
    record (its ``clock`` is the one clock read here); ``serving``, ``tables``, ``inputs`` (``services.graph.tables``); ``links`` (the
    send functions) and ``endpoints`` (peer name -> endpoint, changed as holders move),
    ``peers`` (the connections, to watch a holder); ``backup_side``; ``stash`` (``ls``'s
    checkpoints, or None); ``events`` and ``log``; ``new_model(spec)``,
    ``new_statemgr(endpoint)``; ``drop_computing()`` voids the batch computing;
    ``roll_back(pred, max_seq)`` (``services.graph.rollback``); ``standby_for`` (a
    standby's loaded models, or a backup's own); ``every`` (the loop's timers). The manager's link comes
    with ``link``."""

    def __init__(self, op: str, name: str, graph, stateful: bool, roles: RoleRecord, serving: Serving,
                 tables: Tables, inputs: Inputs, links, endpoints: dict[str, str], peers: transport.Peers,
                 backup_side, stash, events, log, new_model: Callable, new_statemgr: Callable,
                 drop_computing: Callable, roll_back: Callable, standby_for: dict, every: Callable):
        self.op, self.name, self.graph, self.stateful = op, name, graph, stateful
        self.spec, self.preds, self.succs = graph.operators[op], graph.predecessors(op), graph.successors(op)
        self.roles, self.serving, self.tables, self.inputs = roles, serving, tables, inputs
        self.links, self.endpoints, self.peers = links, endpoints, peers
        self.backup_side, self.stash, self.events, self.log = backup_side, stash, events, log
        self.new_model, self.new_statemgr, self.drop_computing = new_model, new_statemgr, drop_computing
        self.roll_back, self.standby_for, self.every = roll_back, standby_for, every
        self.manager = None  # the manager's link (``link``)
        self.deferred: deque = deque()  # what reached a rolling-back primary, handled once it is decided
        self.resend_after: dict[str, tuple[int, int]] = {}  # successor -> (its epoch, my seq it holds)
        self.early_acks: dict[str, tuple[int, int]] = {}  # the same, come while I was still the backup
        self.epochs: dict[str, int] = {}  # operator -> newest epoch of its group seen in the feed
        self.notice_epochs: dict[str, int] = {}  # operator -> newest epoch of its durability notices
        self.fenced = False  # a newer holder of my group existed: I released nothing more at my old epoch
        self.takeovers = 0
        self.numbering = False  # a promoted standby waits for a successor's highest seq before it numbers
        self.holders_seen: set[str] = set()  # who held my group (a joining backup is none of them)
        self.relaying = False  # a primary with a joined backup: notices meant for my backup reach me; I pass them on

    # --- the manager's word ----------------------------------------------------------------
    def link(self, manager) -> None:
        """The manager's link is made (``Service.link_manager``, with ``on_manager_change``
        and ``on_role``): follow its feed from what it holds already."""
        self.manager = manager
        if self.roles.role in BACKING or self.roles.role is R.STANDBY:  # a disconnect of my socket to the primary: report it at once
            holder = manager.holder(f"graph/{self.op}")[0] if self.roles.role is R.REJOINING else None
            manager.watch(self.peers.get(self.endpoints[self.op]), holder or f"op-{self.op}")
        for key, value in list(manager.feed.values.items()):
            self.on_manager_change(key, value)
        if self.stateful:
            self.every(0.1, self._ask_for_state)  # only while rejoining (a joiner, a fenced old primary)

    def defer(self, fn: Callable[[], None]) -> None:
        """``fn`` once my roll-back is decided (the role the manager gives handles it)."""
        self.deferred.append(fn)

    def _replay_deferred(self) -> None:
        """What reached me while I rolled back, handled now by the role the manager gave me."""
        while self.deferred and self.roles.role is not R.ROLLING_BACK:
            self.deferred.popleft()()

    def on_decided(self, rolled_back: bool) -> None:
        """The manager answered my roll-back in place (``RollBack``): went on from a saved state, or not."""
        if rolled_back:
            self.takeovers += 1
        self._replay_deferred()

    def group_epoch(self) -> int:
        """The newest epoch of my own group the feed showed."""
        return self.epochs.get(self.op, 0)

    def on_manager_change(self, key: str, value: dict | None) -> None:
        if self.roles.role is R.ROLLING_BACK:  # acted on once my own epoch is decided, in order
            self.deferred.append(lambda: self.on_manager_change(key, value))
            return
        if self.manager is None or not key.startswith("group/graph/") or not value or not value.get("holder"):
            return
        op, holder, epoch = key[len("group/graph/"):], value["holder"], value.get("epoch", 0)
        endpoint = ((self.manager.feed.values.get(f"service/{holder}") or {}).get("endpoints") or {}).get("inbox")
        if endpoint is None or epoch <= self.epochs.get(op, 0):
            return
        if op in self.epochs and op in self.succs and self.stateful:
            self.serving.awaiting.add(op)  # a takeover: its ack says where my resend starts; keep seq order till then
        if op in self.epochs and op in self.preds and not self.graph.operators[op].stateful and self.roles.role in SERVING:
            self._report_taken(op, epoch, endpoint)  # the serving successor's word (a backup's took nothing)
        if op in self.epochs and op in self.preds and self.inputs.taken is not None and self.roles.role in SERVING:
            # I took over, and so did my predecessor (both failed together): my ack may have gone
            # to its dead primary; its new one waits for it before it sends me anything
            self.links.send(endpoint, GraphAck(self.op, self.roles.epoch, self.tables.consumed.get(op, -1)))
        if op in self.epochs and op != self.op and op in self.graph.stateful:
            self.endpoints[f"{op}.backup"] = endpoint  # a new primary: its own durability (degraded) or relayed
            self._renotify(op, endpoint)
        if op == self.op:
            self.holders_seen.add(holder)
        self.epochs[op] = epoch
        self.endpoints[op] = endpoint  # where op's inputs, acks and GC notices go from now on
        if op == self.op:
            self.on_role(holder, epoch)
        pending = self.resend_after.get(op)
        if pending is not None and pending[0] <= epoch:
            del self.resend_after[op]
            self._resend(op, pending[1])

    def on_role(self, holder: str | None, epoch: int) -> None:
        """The manager's applied decision for my group (feed or heartbeat answer); an older
        epoch than one already seen (a lagging replica's answer) changes nothing."""
        if self.roles.role is R.ROLLING_BACK:
            self.deferred.append(lambda: self.on_role(holder, epoch))
            return
        me = self.member
        previous = self.roles.heard(holder, me, epoch)
        if previous is None:
            return
        if holder not in (None, me) and self.roles.role is R.BACKUP and previous and epoch > previous and self.manager:
            # my primary rolled back in place at a new epoch: my states are of its old one
            self.roles.become("primary_moved", epoch=epoch)
            self._catch_up(epoch)
            self.log.warning("my primary moved to a new epoch: catching up again", holder=holder, epoch=epoch)
            return
        if holder == me and self.roles.role in BACKING:
            self.take_over(epoch)
        elif holder == me and self.roles.role is R.STANDBY:
            self.take_over_stateless(epoch)
        elif holder not in (None, me) and self.roles.role in SERVING:
            rejoin = self.stateful and self.manager is not None
            mine = self.roles.epoch  # the epoch I held my group in, fenced at
            if rejoin:
                self.roles.become("newer_holder", epoch=epoch)  # I rejoin at the holder's epoch
            else:
                self.roles.become("newer_holder_alone")
            self.serving.model = None  # fenced: a newer holder exists; nothing more leaves from here
            self.serving.queue.clear()
            self.drop_computing()
            self.serving.held.clear()
            self.serving.outputs.clear()
            self.fenced = True
            self.events.write("fenced", operator=self.op, epoch=mine, holder=holder, holder_epoch=epoch)
            self.log.warning("stale primary: stepped down, fenced", holder=holder, epoch=epoch)
            if rejoin:
                self._rejoin(holder, epoch)

    def _renotify(self, op: str, endpoint: str) -> None:
        """``op`` has a new holder that runs Algorithm 2 itself (degraded, from a fresh view
        of durability after a roll-back): my notices so far went to its old backup, and the
        newest may have gone while the manager was slow to tell me; it gets my newest again."""
        role = self.roles.role
        newest = self.backup_side.max_applied_seq if role in BACKING else \
            self.serving.own.max_applied_seq if role is R.DEGRADED else -1
        if op in self.graph.next_stateful(self.op) and newest >= 0:
            self.links.send(endpoint, GraphDurable(self.op, self.roles.epoch, newest))

    @property
    def member(self) -> str:
        """My name in the manager's group (a fenced primary rejoins under a new one)."""
        return self.manager.me["name"] if self.manager is not None and self.manager.me else self.name

    def leased(self) -> bool:
        """May I number and send? Without a manager always; with one, a holder only while
        the manager confirmed it within ``LEASE_S`` (a thawed primary waits for its word)."""
        return self.manager is None or self.roles.role not in SERVING or self.roles.leased(LEASE_S)

    def may_number(self) -> bool:
        """May a batch start (``GraphOperator.tick``)? Not while a promoted standby waits for
        a successor's highest seq, nor outside my lease."""
        return not self.numbering and self.leased()

    # --- acks and notices that recovery acts on ----------------------------------------------
    def ack_at_standby(self, msg: GraphAck) -> None:
        if msg.operator == self.op and msg.epoch > self.roles.newest:
            # Addressed to the group's new holder: a successor read my promotion in the feed
            # before I did. Dropping its word left me waiting to number for ever.
            self.on_role(self.member, msg.epoch)
            if self.roles.role is R.STATELESS:
                self.ack_at_stateless(msg)

    def ack_at_stateless(self, msg: GraphAck) -> None:
        if msg.operator == self.op and self.numbering:
            self.serving.next_seq = max(self.serving.next_seq, msg.seq + 1)  # a successor's highest: number on from there
            self.numbering = False  # one successor's word (several successors: not yet: docs/design/hams.md, Limits)
        elif msg.operator in self.succs:
            self.on_successor_ack(msg.operator, msg.epoch, msg.seq)

    def ack_at_degraded(self, msg: GraphAck) -> None:
        if msg.operator in self.succs:
            self.on_successor_ack(msg.operator, msg.epoch, msg.seq)
        elif msg.operator == self.op and self.roles.current(msg.epoch):
            self._bring_up_backup()  # a member joined my group and asks for my whole state

    def ack_at_backup(self, msg: GraphAck) -> None:
        if msg.operator in self.succs:
            # a successor and I failed together, and its takeover's ack reached me before my
            # own promotion did: kept for it (dropped, I waited for it for ever: nothing went on)
            self.early_acks[msg.operator] = (msg.epoch, msg.seq)

    def on_notice(self, msg: GraphDurable) -> bool:
        """A durability notice, first for recovery: relayed to my backup (I hold a joined
        one), and a takeover upstream (a newer epoch of its sender) that my state took more
        of than its new primary's state holds: I roll back (True: nothing more to do)."""
        if self.relaying and msg.operator != self.op:  # others send my backup's notices to the holder: pass them on
            self.links.to(f"{self.op}.backup", msg)
        if msg.epoch > self.notice_epochs.get(msg.operator, 1) and msg.operator != self.op:  # 1: the spec's epoch
            self.notice_epochs[msg.operator] = msg.epoch  # a takeover upstream, its state up to msg.seq
            if self.roles.role in BACKING:
                self.backup_side.forget_after(msg.operator, msg.seq)
            elif msg.operator in self.preds and self.roles.role in SERVING and self.inputs.took.get(msg.operator, -1) > msg.seq:
                self.roll_back(msg.operator, msg.seq)
                return True
        return False

    # --- backups: joining, catching up ------------------------------------------------------
    def _catch_up(self, epoch: int) -> None:
        """A backup at ``epoch`` (my role record moved to it) that waits for the holder's
        whole state: nothing of an older epoch is kept, and my notices (the holder's window
        acks) carry ``epoch`` (the holder ignores acks of another epoch: its window would
        never move)."""
        self.backup_side.start(epoch)
        self.tables.consumed = {}
        self.tables.applied = AppliedRequests()  # the holder's whole state brings its table

    def _rejoin(self, holder: str, epoch: int) -> None:
        """HAMS §IV-E: "the old primary can immediately work as a backup by overwriting its
        state with the new primary's". Fenced, I join the group again as a new member (a new
        name: the new primary ships only to a member that never held the group) and ask the
        holder for its whole state, like a backup started after a failover."""
        if self.serving.statemgr is not None:
            self.serving.statemgr.close()
            self.serving.statemgr = None
        self._catch_up(epoch)
        self.inputs.took, self.inputs.took_before = {}, {}
        self.manager.me = {**self.manager.me, "name": f"{self.name}~{epoch}"}
        self.manager.registered = False  # registers the new name at its next heartbeat
        endpoint = ((self.manager.feed.values.get(f"service/{holder}") or {}).get("endpoints") or {}).get("inbox")
        if endpoint:
            self.endpoints[self.op] = endpoint
            self.manager.watch(self.peers.get(endpoint), holder)

    def _ask_for_state(self, _now: float) -> None:
        """A joining backup asks the group's primary for its whole state until it arrives."""
        if self.roles.role is R.REJOINING:
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
        self.endpoints[f"{self.op}.backup"] = endpoint
        outputs = self.serving.outputs
        seqs = sorted(outputs)
        last = self.serving.next_seq - 1
        meta = {"whole": True, "origins": [outputs[s].origin for s in seqs], "streams": [outputs[s].stream for s in seqs],
                "requests": [outputs[s].request for s in seqs], "reply_to": [outputs[s].reply_to for s in seqs],
                "consumed": dict(self.tables.consumed), "durable": dict(self.serving.own.durable.seqs),
                "table": self.tables.applied.to_json()}  # the requests this state holds travel with it
        blob = pack(self.serving.model.state_arrays(), {s: outputs[s].input for s in seqs}, meta)
        lineage = lin.join(outputs[s].lineage for s in seqs)
        self.links.send(endpoint, GraphState(self.op, self.roles.epoch, seqs[0] if seqs else last, last, lineage, blob))
        self.roles.become("backup_joined")
        self.serving.statemgr = self.new_statemgr(endpoint)
        self.serving.own, self.relaying = None, True
        self.events.write("backup_joined", operator=self.op, epoch=self.roles.epoch, backup=joined[-1].get("name"),
                          last_seq=last)
        self.events.flush()
        self.log.warning("a backup joined: whole state shipped, no longer degraded", operator=self.op,
                         backup=joined[-1].get("name"), last_seq=last, outputs=len(seqs))

    # --- promotions ---------------------------------------------------------------------------
    def take_over(self, epoch: int) -> None:
        """HAMS §IV-E: the backup becomes the primary with the state it applied."""
        t0 = self.roles.clock()
        serving = self.serving
        algorithm2, kept = self.backup_side.hand_over()  # what I applied as the backup, and its outputs
        max_seq = algorithm2.max_applied_seq
        state = algorithm2.folded.at() if algorithm2.applied is not None else {}
        self.roles.become("promoted", epoch=epoch)
        serving.model = self.standby_for.pop(self.op, None) or self.new_model(self.spec)  # built while backing
        serving.model.start()
        if self.stash is not None:  # ls: a cold standby; its state is the latest checkpoint, the rest is replayed
            state, max_seq = self.stash.from_checkpoint(state, max_seq)
        if state:
            serving.model.load_state(state)
        if self.stash is not None:
            self.events.write("replay", operator=self.op, epoch=epoch, checkpoint_seq=max_seq,
                              load_ms=round(1000 * (self.roles.clock() - t0), 3))
        serving.own = lin.Backup(self.op, self.graph.stateful, epoch)
        serving.own.durable, serving.own.max_applied_seq = algorithm2.durable, max_seq  # what it knew stays known
        self.takeovers += 1
        serving.next_seq = max_seq + 1
        serving.outputs = kept
        self.inputs.taken = {p: set() for p in self.preds}
        self.events.write("takeover", operator=self.op, epoch=epoch, max_seq=max_seq)
        for msg in serving.outputs.values():  # saved copies, never recomputed; successors drop duplicates
            for target in self.succs:
                self.links.send_on(target, msg)
        self.links.announce_durable(epoch, max_seq, successors=True)
        for p in self.preds:
            self.links.ack_pred(p, self.op, epoch, self.tables.consumed)
        for successor, (its_epoch, after) in self.early_acks.items():
            self.on_successor_ack(successor, its_epoch, after)
        self.early_acks = {}
        self.log.warning("promoted: primary (degraded, no backup)", operator=self.op, epoch=epoch, max_seq=max_seq,
                         resent=len(serving.outputs), ms=round(1000 * (self.roles.clock() - t0), 2))

    def take_over_stateless(self, epoch: int) -> None:
        """HAMS §IV-E, a stateless operator: the hot standby serves it, numbering on once
        its successors said the highest seq they took (``GraphAck`` from a successor)."""
        self.roles.become("promoted", epoch=epoch)
        self.serving.model, self.standby_for = self.standby_for[self.op], {}
        self.takeovers += 1
        self.numbering, self.serving.next_seq = True, 0
        self.events.write("takeover", operator=self.op, epoch=epoch, max_seq=-1)
        self.log.warning("promoted: hot standby serves", operator=self.op, epoch=epoch)

    # --- after a failure elsewhere: resends by lineage -----------------------------------------
    def _report_taken(self, op: str, epoch: int, endpoint: str) -> None:
        """A stateless predecessor was replaced: tell its standby the highest seq I took
        from it, and its predecessors the highest of their seqs on those outputs."""
        self.links.send(endpoint, GraphAck(op, epoch, self.inputs.took.get(op, -1)))
        before = self.inputs.took_before.get(op, {})
        for p in self.graph.predecessors(op):
            self.links.ack_pred(p, op, epoch, before)

    def on_successor_ack(self, successor: str, epoch: int, after: int) -> None:
        if epoch > self.epochs.get(successor, 0):  # its promotion has not reached my feed yet
            self.resend_after[successor] = (epoch, after)
        else:
            self._resend(successor, after)

    def _resend(self, successor: str, after: int) -> None:
        """A successor's new primary holds my outputs up to ``after``: send the rest again,
        in seq order (a stateful successor's state depends on the order)."""
        self.serving.awaiting.discard(successor)
        msgs = [m for s, m in self.serving.outputs.items() if s > after]
        for msg in msgs:
            self.links.send_on(successor, msg)
        self.log.info("resent by lineage", successor=successor, after=after, count=len(msgs))

    def status(self) -> dict:
        info = dict(takeovers=self.takeovers, fenced=self.fenced)
        if self.standby_for:
            info.update(standby_for=sorted(self.standby_for), ready=True)
        return info
