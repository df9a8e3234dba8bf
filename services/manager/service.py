"""One replica of the manager: pysyncobj under Keel's loop, Control on a ROUTER, changes on PUB.

The Raft node runs with ``autoTick=False``: ``tick`` polls Keel's sockets without waiting,
then lets pysyncobj wait on its own sockets for at most ``raft_poll_s``; decisions are
submitted with a callback (never ``sync=True``: that would wait on the thread that has
to tick). The callback runs inside ``doTick`` with the applied result and sends the
answer to whoever asked.

Control ops (``Control.op``; ``args`` and ``result`` are JSON objects)
-----------------------------------------------------------------------
``leader``     any replica: ``{leader, is_leader, term, seq, self}`` (``leader`` is the
               leader's control endpoint, or None during an election)
``snapshot``   any replica: its whole state (Clone: a subscriber with a gap asks this)
``status``     any replica: what ``keel status`` and ``keel manager`` show
``register``   a decision: ``{name, group, host, endpoints, epoch}``
``promote``    a decision, compare-and-set: ``{group, name, expected_epoch, epoch, reason}``
``desired``    a decision: ``{desired}`` (the deployment the spec asks for)
``heartbeat``  ``{name, epoch}``: the service is alive; the answer says the group's epoch
               and holder, so a process with an older epoch learns it is stale
``suspect``    ``{name, reporter, why}``: a peer saw ``name`` fail (a socket disconnect,
               a timeout); replaced unless it heartbeats within one interval, or at
               once when ``why`` is ``refused`` (its endpoint refused a connection)
``transfer``   ``{to}`` (a raft address, or absent): the leader hands leadership over

A decision sent to a replica that is not the leader is answered
``{status: "not_leader", leader}``; while there is no leader, ``{status: "no_leader"}``.

Failure detection: each replica tracks when it last heard each service (heartbeats every
``heartbeat_interval_s``); a holder silent for ``heartbeat_liveness`` intervals, or
suspected by a peer and not heard within one interval after, is replaced by a live
member of its group through ``promote``. A suspicion is decided at its own time, one
interval and ``SUSPECT_MARGIN`` of one after the report (a timer, not the next periodic
check, which added up to one more interval): a heartbeat heard after the margin clears it,
so a live service, heartbeating every interval, always has one interval to be heard in,
and a heartbeat in flight when the report came does not count. A report that the
service's endpoint refused a connection (``REFUSED``: the reporter probed it after the
disconnect; a killed process's ports close with it) is decided at once: no heartbeat can
come from a process with nothing listening
(compare-and-set on the epoch the replica saw, so two replicas acting at once make one
decision). Only a replica that believes it leads proposes; a stale proposal fails harmlessly.
"""
from __future__ import annotations

import os
import time
from typing import Any

import zmq
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf

from keel.common import transport
from keel.common.config import ManagerConfig
from keel.common.control import REFUSED
from keel.common.protocol import Change, Control, Status
from keel.services.base import Service
from keel.services.manager.state import OK, ClusterState

DECISIONS = ("register", "promote", "desired")
#: a heartbeat heard this fraction of an interval after a suspicion's report clears it (one
#: heard sooner may have been in flight before the failure); the suspicion is decided one
#: interval after that
SUSPECT_MARGIN = 0.25


def raft_conf(cfg: ManagerConfig, on_state=None) -> SyncObjConf:
    """pysyncobj's settings from a manager config (``autoTick=False``: Keel's loop ticks)."""
    journal = cfg.journal_file
    if journal:
        os.makedirs(os.path.dirname(os.path.abspath(journal)), exist_ok=True)
    conf = SyncObjConf(
        autoTick=False, password=cfg.password, journalFile=journal,
        fullDumpFile=journal + ".dump" if journal else None,
        raftMinTimeout=cfg.raft_min_timeout_s, raftMaxTimeout=cfg.raft_max_timeout_s,
        appendEntriesPeriod=cfg.append_entries_period_s, connectionTimeout=cfg.connection_timeout_s,
        connectionRetryTime=cfg.connection_retry_s, leaderFallbackTimeout=cfg.leader_fallback_timeout_s,
        appendEntriesUseBatch=False, commandsWaitLeader=False, dynamicMembershipChange=False,
        onStateChanged=on_state,
    )
    conf.validate()
    return conf


