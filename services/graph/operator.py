"""One operator of a HAMS service graph, as a process: a stateless operator, a stateful
operator's primary or backup (each with its ``statemgr``), or the hot standby of one kind
of stateless operator (§II-B: its models loaded, serving nothing until HAMS II promotes it).
An interleaving join queues each input as it arrives; a combining join waits for every
predecessor's output of a request and concatenates them.

Frames in (one PULL, ``endpoint``): ``GraphRequest`` from predecessors, ``GraphState``
(backup, from its primary), ``GraphAck`` and ``GraphDurable`` (primary, from its backup;
backups, from previous stateful models' backups; everyone, from the frontend: replies up
to that origin have left the graph, so saved outputs can go).

The primary's batch (``step``), per mode (``common.spec.modes``)::

    compute(batch n)            reads the state only
    outputs -> successors       at once (nspb, s2, bare); after the backup has state n (s1, remus)
    wait: copy of n-1 finished and < W states in flight      (nspb, s1)
    update(batch n)             changes the state
    copy state n                in the background while n+1 computes (nspb, s1); stopped (s2, remus)

The backup runs Algorithm 2 (``services.graph.lineage.Backup``) and, for each applied
state, notifies the next stateful models' backups, the frontend and its primary; it keeps
the applied outputs (with their origin, stream and lineage) until their replies left.

HAMS II, with a manager (``config.manager``): a stateful operator's primary and
backup are the group ``graph/<operator>``; the backup reports the primary suspected when
its socket to it disconnects, and the manager promotes it (a new epoch, in the Raft log)
when the primary stops heartbeating. Every graph process follows the group's holder in the
change feed (where to send). The promoted backup (``take_over``, §IV-E): loads the state
it applied (max_seq = its last seq), numbers on from max_seq + 1, resends its saved outputs
up to max_seq (successors drop what they have), tells the frontend and the next backups
that max_seq is durable at the new epoch (the frontend drops held outputs above it) and
each predecessor up to which of its seqs the state holds (``GraphAck`` from a successor:
resend the rest). Until a new backup exists it runs *degraded*: it declares its own
states durable. A primary that sees another holder at a newer epoch steps down and
releases nothing more (fencing). A holder also numbers and sends only while the manager
confirmed it within ``LEASE_S`` (its heartbeat answers or the feed name it the holder): a
frozen primary (SIGSTOP) keeps its sockets open, so only the manager's silence window
detects it; thawed, it finds its lease lapsed (checked before a batch and again before
it numbers the batch's outputs: a freeze mid-batch re-queues the batch), sends nothing
until the manager answers, and the answer (a newer holder) fences it: it says so (status ``fenced``,
trace ``fenced``) and rejoins as the new primary's backup under a new name, asking it for
its whole state (``_rejoin``, HAMS §IV-E).

A stateless operator and the hot standby of its kind are the group ``graph/<operator>``
too (the standby of a kind stands by for the first operator of that kind). When the
standby is promoted (``take_over_stateless``), each successor tells it the highest seq of
the failed operator it took (the standby numbers on from the highest) and tells the
failed operator's predecessors the highest of their seqs on those outputs' lineage
(``GraphAck``: resend the rest); the standby re-runs what they resend.

Downstream of a stateful takeover (max_seq at a new epoch, the ``GraphDurable`` the new
primary sends its successors and the next backups): a successor's primary that took an
output above max_seq rolls back: it steps down and asks the manager to promote its
backup, whose state (Algorithm 2) never took one; a backup drops pending states that did.
Every operator drops an input whose seq it already took from that sender (resends); the
frontend's seqs are origins, taken per frontend incarnation (several frontends interleave).

Exactly-once effects (docs/design/hams.md): a stateful operator answers an input whose
request key its state applied already from its table (``services.graph.applied``) instead of
applying it again; the table ships with the state and is the backup's as of the state it
applied. An output leaving the graph goes to its request's ``reply_to``; durability notices
go to every frontend (``config.frontends``); the GC horizon is per frontend incarnation.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict, deque

import numpy as np
import zmq

from keel.common import transport
from keel.common.ids import epoch_of
from keel.common.config import GraphOperatorConfig
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest, GraphState
from keel.common.spec.graph import FRONTEND, operator_class, read_graph
from keel.common.spec.modes import MODES
from keel.services.base import Service
from keel.services.graph import lineage as lin
from keel.services.graph.applied import AppliedRequests
from keel.services.graph.assignment import EpochRole
from keel.services.graph.models import GraphBatch
from keel.services.graph.statemgr import StateManager, header_of, pack, read_checkpoint, unpack, write_checkpoint
from keel.services.graph.trace import Trace


#: a holder numbers and sends only this long after the manager last confirmed it: under
#: the manager's silence window (``ManagerConfig``: 5 heartbeats of 30 ms = 150 ms), so a
#: primary thawed after the manager replaced it cannot release before it learns so
LEASE_S = 0.1

#: a primary whose backup disconnected waits this long for a predecessor's takeover note (Fig. 6:
#: roll back to a state that took nothing above its max_seq) before it goes on alone
BACKUP_GRACE_S = 0.2


def source_of(sender: str, seq: int) -> str:
    """Whose numbering ``seq`` is: an operator's, or a frontend incarnation's (the origin's
    high bits, ``keel.common.ids``). Per source seqs arrive in order (resends aside): several
    frontends interleave their origins on one edge, so "taken already" is per incarnation."""
    incarnation = epoch_of(seq) if sender == FRONTEND and seq >= 0 else 0
    return f"{sender}#{incarnation}" if incarnation else sender


class GraphOperator(Service):
    role = "graph_operator"

    def __init__(self, config: GraphOperatorConfig):
        super().__init__(config.name, config.metrics_port)
        self.config = config
        self.graph = read_graph(config.graph)
        self.spec = self.graph.operators[config.operator]
        self.op = config.operator
        self.mode = MODES[self.graph.mode]
        self.assignment = EpochRole(config.role, config.epoch)
        self.inbox = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=config.endpoint), self._on_inbox)
        self.serve_status(config.status_endpoint)
        self.peers = transport.Peers(self.ctx, on_new=self.sockets.append)
        self.queue: deque[GraphRequest] = deque()
        # (reply_to, origin) -> predecessor -> its request: origins are unique per frontend only
        self.joining: dict[tuple, dict[str, GraphRequest]] = {}
        self.preds = self.graph.predecessors(self.op)
        self.succs = self.graph.successors(self.op)
        self._shapes = {p: self.graph.input_shape if p == FRONTEND else self.graph.operators[p].output_shape
                        for p in self.preds}
        self.next_seq = 0
        # per frontend incarnation (an origin's high bits), the frontend's notice: replies up
        # to this origin left the graph (one frontend's notice frees none of another's outputs)
        self.released: dict[int, int] = {}
        self.outputs: OrderedDict[int, tuple[int, np.ndarray]] = OrderedDict()  # seq -> (origin, output)
        self.held: OrderedDict[int, list[tuple[str, GraphRequest]]] = OrderedDict()  # last seq -> held sends
        self.batches = self.rows = self.errors = 0
        self.duplicates = 0  # rows answered from the table of applied requests, not applied again
        self.lineage_s = 0.0
        self.update_wait_s = self.update_s = 0.0  # NSPB's wait before an update; the updates themselves
        self.stateful = self.spec.stateful and self.op in self.graph.stateful
        # the requests my state (a backup: the state it applied) holds: a retry is answered, not applied
        self.applied = AppliedRequests() if self.spec.stateful else None
        self.kept: OrderedDict[int, GraphRequest] = OrderedDict()  # backup: applied outputs, for a takeover
        self.consumed: dict[str, int] = {}  # backup: per predecessor, its highest seq in the applied state
        self.taken: dict[str, set[int]] | None = None  # after a takeover: inputs taken (resent duplicates dropped)
        self.degraded = False  # promoted and no backup yet: it runs Algorithm 2 on its own states
        self.own: lin.Backup | None = None  # that Algorithm 2 (degraded only)
        self.resend_after: dict[str, tuple[int, int]] = {}  # successor -> (its epoch, my seq it holds)
        self.early_acks: dict[str, tuple[int, int]] = {}  # the same, come while I was still the backup
        self.awaiting: set[str] = set()  # successors taken over whose ack I wait for: new outputs wait too (order)
        self.epochs: dict[str, int] = {}  # operator -> newest epoch of its group seen in the feed
        self.notice_epochs: dict[str, int] = {}  # operator -> newest epoch of its durability notices
        self.role_epoch = 0  # the newest epoch of my group seen (decisions older than it are stale news)
        self.confirmed = 0.0  # when the manager last said I hold my group (the lease, LEASE_S)
        self.fenced = False  # a newer holder of my group exists: I release nothing more
        self.takeovers = 0
        self.took: dict[str, int] = {}  # predecessor -> highest of its seqs taken
        # after a roll-back in place (same inbox: predecessors that have not heard of it keep
        # sending), per predecessor, the seq its resend starts at: a newer input that reaches
        # me first is dropped (it comes again in that resend, in order)
        self.resync: dict[str, int] = {}
        self.took_before: dict[str, dict[str, int]] = {}  # predecessor -> its predecessor -> highest seq on that lineage
        self.numbering = False  # a promoted standby waits for a successor's highest seq before it numbers
        self.standby = self.assignment.role == "standby"
        self.holders_seen: set[str] = set()  # who held my group (a joining backup is none of them)
        # a backup started at a manager epoch (> the spec's 1) joins a running group whose
        # primary runs degraded: it asks for the primary's whole state (§IV-E)
        self.catching_up = self.assignment.role == "backup" and config.epoch > 1 and config.manager is not None
        self.late: deque[tuple[float, GraphState]] = deque()  # states held back (spec state_delay_ms)
        if self.spec.state_delay_ms:
            self.every(0.002, self._deliver_late)
        self.backup_lost = False  # a primary's socket to its backup disconnected (Fig. 6: roll back in place)
        self.relaying = False  # a primary with a joined backup: notices meant for my backup reach me; I pass them on
        self.trace = Trace(config.trace_path)
        if self.trace:
            self.every(0.2, self.trace.flush)
        # ls (Lineage Stash): my checkpoints in global storage; since the last, how many batches
        self.since_checkpoint = 0
        self.stash_seen: dict[str, tuple[float, int]] = {}  # successor -> (its checkpoint's mtime, my seq it holds)
        self.backup = None
        self.model = None
        self.statemgr = None
        self.standby_for: dict[str, object] = {}  # a standby: operator -> its model, loaded and ready
        if self.assignment.role == "standby":
            for name, spec in self.graph.operators.items():
                if spec.kind == self.spec.kind:
                    self.standby_for[name] = self._new_model(spec)
        elif self.assignment.role == "backup":
            self.backup = lin.Backup(self.op, self.graph.stateful, self.assignment.epoch)
        else:
            self.model = self._new_model(self.spec)
            if self.model.stateful:
                self.model.start()
            if self.stateful:
                self.statemgr = StateManager(self.op, self.assignment.epoch, self.graph.window, self.mode.copy_in_background,
                                             send=lambda st: self.peers.send(config.peers[f"{self.op}.backup"], st),
                                             ctx=self.ctx, backup_endpoint=config.peers[f"{self.op}.backup"])
        self.manager = None
        if config.manager is not None:
            self._link_manager()
            if self.statemgr is not None:
                self._watch_backup()

    # --- where things go: several frontends -------------------------------------------------
    def _send_on(self, target: str, msg: GraphRequest) -> None:
        """An output to a successor; one leaving the graph to its request's frontend."""
        endpoint = msg.reply_to if target == FRONTEND and msg.reply_to else self.config.peers[target]
        self.peers.send(endpoint, msg)

    def _frontend_endpoints(self) -> list[str]:
        """Every frontend serving the graph (durability notices and acks go to each)."""
        return list(self.config.frontends) or [self.config.peers[FRONTEND]]

    def _notice_targets(self, targets: list[str]) -> list[str]:
        """Endpoints of peer names, ``FRONTEND`` standing for every frontend."""
        return [e for t in targets for e in (self._frontend_endpoints() if t == FRONTEND else [self.config.peers[t]])]

    def _announce_durable(self, epoch: int, seq: int, successors: bool = False, primary: bool = False) -> None:
        """Algorithm 2's notify: my state up to ``seq`` is durable, to every frontend and the
        backups of the next stateful models; after a takeover or a roll-back also to my
        successors (they drop what came after it), and on a backup to my primary."""
        targets = [FRONTEND] + [f"{n}.backup" for n in self.graph.next_stateful(self.op)]
        targets += [n for n in self.succs if n != FRONTEND] if successors else []
        targets += [self.op] if primary else []
        note = GraphDurable(self.op, epoch, seq)
        for endpoint in self._notice_targets(targets):
            self.peers.send(endpoint, note)

    def _new_model(self, spec):
        """A fresh model of ``spec`` (an ``OperatorSpec``): this process's, or a standby's."""
        return operator_class(spec.kind)(spec.input_shape, spec.output_shape, seed=self.config.seed, **spec.options)

    def _ack_pred(self, pred: str, operator: str, epoch: int, seqs: dict[str, int]) -> None:
        """Tell ``pred`` the highest of its seqs ``operator``'s state (or successors) hold,
        from ``seqs`` (by ``source_of``). The frontends get one ack per frontend incarnation
        seen, each to every frontend: one resends above the ack of its own incarnation, and
        everything when none carries its incarnation (-1 alone: nothing of anyone's is held)."""
        if pred != FRONTEND:
            self.peers.send(self.config.peers[pred], GraphAck(operator, epoch, seqs.get(pred, -1)))
            return
        acks = [seq for source, seq in seqs.items() if source.partition("#")[0] == FRONTEND and seq >= 0] or [-1]
        for endpoint in self._frontend_endpoints():
            for seq in acks:
                self.peers.send(endpoint, GraphAck(operator, epoch, seq))

    # --- the manager (HAMS II) -----------------------------------------------------------
    def _link_manager(self) -> None:
        me = None
        if self.stateful or self.backup is not None or self.assignment.role in ("stateless", "standby"):
            me = {"name": self.name, "group": f"graph/{self.op}", "host": "local", "endpoints": {"inbox": self.config.endpoint}}
        primary_first = self.backup is not None or self.standby  # the spec's primary takes the role first
        self.link_manager(self.config.manager, on_change=self._on_manager_change, me=me, on_role=self._on_role,
                          ready=lambda: not self.catching_up,
                          may_register=lambda: not primary_first or self.manager.holder(f"graph/{self.op}")[0])
        if self.backup is not None or self.standby:  # a disconnect of my socket to the primary: report it at once
            holder = self.manager.holder(f"graph/{self.op}")[0] if self.catching_up else None
            self.manager.watch(self.peers.get(self.config.peers[self.op]), holder or f"op-{self.op}")
        for key, value in list(self.manager.feed.values.items()):
            self._on_manager_change(key, value)
        if self.stateful:
            self.every(0.1, self._ask_for_state)  # only while catching up (a joiner, a fenced old primary)

    def _on_manager_change(self, key: str, value: dict | None) -> None:
        if self.manager is None or not key.startswith("group/graph/") or not value or not value.get("holder"):
            return
        op, holder, epoch = key[len("group/graph/"):], value["holder"], value.get("epoch", 0)
        endpoint = ((self.manager.feed.values.get(f"service/{holder}") or {}).get("endpoints") or {}).get("inbox")
        if endpoint is None or epoch <= self.epochs.get(op, 0):
            return
        if op in self.epochs and op in self.succs and self.stateful:
            self.awaiting.add(op)  # a takeover: its ack says where my resend starts; keep seq order till then
        if op in self.epochs and op in self.preds and not self.graph.operators[op].stateful and self.model is not None:
            self._report_taken(op, epoch, endpoint)  # the serving successor's word (a backup's took nothing)
        if op in self.epochs and op in self.preds and self.taken is not None and self.model is not None:
            # I took over, and so did my predecessor (both failed together): my ack may have gone
            # to its dead primary; its new one waits for it before it sends me anything
            self.peers.send(endpoint, GraphAck(self.op, self.assignment.epoch, self.consumed.get(op, -1)))
        if op in self.epochs and op != self.op and op in self.graph.stateful:
            self.config.peers[f"{op}.backup"] = endpoint  # a new primary: its own durability (degraded) or relayed
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
        if epoch < self.role_epoch:
            return
        previous, self.role_epoch = self.role_epoch, epoch
        me = self.member
        if (holder not in (None, me) and self.backup is not None and not self.catching_up and previous
                and epoch > previous and self.manager is not None):
            # my primary rolled back in place at a new epoch: my states are of its old one
            self._catch_up(epoch)
            self.log.warning("my primary moved to a new epoch: catching up again", holder=holder, epoch=epoch)
            return
        if holder == me:
            self.confirmed = time.monotonic()
        if holder == me and self.backup is not None:
            self.take_over(epoch)
        elif holder == me and self.standby and self.model is None:
            self.take_over_stateless(epoch)
        elif holder not in (None, me) and self.model is not None and self.assignment.role in ("primary", "stateless"):
            self.model = None  # fenced: a newer holder exists; nothing more leaves from here
            self.queue.clear()
            self.held.clear()
            self.outputs.clear()
            self.fenced = True
            self.trace.write("fenced", operator=self.op, epoch=self.assignment.epoch, holder=holder, holder_epoch=epoch)
            self.log.warning("stale primary: stepped down, fenced", holder=holder, epoch=epoch)
            if self.stateful and self.manager is not None:
                self._rejoin(holder, epoch)

    @property
    def member(self) -> str:
        """My name in the manager's group (a fenced primary rejoins under a new one)."""
        return self.manager.me["name"] if self.manager is not None and self.manager.me else self.name

    def _catch_up(self, epoch: int) -> None:
        """Become a backup at ``epoch`` that waits for the holder's whole state: nothing of
        an older epoch is kept, and my notices (the holder's window acks) carry ``epoch``
        (the holder ignores acks of another epoch: its window would never move)."""
        self.backup = lin.Backup(self.op, self.graph.stateful, epoch)
        self.assignment.role, self.assignment.epoch = "backup", epoch
        self.kept, self.consumed, self.catching_up = OrderedDict(), {}, True
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

    def leased(self) -> bool:
        """May I number and send? Without a manager always; with one, a holder only while
        the manager confirmed it within ``LEASE_S`` (a thawed primary waits for its word)."""
        return self.manager is None or self.backup is not None or self.standby \
            or time.monotonic() - self.confirmed < LEASE_S

    def take_over(self, epoch: int) -> None:
        """HAMS §IV-E: the backup becomes the primary with the state it applied."""
        t0 = time.monotonic()
        max_seq = self.backup.max_applied_seq
        state = unpack(self.backup.applied.state["blob"])[0] if self.backup.applied is not None else {}
        self.model = self._new_model(self.spec)
        self.model.start()
        checkpoint = read_checkpoint(self.checkpoint_path(self.op)) if self.mode.checkpoints else None
        if checkpoint is not None:  # ls: a cold standby; its state is the latest checkpoint, the rest is replayed
            state, meta = checkpoint
            max_seq = meta["last_seq"]
            self.consumed = dict(meta["consumed"])  # the predecessors resend by lineage what came after
            self.applied = AppliedRequests.from_json(meta.get("applied", []))  # the requests that state holds
        if state:
            self.model.load_state(state)
        if self.mode.checkpoints:
            self.trace.write("replay", operator=self.op, epoch=epoch, checkpoint_seq=max_seq,
                             load_ms=round(1000 * (time.monotonic() - t0), 3))
        self.assignment.role, self.assignment.epoch = "primary", epoch
        self.own = lin.Backup(self.op, self.graph.stateful, epoch)
        self.own.durable, self.own.max_applied_seq = self.backup.durable, max_seq  # what it knew stays known
        self.backup, self.degraded, self.takeovers = None, True, self.takeovers + 1
        self.next_seq = max_seq + 1
        self.outputs, self.kept = self.kept, OrderedDict()
        self.taken = {p: set() for p in self.preds}
        self.trace.write("takeover", operator=self.op, epoch=epoch, max_seq=max_seq)
        for msg in self.outputs.values():  # saved copies, never recomputed; successors drop duplicates
            for target in self.succs:
                self._send_on(target, msg)
        self._announce_durable(epoch, max_seq, successors=True)
        for p in self.preds:
            self._ack_pred(p, self.op, epoch, self.consumed)
        for successor, (its_epoch, after) in self.early_acks.items():
            self._on_successor_ack(successor, its_epoch, after)
        self.early_acks = {}
        self.log.warning("promoted: primary (degraded, no backup)", operator=self.op, epoch=epoch, max_seq=max_seq,
                         resent=len(self.outputs), ms=round(1000 * (time.monotonic() - t0), 2))

    def checkpoint_path(self, op: str) -> str:
        """ls: where ``op``'s checkpoint lies in the global storage (every process reads the same place)."""
        return os.path.join(self.graph.checkpoint_dir, f"checkpoint-{op}.bin")

    def _checkpoint(self, last: int) -> None:
        """ls: every ``checkpoint_every`` batches, my whole state (tensors, what I took per
        predecessor, my output seq) to global storage; predecessors free what it holds."""
        t0 = time.monotonic()
        write_checkpoint(self.checkpoint_path(self.op), self.model.state_arrays(),
                         {"last_seq": last, "consumed": dict(self.consumed), "epoch": self.assignment.epoch,
                          "applied": self.applied.to_json()})
        self.since_checkpoint = 0
        self.trace.write("checkpoint", operator=self.op, epoch=self.assignment.epoch, last_seq=last,
                         consumed=dict(self.consumed), ms=round(1000 * (time.monotonic() - t0), 3))
        self.trace.flush()

    def _stashed(self) -> int:
        """ls: the highest of my seqs every stateful successor's latest checkpoint holds
        (the causal log below it is no longer needed; -1: keep all)."""
        held = []
        for succ in (n for n in self.succs if n in self.graph.stateful):
            path = self.checkpoint_path(succ)
            try:
                mtime = os.stat(path).st_mtime
            except FileNotFoundError:
                return -1
            if self.stash_seen.get(succ, (None,))[0] != mtime:
                checkpoint = read_checkpoint(path)
                self.stash_seen[succ] = (mtime, checkpoint[1]["consumed"].get(self.op, -1) if checkpoint else -1)
            held.append(self.stash_seen[succ][1])
        return min(held, default=self.next_seq)

    def take_over_stateless(self, epoch: int) -> None:
        """HAMS §IV-E, a stateless operator: the hot standby serves it, numbering on once
        its successors said the highest seq they took (``GraphAck`` from a successor)."""
        self.model, self.standby_for = self.standby_for[self.op], {}
        self.assignment.role, self.assignment.epoch = "stateless", epoch
        self.standby, self.takeovers = False, self.takeovers + 1
        self.numbering, self.next_seq = True, 0
        self.trace.write("takeover", operator=self.op, epoch=epoch, max_seq=-1)
        self.log.warning("promoted: hot standby serves", operator=self.op, epoch=epoch)

    def _deliver_late(self, now: float) -> None:
        while self.late and self.late[0][0] <= now and self.backup is not None:
            self._on_state(self.late.popleft()[1])

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
        if self.backup_lost and self.statemgr is not None and self.model is not None and now - self.backup_lost > BACKUP_GRACE_S:
            self._roll_back_in_place(None, -1)

    def _ask_for_state(self, _now: float) -> None:
        """A joining backup asks the group's primary for its whole state until it arrives."""
        if self.catching_up and self.backup is not None:
            self.peers.send(self.config.peers[self.op], GraphAck(self.op, self.backup.epoch, 0))

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
        self.peers.send(endpoint, GraphState(self.op, self.assignment.epoch, seqs[0] if seqs else last, last, lineage, blob))
        self.statemgr = StateManager(self.op, self.assignment.epoch, self.graph.window, self.mode.copy_in_background,
                                     send=lambda st: self.peers.send(self.config.peers[f"{self.op}.backup"], st),
                                     ctx=self.ctx, backup_endpoint=endpoint)
        self.degraded, self.own, self.relaying = False, None, True
        self.trace.write("backup_joined", operator=self.op, epoch=self.assignment.epoch, backup=joined[-1].get("name"),
                         last_seq=last)
        self.trace.flush()
        self.log.warning("a backup joined: whole state shipped, no longer degraded", operator=self.op,
                         backup=joined[-1].get("name"), last_seq=last, outputs=len(seqs))

    def _roll_back(self, pred: str, max_seq: int) -> None:
        """My state took ``pred``'s outputs above its new primary's max_seq: step down and
        have the manager promote my backup (its state never took them)."""
        group = f"graph/{self.op}"
        others = [v["name"] for k, v in self.manager.feed.values.items()
                  if k.startswith("service/") and v.get("group") == group and v.get("name") != self.member]
        in_place = self.statemgr is not None and self._saved_without(pred, max_seq) is not None
        if not in_place:
            self.model = None
            self.outputs.clear()
            self._drop_pending()
        self.log.warning("rolling back: my state took outputs of a failed predecessor", predecessor=pred,
                         max_seq=max_seq, took=self.took.get(pred), backup=others[:1], backup_lost=self.backup_lost)
        if in_place:
            self._roll_back_in_place(pred, max_seq)
            return
        if not others or self.degraded:
            self.log.error("no backup to roll back to", operator=self.op)
            return
        try:
            result = self.manager.client.call("promote", {"group": group, "name": others[0], "epoch": self.epochs.get(self.op, 0),
                                                          "expected_epoch": self.epochs.get(self.op, 0),
                                                          "reason": f"rollback: {pred} recovered at {max_seq}"})
        except Exception as exc:  # the manager unreachable: the backup is promoted when my heartbeats stop
            result = {"status": "failed", "error": str(exc)}
        self.log.warning("rollback decided", result=result)

    def _drop_pending(self, last: int = -1) -> None:
        """A roll-back to the state at seq ``last``: inputs queued or half-joined came after
        it (kept, they would run first, out of seq order, and again when resent), and so did
        held sends of outputs above it."""
        self.queue.clear()
        self.joining.clear()
        for seq in [s for s in self.held if s > last]:
            del self.held[seq]

    def _saved_without(self, pred: str | None, max_seq: int):
        """(last seq, tensors, lineage) of the newest state I shipped that took nothing of
        ``pred`` above ``max_seq``; a fresh state under the strawman (it keeps none); None."""
        self.statemgr.wait_copy()  # the newest batch's state is saved once copied
        good = [st for st in self.statemgr.saved.values()
                if not any(e.operator == pred and e.seq > max_seq for e in st.lineage)]
        if good:
            return good[-1].last_seq, unpack(good[-1].blob)[0], good[-1].lineage
        return (-1, {}, []) if not self.mode.ships_state else None

    def _roll_back_in_place(self, pred: str, max_seq: int) -> None:
        """HAMS §IV-E, Fig. 6: ``pred`` recovered at ``max_seq`` and my state took its outputs
        above it (or, ``pred`` None, my backup died): I roll back to my previous state, the
        newest state I shipped (kept until durable) that took none of them, at a new epoch
        (the manager's compare-and-set on my own group), and go on from it degraded, as a
        promoted backup would; a live backup catches up again (its states are of my old
        epoch). Done in place whenever such a state exists: my backup may be dead without my
        knowing yet (Fig. 6: its disconnect can come after the takeover note)."""
        group = f"graph/{self.op}"
        good = self._saved_without(pred, max_seq)
        if good is None:
            self.model = None
            self.outputs.clear()
            self.log.error("no consistent saved state to roll back to", operator=self.op)
            return
        last, tensors, lineage = good
        current = self.epochs.get(self.op, 0)
        try:
            result = self.manager.client.call("promote", {"group": group, "name": self.member, "epoch": current,
                                                          "expected_epoch": current,
                                                          "reason": f"rollback in place: {pred} recovered at {max_seq}"
                                                          if pred else "backup lost: goes on alone"})
        except Exception as exc:
            result = {"status": "failed", "error": str(exc)}
        if result.get("status") != "ok":
            self.model = None
            self.outputs.clear()
            self.log.error("rollback in place refused", result=result)
            return
        epoch = result["epoch"]
        self._drop_pending(last)  # what came after the state I go on from: my acks below have it resent, in order
        self.statemgr.close()
        self.statemgr = None
        self.model = self._new_model(self.spec)
        self.model.start()
        if tensors:
            self.model.load_state(tensors)
        self.assignment.epoch, self.role_epoch, self.confirmed = epoch, epoch, time.monotonic()
        self.next_seq = last + 1
        for seq in [s for s in self.outputs if s > last]:
            del self.outputs[seq]  # numbered after the state I go on from: re-run, never released
        self.applied.forget_after(last)  # the requests applied after it come again and apply again
        self.consumed = {p: -1 for p in self.preds}
        for e in lineage:
            if e.operator == self.op and e.predecessor in self.preds:
                source = source_of(e.predecessor, e.predecessor_seq)
                self.consumed[source] = max(self.consumed.get(source, -1), e.predecessor_seq)
        self.took = dict(self.consumed)
        self.taken = {}
        # resync needs consecutive seqs: an operator's, or a frontend numbering its graph requests from
        # 0; a frontend incarnation's origins skip what it sent elsewhere (it waits for my ack instead)
        self.resync = {p: seq + 1 for p, seq in self.consumed.items() if "#" not in p}
        self.own = lin.Backup(self.op, self.graph.stateful, epoch)
        self.own.max_applied_seq = last
        self.degraded, self.takeovers = True, self.takeovers + 1
        # the only copy of this state now: it counts as applied (the invariants' record, on disk first)
        if last >= 0:
            self.trace.write("apply", operator=self.op, last_seq=last, epoch=epoch, degraded=True,
                             lineage=[e.to_json() for e in lineage])
        self.trace.write("takeover", operator=self.op, epoch=epoch, max_seq=last, rollback=True)
        self.trace.flush()
        self._announce_durable(epoch, last, successors=True)
        for p in self.preds:
            self._ack_pred(p, self.op, epoch, self.consumed)
        self.log.warning("rolled back in place", operator=self.op, epoch=epoch, last_seq=last)

    def _report_taken(self, op: str, epoch: int, endpoint: str) -> None:
        """A stateless predecessor was replaced: tell its standby the highest seq I took
        from it, and its predecessors the highest of their seqs on those outputs."""
        self.peers.send(endpoint, GraphAck(op, epoch, self.took.get(op, -1)))
        before = self.took_before.get(op, {})
        for p in self.graph.predecessors(op):
            self._ack_pred(p, op, epoch, before)

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
            self._send_on(successor, msg)
        self.log.info("resent by lineage", successor=successor, after=after, count=len(msgs))

    # --- messages -------------------------------------------------------------------
    def _on_inbox(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            if (isinstance(msg, GraphAck) and msg.operator == self.op and self.standby and self.model is None
                    and msg.epoch > self.role_epoch):
                # Addressed to the group's new holder: a successor read my promotion in the
                # feed before I did. Dropping its word left me waiting to number for ever.
                self._on_role(self.member, msg.epoch)
            if isinstance(msg, GraphRequest):
                self._on_request(msg)
            elif isinstance(msg, GraphState) and self.backup is not None and self.spec.state_delay_ms:
                self.late.append((time.monotonic() + self.spec.state_delay_ms / 1000, msg))  # Fig. 6's slow delivery
            elif isinstance(msg, GraphState) and self.backup is not None:
                self._on_state(msg)
            elif isinstance(msg, GraphAck) and msg.operator == self.op and self.numbering:
                self.next_seq = max(self.next_seq, msg.seq + 1)  # a successor's highest: number on from there
                self.numbering = False  # one successor's word (several successors: not yet: docs/design/hams.md, Limits)
            elif isinstance(msg, GraphAck) and msg.operator in self.succs and self.model is not None:
                self._on_successor_ack(msg.operator, msg.epoch, msg.seq)
            elif isinstance(msg, GraphAck) and msg.operator in self.succs and self.backup is not None:
                # a successor and I failed together, and its takeover's ack reached me before my
                # own promotion did: kept for it (dropped, I waited for it for ever: nothing went on)
                self.early_acks[msg.operator] = (msg.epoch, msg.seq)
            elif (isinstance(msg, GraphAck) and msg.operator == self.op and self.degraded and self.model is not None
                  and msg.epoch == self.assignment.epoch):
                self._bring_up_backup()  # a member joined my group and asks for my whole state
            elif isinstance(msg, GraphAck) and self.statemgr is not None and msg.operator == self.op:
                if msg.epoch == self.assignment.epoch:
                    self.statemgr.on_ack(msg.seq)
                    self._release_held(msg.seq)
            elif isinstance(msg, GraphDurable):
                self._on_durable(msg)

    def _on_request(self, msg: GraphRequest) -> None:
        if self.model is None and not self.standby:  # a backup serves nothing until promoted (HAMS II)
            return
        # a standby keeps what reaches it: it is addressed as the new holder by a peer that read
        # its promotion first (the frontend's resend); it computes once its own promotion arrives
        if msg.sender not in self.preds or tuple(msg.input.shape) != self._shapes[msg.sender]:
            self.log.error("dropped a request that is not from a predecessor or has the wrong shape",
                           sender=msg.sender[:64], shape=list(msg.input.shape))
            return  # a stray peer must not poison a batch of others' requests
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

    def _on_state(self, msg: GraphState) -> None:
        if msg.operator != self.op:
            return
        if self.catching_up and msg.epoch == self.backup.epoch and header_of(msg.blob).get("whole"):
            header = header_of(msg.blob)  # the primary's whole state: Algorithm 2 goes on from it
            self.backup.max_applied_seq = msg.first_seq - 1
            for op, seq in header["durable"].items():
                self.backup.durable.notify(op, seq)
            self.consumed.update(header["consumed"])
            self.applied = AppliedRequests.from_json(header.get("table", []))
            self.catching_up = False
            self.trace.write("joined", operator=self.op, epoch=msg.epoch, last_seq=msg.last_seq)
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
                    source = source_of(e.predecessor, e.predecessor_seq)
                    self.consumed[source] = max(self.consumed.get(source, -1), e.predecessor_seq)
            header = header_of(state.state["blob"])
            if not header.get("origins"):
                continue
            outs = unpack(state.state["blob"])[1]
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

    def _on_durable(self, msg: GraphDurable) -> None:
        if self.relaying and msg.operator != self.op:  # others send my backup's notices to the holder: pass them on
            self.peers.send(self.config.peers[f"{self.op}.backup"], msg)
        if msg.epoch > self.notice_epochs.get(msg.operator, 1) and msg.operator != self.op:  # 1: the spec's epoch
            self.notice_epochs[msg.operator] = msg.epoch  # a takeover upstream, its state up to msg.seq
            if self.backup is not None:
                self.backup.forget_after(msg.operator, msg.seq)
            elif msg.operator in self.preds and self.model is not None and self.took.get(msg.operator, -1) > msg.seq:
                self._roll_back(msg.operator, msg.seq)
                return
        if msg.operator == FRONTEND:
            if msg.seq < 0:
                return  # nothing left yet
            incarnation = epoch_of(msg.seq)  # a frontend's notice frees only its own origins
            self.released[incarnation] = max(self.released.get(incarnation, -1), msg.seq)
            stashed = self._stashed() if self.mode.checkpoints else None  # ls: kept until a successor checkpoints
            for saved in (self.outputs, self.kept):
                for seq in [s for s, m in saved.items() if self._released(m.origin)
                            and (stashed is None or s <= stashed)]:
                    del saved[seq]  # its reply left the graph: no resend will need it
            for key in [k for k in self.joining if self._released(k[1])]:
                del self.joining[key]  # answered already (another branch's error): the join never completes
        elif self.backup is not None:
            applied = self.backup.on_notify(msg.operator, msg.seq)
            self._notify(applied)
            self._keep(applied)  # its outputs, what it took and its requests: as for a state applied on arrival
        elif self.own is not None and self.degraded and msg.operator != self.op:
            self._notify(self.own.on_notify(msg.operator, msg.seq))
        elif self.statemgr is not None and msg.operator == self.op and msg.epoch == self.assignment.epoch:
            self.statemgr.on_durable(msg.seq)
            self._release_held(msg.seq)  # durable implies delivered (S1, Remus hold outputs until then)

    def _notify(self, applied: list[lin.ShippedState]) -> None:
        """Algorithm 2, after applying: tell the next stateful models, the frontend, my primary."""
        for state in applied:
            if self.trace:  # the requests this state applied, for the checker's "at most once"
                requests = state.state["applied"] if "applied" in state.state else \
                    header_of(state.state["blob"]).get("applied", []) if "blob" in state.state else []
                self.trace.write("apply", operator=self.op, last_seq=state.last_seq, epoch=state.epoch, degraded=self.degraded,
                                 lineage=[e.to_json() for lineage in state.lineages for e in lineage], requests=requests)
            self.trace.flush()  # the checker's record of this durability on disk before the notice (a kill loses the buffer)
            self._announce_durable(self.assignment.epoch, state.last_seq, primary=not self.degraded)

    # --- the batch loop ---------------------------------------------------------------
    def tick(self, timeout: float | None = None) -> None:
        def can_step() -> bool:
            return bool(self.queue) and self.model is not None and not self.numbering and self.leased()

        super().tick(0 if (can_step() and timeout is None) else timeout)
        if can_step():
            self._guarded("step", self.step, None)

    def step(self, _=None) -> None:
        rows = self._next_batch()
        # exactly once: a request my state applied already is not applied again (its saved
        # output goes on, numbered like any output); only the others are computed and applied
        fresh = [r for r in rows if self.applied is None or self.applied.get(self._key(r)) is None]
        batch, computed = None, {}
        if fresh:
            batch = GraphBatch(np.stack([r.input for r in fresh]), [r.stream for r in fresh])
            t0 = time.perf_counter()
            try:
                outputs = self.model.compute(batch)
            except Exception:  # the model's own error: the rows it fails on are answered now, the rest go on
                failed = {id(r) for r in fresh}
                fresh, batch, outputs = self._without_failing_rows(fresh)
                failed -= {id(r) for r in fresh}
                rows = [r for r in rows if id(r) not in failed]
                if not rows:
                    return
            pad = self.spec.pad_ms / 1000 - (time.perf_counter() - t0)
            if pad > 0:
                time.sleep(pad)  # the experiments' model service time
            computed = {id(r): out for r, out in zip(fresh, outputs if fresh else [])}
        if not self.leased():  # frozen (or starved) past the lease while computing: number and send nothing yet
            self.queue.extendleft(reversed(rows))  # compute only read the state: it runs again once confirmed
            return
        t1 = time.perf_counter()
        first = self.next_seq
        sends, lineages, outs, recorded = [], [], [], []  # recorded: (request, seq, origin, output) newly applied
        for r in rows:
            out = computed[id(r)] if id(r) in computed else self.applied.get(self._key(r)).output
            if id(r) in computed and self.applied is not None and r.request is not None:
                recorded.append((self._key(r), self.next_seq, r.origin, out))
            outs.append(out)
            if self.stateful:
                source = source_of(r.sender, r.seq)
                self.consumed[source] = max(self.consumed.get(source, -1), r.seq)  # what my state holds
            lineage = [e for e in r.lineage if e.seq >= 0]
            lineage += [lin.LineageEntry(e.predecessor, e.predecessor_seq, self.op, self.next_seq)
                        for e in r.lineage if e.seq < 0]  # a combined join's other inputs
            lineage = lin.extend(lineage, r.sender, r.seq, self.op, self.next_seq)
            lineages.extend(lineage)
            msg = GraphRequest(self.op, self.next_seq, r.origin, r.stream, lineage, out,
                               degraded=True if (self.degraded or r.degraded) else None,  # the client is told
                               request=r.request, reply_to=r.reply_to)
            if self.trace:
                self.trace.write("output", operator=self.op, seq=self.next_seq, epoch=self.assignment.epoch,
                                 origin=r.origin, output=out, request=r.request, duplicate=id(r) not in computed or None)
            sends += [(s, msg) for s in self.succs]
            if self.stateful:
                self.outputs[self.next_seq] = msg
            self.next_seq += 1
        last = self.next_seq - 1
        self.lineage_s += time.perf_counter() - t1
        self.batches += 1
        self.rows += len(rows)
        self.duplicates += len(rows) - len(computed)
        if self.stateful and self.mode.hold_outputs:
            self.held[last] = sends
        else:
            if self.trace and not self.mode.ships_state:  # strawman, ls: no backup saw them; the checker's
                self.trace.flush()  # record of what left must be on disk before they leave (a kill loses the buffer)
            for target, msg in sends:
                if target not in self.awaiting:  # else the resend on its ack carries it (saved in outputs)
                    self._send_on(target, msg)
        if not self.model.stateful:
            return
        t2 = time.perf_counter()
        if self.stateful and not self.degraded and self.mode.ships_state and not self._wait_for_update():
            return  # rolled back (or stepped down) while waiting: this batch is re-run from its resent inputs
        t3 = time.perf_counter()
        if batch is not None:
            self.model.update(batch, outputs)
        # the table changes with the state it describes (a batch abandoned above recorded nothing)
        now = time.time()
        for request, seq, origin, out in recorded:
            self.applied.record(request, seq, origin, out, now)
        applied = [[request, seq] for request, seq, _, _ in recorded]
        self.update_wait_s += t3 - t2
        self.update_s += time.perf_counter() - t3
        if self.degraded:  # no backup: its own state counts once Algorithm 2 allows (replies do not stall)
            self._notify(self.own.receive(lin.ShippedState(self.op, self.assignment.epoch, first, last, [lineages],
                                                           {"applied": applied})))
        elif self.stateful and self.mode.ships_state:
            meta = {"origins": [r.origin for r in rows], "streams": [r.stream for r in rows],
                    "requests": [r.request for r in rows], "reply_to": [r.reply_to for r in rows],
                    "applied": applied, "t": now}  # the backup records the same requests at the same t
            self.statemgr.start(self.model.state_arrays, dict(zip(range(first, last + 1), outs)), first, last, lineages,
                                idle=not self.queue and not self.inbox.poll(0), meta=meta)
        if self.stateful and self.mode.checkpoints:
            if self.takeovers:  # ls: the state the recovered system holds, rebuilt by replay (HAMS Fig. 2):
                # its outputs count for the checker as a backup's applied state would
                self.trace.write("apply", operator=self.op, last_seq=last, epoch=self.assignment.epoch, degraded=True,
                                 replay=True, lineage=[e.to_json() for e in lineages if e.operator == self.op],
                                 requests=applied)
            self.since_checkpoint += 1
            if self.since_checkpoint >= self.graph.checkpoint_every:
                self._checkpoint(last)

    def _next_batch(self) -> list[GraphRequest]:
        """The next batch's rows. A second row of one request (a retry queued beside the
        first) waits for the next batch: by then the first is applied, and it is answered
        from the table."""
        rows, keys, later = [], set(), []
        while self.queue and len(rows) < self.spec.max_batch:
            r = self.queue.popleft()
            if self.applied is not None and r.request is not None and self._key(r) in keys:
                later.append(r)
            else:
                keys.add(self._key(r))
                rows.append(r)
        self.queue.extendleft(reversed(later))
        return rows

    def _key(self, r: GraphRequest) -> str | None:
        """The name of an input in my table: its request's key; behind an interleaving join a
        request has an input from each predecessor, each applied once: key@predecessor."""
        if r.request is None or len(self.preds) == 1 or self.spec.join != "interleave":
            return r.request
        return f"{r.request}@{r.sender}"

    def _without_failing_rows(self, rows: list[GraphRequest]):
        """The model raised on a batch: find the rows it fails on alone and answer them with
        the error (straight to the frontend; no seq is used, 0 on the wire; the state is
        untouched); compute the rest again as one batch (``compute`` only reads the state)."""
        def why(exc: Exception) -> str:
            return f"operator {self.op} ({self.spec.kind}) failed: {type(exc).__name__}: {exc}"[:500]

        good, errors = [], {}
        for r in rows:
            try:
                self.model.compute(GraphBatch(r.input[None], [r.stream]))
                good.append(r)
            except Exception as exc:
                errors[id(r)] = why(exc)
        batch = GraphBatch(np.stack([r.input for r in good]), [r.stream for r in good]) if good else None
        outputs = None
        if good:
            try:
                outputs = self.model.compute(batch)
            except Exception as exc:  # the rows fail only together: every one gets the error
                errors.update({id(r): why(exc) for r in good})
                good = []
        for r in rows:
            if id(r) in errors:
                self.log.error("model error; the request is answered with it", operator=self.op, error=errors[id(r)])
                self.errors += 1
                self._send_on(FRONTEND, GraphRequest(self.op, 0, r.origin, r.stream, [], np.zeros(0, np.float32),
                                                     error=errors[id(r)], request=r.request, reply_to=r.reply_to))
        return good, batch, outputs

    def _wait_for_update(self) -> bool:
        """NSPB: the update of this batch waits for the previous copy and the window. While
        it waits the process goes on serving everything but a new batch (its inbox, its
        heartbeats to the manager: a wait longer than the manager's silence window must not
        read as a death, the backup's disconnect, status): a predecessor's takeover or my
        backup's death (its acks never come: the window would hold for ever) may roll me
        back. False if that happened (the model was replaced or stepped down): the batch is
        abandoned, its inputs come again by lineage."""
        model = self.model
        self.statemgr.wait_copy()
        deadline = time.monotonic() + 30
        while self.model is model and self.statemgr is not None and not self.statemgr.ready_for_update() \
                and self.running is not False and time.monotonic() < deadline:
            Service.tick(self, min(0.05, self.next_timeout()))  # the base loop: no step() inside
            if self.model is model and self.statemgr is not None:
                self._on_backup_lost(time.monotonic())
        return self.model is model and self.statemgr is not None

    def _release_held(self, seq: int) -> None:
        for last in [s for s in self.held if s <= seq]:
            for target, msg in self.held.pop(last):
                self._send_on(target, msg)

    def status(self) -> dict:
        info = super().status()
        info.update(operator=self.op, mode=self.graph.mode, assignment=self.assignment.role, epoch=self.assignment.epoch,
                    degraded=self.degraded, takeovers=self.takeovers, fenced=self.fenced,
                    batches=self.batches, rows=self.rows, errors=self.errors, queued=len(self.queue),
                    duplicates=self.duplicates,  # applied_requests: bounded by count and age, not by replies leaving
                    applied_requests=len(self.applied) if self.applied is not None else None,
                    saved_outputs=len(self.outputs),
                    lineage_ms_per_batch=1000 * self.lineage_s / max(1, self.batches),
                    update_wait_ms_per_batch=1000 * self.update_wait_s / max(1, self.batches),
                    update_ms_per_batch=1000 * self.update_s / max(1, self.batches),
                    tables={"queue": len(self.queue), "outputs": len(self.outputs), "held": len(self.held),
                            "joining": len(self.joining)})  # state GC: each drains once replies left
        if self.statemgr is not None:
            info["tables"].update(saved_states=len(self.statemgr.saved), in_flight=len(self.statemgr.in_flight))
            info.update(saved_states=len(self.statemgr.saved), in_flight=len(self.statemgr.in_flight),
                        durable_seq=self.statemgr.durable_seq, copy_ms=self.statemgr.copy_ms,
                        copy_ms_mean=1000 * self.statemgr.copy_s / max(1, self.batches),
                        handoff_ms=self.statemgr.handoff_ms, copies=self.statemgr.copies,
                        copies_in_background=self.statemgr.in_background)
        if self.standby_for:
            info.update(standby_for=sorted(self.standby_for), ready=True)
        if self.backup is not None:
            info["tables"].update(pending_states=len(self.backup.pending))
            info.update(max_applied_seq=self.backup.max_applied_seq, pending_states=len(self.backup.pending),
                        durable=dict(self.backup.durable.seqs))
        return info

    def applied_state(self):
        """The newest applied state and outputs (what HAMS II promotes from)."""
        if self.backup is None or self.backup.applied is None:
            return None
        return unpack(self.backup.applied.state["blob"])

    def drain(self) -> None:
        if self.manager is not None:
            self.manager.close()
        if self.statemgr is not None:
            self.statemgr.close()
        self.trace.close()