class Manager(Service):
    role = "manager"

    def __init__(self, cfg: ManagerConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.state = ClusterState(decisions_kept=cfg.decisions_kept)
        self.raft = SyncObj(cfg.raft_address, list(cfg.raft_partners), raft_conf(cfg, self._on_raft_state),
                            consumers=[self.state])
        self.endpoints = dict(cfg.raft_partners, **{cfg.raft_address: cfg.endpoint})
        self.router = self.add_socket(transport.make_socket(self.ctx, zmq.ROUTER, bind=cfg.endpoint), self._on_control)
        self.pub = self.add_socket(transport.make_socket(self.ctx, zmq.PUB, bind=cfg.publish_endpoint))
        self.published = 0
        #: service name -> (monotonic time last heard, epoch it reported)
        self.heard: dict[str, tuple[float, int]] = {}
        #: group -> epoch a replacement was proposed at (one proposal per epoch and replica)
        self.proposed: dict[str, int] = {}
        self.unready: set[str] = set()  # members whose last heartbeat said they cannot take over yet
        self.said_unready: dict[str, int] = {}  # group -> epoch at which "no member ready" was logged
        #: service name -> (monotonic time of the first report, why, reporter, when it is decided)
        self.suspected: dict[str, tuple[float, str, str, float]] = {}
        self.every(cfg.heartbeat_interval_s, self._detect)
        self.decide_suspicions = self.timer(self._detect)  # a suspicion's own deadline (module docstring)
        # Clone's HUGZ: the current seq with no values, so a subscriber that lost the last
        # change (and would otherwise never see a gap) catches up within a second.
        self.every(1.0, lambda now: transport.try_send(self.pub, Change(seq=self.state.seq, values={})))
        self.leader_changes = 0
        self.m_leader_changes = self.metrics.counter("manager_leader_changes_total", "times this replica saw a new leader")
        self.m_commit = self.metrics.histogram("manager_commit_seconds", "submit to applied result of a decision", ["op"])
        self.m_decisions = self.metrics.counter("manager_decisions_total", "decisions by op and result", ["op", "status"])
        self.m_suspicions = self.metrics.counter("manager_suspicions_total", "services suspected", ["why"])
        self._leader = None
        self._leading, self.leading_since = False, 0.0
        self.started = time.monotonic()
        self._prefer = cfg.preferred_leader

    # -- the loop --------------------------------------------------------------------------

    def tick(self, timeout: float | None = None) -> None:
        timeout = self.next_timeout() if timeout is None else timeout
        super().tick(0)
        self.raft.doTick(min(timeout, self.cfg.raft_poll_s))
        leader = self.raft._getLeader()
        if leader is not None and leader != self._leader:
            self.leader_changes += 1
            self.m_leader_changes.inc()
            if getattr(leader, "address", None) == self._prefer:
                self._prefer = None  # it has led: never hand over again (not after a heal either)
        self._leader = leader
        leading = self.raft._isLeader()
        if leading and not self._leading:
            # What this replica heard while it followed (or was cut off) may be stale: every
            # service gets one full window from now before silence counts against it.
            self.leading_since = time.monotonic()
        self._leading = leading
        self._publish()
        if self._prefer is not None and leading:
            self._hand_to_preferred()

    def _hand_to_preferred(self) -> None:
        """Once, early in this replica's life: lead only if the preferred replica cannot."""
        preferred = self._prefer
        if time.monotonic() > self.started + self.cfg.preferred_window_s or preferred == self.cfg.raft_address:
            self._prefer = None
            return
        node = next((n for n in self.raft.otherNodes if getattr(n, "address", None) == preferred), None)
        if node is not None and self.raft.isNodeConnected(node):
            def done(_: Any, error: int) -> None:
                if error == FAIL_REASON.SUCCESS:
                    self.log.info("handed leadership to the preferred replica", to=preferred)
                else:
                    self._prefer = preferred  # not caught up yet: try again on a later tick

            self._prefer = None
            self.raft.transferLeadership(node=preferred, callback=done)

    def _on_raft_state(self, old: int, new: int) -> None:
        self.log.info("raft state", old=old, new=new, term=self.raft._getTerm())

    def _publish(self) -> None:
        """Send what the applied log changed since the last tick (Clone: in seq order)."""
        if self.published >= self.state.seq:
            return
        for seq, values in self.state.changes_since(self.published):
            transport.try_send(self.pub, Change(seq=seq, values=values))
        self.published = self.state.seq

    def shutdown(self) -> None:
        if not self.ctx.closed:
            self._write_final()
            self.raft.destroy()
        super().shutdown()

    def _write_final(self) -> None:
        """The state this replica ends with, beside its journal (``keel chaos`` compares
        the replicas' files: one history, equal states)."""
        if not self.cfg.journal_file:
            return
        import orjson

        final = {"name": self.name, "seq": self.state.seq, "term": self.raft._getTerm(),
                 "leader_changes": self.leader_changes, "state": self.state.snapshot()}
        try:
            with open(self.cfg.journal_file + ".final.json", "wb") as f:
                f.write(orjson.dumps(final))
        except OSError as exc:
            self.log.warning("final state not written", error=str(exc))

    # -- Control -------------------------------------------------------------------------------

    def _on_control(self, sock: zmq.Socket) -> None:
        for envelope, msg in self.messages(sock, router=True):
            if isinstance(msg, Status):
                transport.try_send(sock, Status(service=self.name, info=self.status()), envelope)
            elif isinstance(msg, Control) and msg.result is None:
                args = msg.args or {}
                try:
                    result = self._answer(msg.op, args, envelope)
                except (KeyError, TypeError, ValueError) as exc:
                    result = {"status": "bad_request", "error": f"{msg.op}: {type(exc).__name__}: {exc}"}
                if result is not None:
                    transport.try_send(sock, Control(op=msg.op, result=result), envelope)

    def _answer(self, op: str, args: dict, envelope: list) -> dict | None:
        """The answer to ``op`` now, or None when it comes later (a decision's callback)."""
        if op == "leader":
            return self.leader_info()
        if op == "snapshot":
            return self.state.snapshot()
        if op == "status":
            return self.status()
        if op == "heartbeat":
            return self._heartbeat(_str(args, "name"), _int(args, "epoch"), args.get("ready", True) is not False)
        if op == "suspect":
            return self.suspect(_str(args, "name"), str(args.get("why", "reported")), _str(args, "reporter"))
        if op == "transfer":
            return self._transfer(args.get("to"), envelope)
        if op in DECISIONS:
            if not self.raft._isLeader():
                info = self.leader_info()
                return {"status": "not_leader" if info["leader"] else "no_leader", "leader": info["leader"]}
            self.decide(op, args, lambda result: transport.try_send(self.router, Control(op=op, result=result), envelope))
            return None
        return {"status": "bad_request", "error": f"unknown op {op!r}"}

    def decide(self, op: str, args: dict, reply) -> None:
        """Submit a decision to the Raft log; ``reply(result)`` with the applied result (or
        why it was not applied). Timestamps are taken here, never in the state machine."""
        now, started = time.time(), time.monotonic()

        def done(result: Any, error: int) -> None:
            if error != FAIL_REASON.SUCCESS:
                result = {"status": "no_leader" if error in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER,
                                                             FAIL_REASON.LEADER_CHANGED) else "failed",
                          "error": f"raft: {_reason(error)}"}
            self.m_commit.labels(op=op).observe(time.monotonic() - started)
            self.m_decisions.labels(op=op, status=result.get("status", "?")).inc()
            if result.get("status") == OK and op == "promote":
                self.log.info("decision", op=op, group=args["group"], holder=result.get("holder"), epoch=result["epoch"])
            reply(result)

        if op == "register":
            self.state.register(_str(args, "name"), _str(args, "group"), str(args.get("host", "")),
                                dict(args.get("endpoints") or {}), _int(args, "epoch"), now, callback=done)
        elif op == "promote":
            self.state.promote(_str(args, "group"), _str(args, "name"), _int(args, "expected_epoch"),
                               _int(args, "epoch"), now, str(args.get("reason", "operator")), callback=done)
        elif op == "desired":
            self.state.set_desired(dict(args["desired"]), now, callback=done)

    def _transfer(self, to: str | None, envelope: list) -> dict | None:
        if not self.raft._isLeader():
            return {"status": "not_leader", "leader": self.leader_info()["leader"]}
        if to is not None and to not in self.cfg.raft_partners:
            return {"status": "bad_request", "error": f"{to!r} is not a partner: {sorted(self.cfg.raft_partners)}"}

        def done(_: Any, error: int) -> None:
            status = OK if error == FAIL_REASON.SUCCESS else "failed"
            transport.try_send(self.router, Control(op="transfer", result={"status": status, "error": _reason(error)}),
                               envelope)

        self.raft.transferLeadership(node=to, callback=done)
        return None

    # -- failure detection (HAMS §IV-E: the leader decides, once, in the log) ------------------

    def _heartbeat(self, name: str, epoch: int, ready: bool = True) -> dict:
        self.heard[name] = (time.monotonic(), epoch)
        if ready:
            self.unready.discard(name)
        else:
            self.unready.add(name)  # e.g. a new backup still taking its primary's state
        svc = self.state.services.get(name)
        if svc is None:
            return {"status": "unknown", "interval_s": self.cfg.heartbeat_interval_s}
        grp = self.state.groups[svc["group"]]
        return {"status": OK, "role": svc["role"], "epoch": grp["epoch"], "holder": grp["holder"],
                "stale": epoch < grp["epoch"] and grp["holder"] != name, "interval_s": self.cfg.heartbeat_interval_s}

    def suspect(self, name: str, why: str, reporter: str = "") -> dict:
        """A peer reports ``name`` failed (a socket disconnect, a timeout). Not trusted
        alone: the service is replaced unless a heartbeat from it arrives within one
        heartbeat interval after the report (a healthy one is never demoted by a blip),
        unless its endpoint refused a connection (``REFUSED``): decided at once."""
        if name not in self.state.services:
            return {"status": "unknown"}
        self.m_suspicions.labels(why=why).inc()
        if reporter in self.heard:  # its report is word from it: alive now (a replacement must be)
            self.heard[reporter] = (time.monotonic(), self.heard[reporter][1])
        first = self.suspected.get(name)
        if first is None or (why == REFUSED and first[1] != REFUSED):
            self.log.info("suspected", service=name, why=why, reporter=reporter)
            now = time.monotonic()
            due = now if why == REFUSED else self._decided_at(now)
            self.suspected[name] = (first[0] if first else now, why, reporter, due)
            self.decide_suspicions.at_latest(due)
        return {"status": OK, "action": "suspected"}

    def _detect(self, now: float) -> None:
        """Suspected services not heard from since, and holders silent for the liveness
        window (freezes, partitions), are replaced: HAMS §IV-E, decided once in the log."""
        interval = self.cfg.heartbeat_interval_s
        for name, (since, why, reporter, due) in list(self.suspected.items()):
            heard = self.heard.get(name, (-1e9, 0))[0]  # only a real heartbeat clears a suspicion
            if why != REFUSED and heard > since + SUSPECT_MARGIN * interval:
                del self.suspected[name]  # alive after all
                self.log.info("suspicion cleared", service=name, why=why, reporter=reporter)
            elif now >= due:
                del self.suspected[name]
                self.replace(name, why)
            else:
                self.decide_suspicions.at_latest(due)
        window = interval * self.cfg.heartbeat_liveness
        for grp in list(self.state.groups.values()):
            holder = grp["holder"]
            if holder in self.heard and now - self._heard(holder) > window:
                self.replace(holder, "silent")

    def _decided_at(self, since: float) -> float:
        """When a suspicion reported at ``since`` is decided: one interval after the margin."""
        return since + (1 + SUSPECT_MARGIN) * self.cfg.heartbeat_interval_s

    def _heard(self, name: str) -> float:
        """When ``name`` was last heard, counting a new leader's start as hearing everyone."""
        return max(self.heard.get(name, (-1e9, 0))[0], self.leading_since)

    def replace(self, name: str, why: str) -> str | None:
        """If ``name`` holds its group and this replica leads, propose a live member in its
        place at the epoch this replica saw (compare-and-set: a concurrent decision makes
        this one stale). Returns the member proposed, or None."""
        svc = self.state.services.get(name)
        if svc is None or not self.raft._isLeader():
            return None
        group = svc["group"]
        grp = self.state.groups[group]
        if grp["holder"] != name or self.proposed.get(group) == grp["epoch"]:
            return None
        now = time.monotonic()
        window = self.cfg.heartbeat_interval_s * self.cfg.heartbeat_liveness
        last = self.heard.get(name, (-1e9, 0))[0]
        # live: heard within the window, and after the holder last was (a member that fell
        # silent before it did died first: a stalled holder must not hand over to it), and
        # ready (a member still taking the holder's state would take over with half of it)
        live = [m for m, s in self.state.services.items()
                if s["group"] == group and m != name and m in self.heard and now - self.heard[m][0] <= window
                and self.heard[m][0] > last and m not in self.unready]
        if not live:
            if self.said_unready.get(group) != grp["epoch"] and any(
                    s["group"] == group and m in self.unready for m, s in self.state.services.items()):
                self.said_unready[group] = grp["epoch"]
                self.log.warning("no member ready to take over", service=name, why=why, group=group,
                                 unready=sorted(self.unready))
            return None
        self.heard.pop(name, None)
        self.proposed[group] = grp["epoch"]
        self.log.warning("replacing", service=name, why=why, replacement=live[0], epoch=grp["epoch"])
        reported = max([grp["epoch"]] + [self.heard[m][1] for m in live])
        self.decide("promote", {"group": group, "name": live[0], "expected_epoch": grp["epoch"], "epoch": reported,
                                "reason": f"{name} suspected: {why}"}, lambda result: None)
        return live[0]

    # -- views -----------------------------------------------------------------------------------

    def leader_info(self) -> dict:
        leader = self.raft._getLeader()
        leader_addr = getattr(leader, "address", None) if leader is not None else None
        return {"leader": self.endpoints.get(leader_addr) if leader_addr else None, "leader_raft": leader_addr,
                "is_leader": self.raft._isLeader(), "term": self.raft._getTerm(), "seq": self.state.seq,
                "self": self.cfg.endpoint, "raft": self.cfg.raft_address}

    def status(self) -> dict:
        snap = self.state.snapshot()
        return {**super().status(), **self.leader_info(), "leader_changes": self.leader_changes,
                "services": snap["services"], "groups": snap["groups"], "decisions": snap["decisions"][-10:],
                "max_epoch": snap["max_epoch"], "partners": self.cfg.raft_partners,
                "raft_status": {k: (str(v) if not isinstance(v, (int, float, bool, type(None))) else v)
                                for k, v in self.raft.getStatus().items()},
                "connected": {a: self.raft.isNodeConnected(n) for a, n in
                              ((getattr(n, "address", str(n)), n) for n in self.raft.otherNodes)}}


def _str(args: dict, key: str) -> str:
    value = args[key]
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValueError(f"{key} must be a non-empty string of at most 256 characters")
    return value


def _int(args: dict, key: str) -> int:
    value = args.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62:
        raise ValueError(f"{key} must be an integer in 0..2^62")
    return value


def _reason(error: int) -> str:
    names = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}
    return names.get(error, str(error)).lower()
