"""How services, clients and tools reach the manager (services.manager).

``ManagerClient.call(op, args)`` finds the leader through any replica: it asks the one it
believes leads; an answer ``not_leader`` names the leader, and ``no_leader`` (an election)
or silence sends it to the next replica, until the deadline. A confused socket is closed
and replaced, never reused (zguide's Lazy Pirate).

``ChangeFeed`` is zguide's Clone client: it subscribes to every replica's PUB (each
replica publishes what its applied log changed, numbered by ``seq``, so a leader change
loses nothing), asks for a snapshot once, then applies each change whose ``seq`` follows
the last; a gap means messages were missed, and it asks for a snapshot again. Replicas
also publish their seq with no values every second, so even a lost last change is noticed.

Decisions are compare-and-set on epochs: ``promote`` answers ``ok`` with the new epoch,
or ``stale`` with the current epoch and holder. An answer ``no_leader`` after the leader
changed mid-decision leaves its outcome unknown; re-read (``snapshot``) and decide again
with the epoch read: the compare-and-set makes that safe.

Example
-------
>>> client = ManagerClient(["tcp://127.0.0.1:7510"])  # doctest: +SKIP
>>> client.call("promote", {"group": "dispatcher", "name": "d2", "expected_epoch": 3})  # doctest: +SKIP
{'status': 'ok', 'epoch': 4, 'holder': 'd2'}
"""
from __future__ import annotations

import time
import uuid
from typing import Any

import zmq

from keel.common import protocol, transport

#: a suspicion's ``why`` that is proof, not a hint: the suspect's endpoint refused a
#: connection (``transport.refused``): the manager decides it at once
REFUSED = "refused"

#: answers that mean "ask another replica"
RETRY = ("not_leader", "no_leader")


class ManagerUnavailable(RuntimeError):
    """No replica gave an answer before the deadline (no quorum, or none reachable)."""


class ManagerClient:
    """Blocking calls to the manager group, for tools, tests and start-up paths."""

    def __init__(self, endpoints: list[str], ctx: zmq.Context | None = None, timeout_s: float = 3.0,
                 attempt_s: float = 0.25):
        if not endpoints:
            raise ValueError("ManagerClient needs at least one replica endpoint")
        self.endpoints = list(endpoints)
        self.ctx = ctx or zmq.Context.instance()
        self.timeout_s, self.attempt_s = timeout_s, attempt_s
        self.leader: str | None = None
        self.tries = 0
        self._socks: dict[str, zmq.Socket] = {}  # one DEALER per replica, replaced after a silence

    def ask(self, endpoint: str, op: str, args: dict | None = None, timeout_s: float | None = None) -> dict | None:
        """One request to one replica; None on silence (that socket is then replaced)."""
        sock = self._socks.get(endpoint)
        if sock is None:
            sock = self._socks[endpoint] = transport.make_socket(
                self.ctx, zmq.DEALER, connect=endpoint, identity=f"ctl-{uuid.uuid4().hex[:12]}")
        try:
            transport.send(sock, protocol.Control(op=op, args=args))
            if sock.poll(int(1000 * (timeout_s or self.attempt_s))):
                msg = protocol.decode(transport.recv_frames(sock))
                if isinstance(msg, protocol.Control) and msg.op == op:
                    return msg.result
        except (zmq.ZMQError, protocol.ProtocolError):
            pass
        # Silence or garbage: a late answer must never be read as the next one's.
        self._socks.pop(endpoint).close(0)
        return None

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close(0)
        self._socks.clear()

    def call(self, op: str, args: dict | None = None, timeout_s: float | None = None) -> dict:
        """``op``'s answer from the first replica that gives one other than ``not_leader`` /
        ``no_leader`` (for decisions: the leader). Raises ``ManagerUnavailable`` at the
        deadline."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        order = self._order()
        i, hint, last = 0, None, None
        silent: dict[str, float] = {}  # endpoint -> when it last failed to answer
        while (now := time.monotonic()) < deadline:
            if hint is not None:
                endpoint, hint = hint, None
            else:
                endpoint = order[i % len(order)]
                i += 1
            self.tries += 1
            result = self.ask(endpoint, op, args, timeout_s=min(self.attempt_s, max(deadline - now, 0.001)))
            last = result
            if result is None:
                silent[endpoint] = time.monotonic()
                continue
            if result.get("status") in RETRY:
                named = result.get("leader")
                # Follow the leader a replica names (even one we were not told of), unless it
                # was just silent: followers name a dead leader until they elect a new one.
                if named and named != endpoint and time.monotonic() - silent.get(named, -1e9) > 0.5:
                    hint = named
                else:
                    time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
                continue
            self.leader = endpoint
            return result
        raise ManagerUnavailable(f"no manager replica answered {op!r} in time (last answer {last})")

    def _order(self) -> list[str]:
        rest = [e for e in self.endpoints if e != self.leader]
        return ([self.leader] if self.leader else []) + rest


class ChangeFeed:
    """A Clone-pattern replica of the manager's published state, kept by ``seq``.

    ``sock`` goes into a service's poller; call ``on_readable`` when it is ready (or
    ``pump``). ``values`` maps each key (``service/NAME``, ``group/NAME``, ``desired``)
    to its latest value; ``on_change(key, value)`` is called for each applied change.

    After a gap it needs a snapshot: with ``ask_snapshot`` (``ask_snapshot(on_reply)``, a
    ``ManagerLink``'s request) it asks without waiting, keeps the changes that come
    meanwhile, and applies the snapshot and then those changes in order when the answer
    reaches the service's loop; without it (tools, tests) ``resync`` blocks."""

    def __init__(self, client: ManagerClient, publish_endpoints: list[str], on_change=None,
                 ctx: zmq.Context | None = None, ask_snapshot=None):
        self.client, self.on_change = client, on_change
        self.ask_snapshot = ask_snapshot
        self.sock = transport.make_socket(ctx or client.ctx, zmq.SUB, connect=publish_endpoints)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.values: dict[str, Any] = {}
        self.seq = -1
        self.snapshots = 0
        self.asking = False  # a snapshot asked for and not yet answered (ask_snapshot)
        self.early: dict[int, dict] = {}  # seq -> values: changes past a gap, kept for after the snapshot

    def resync(self) -> bool:
        """Take a snapshot from any replica (newer than what is held), waiting for it; False
        if none answered."""
        try:
            snap = self.client.call("snapshot", timeout_s=self.client.attempt_s * 2)
        except ManagerUnavailable:
            return False
        self.apply_snapshot(snap)
        return True

    def apply_snapshot(self, snap: dict) -> None:
        """A replica's snapshot (``snapshot``'s answer), if newer than what is held; then the
        changes kept since the gap that follow it."""
        if snap.get("seq", -1) > self.seq:
            self.snapshots += 1
            self.seq = snap["seq"]
            values = {f"service/{n}": dict(v, name=n) for n, v in snap["services"].items()}
            values.update({f"group/{n}": dict(v, name=n) for n, v in snap["groups"].items()})
            values["desired"] = snap["desired"]
            self.values = values
            if self.on_change is not None:
                for key, value in values.items():
                    self.on_change(key, value)
        for seq in sorted(self.early):
            values = self.early.pop(seq)
            if seq == self.seq + 1:
                self._apply(seq, values)
            elif seq > self.seq + 1:  # still a gap (the snapshot was older than it): keep it, ask again
                self.early[seq] = values
        if self.early:
            self._gap()

    def _on_snapshot(self, result: dict) -> None:
        """A ``ManagerLink``'s answer to the snapshot asked for (in the service's loop); a
        timeout leaves the gap to the next change or the replicas' periodic seq."""
        self.asking = False
        if "seq" in result:
            self.apply_snapshot(result)

    def _gap(self) -> bool:
        """Changes were missed: a snapshot; True once it is applied (at once only when blocking)."""
        if self.ask_snapshot is None:
            return self.resync()
        if not self.asking:
            self.asking = True
            self.ask_snapshot(self._on_snapshot)
        return False

    def _apply(self, seq: int, values: dict) -> None:
        self.seq = seq
        self.values.update(values)  # all of a change first: a callback may read any key
        if self.on_change is not None:
            for key, value in values.items():
                self.on_change(key, value)

    def on_readable(self, sock: zmq.Socket | None = None) -> None:
        for _ in range(1000):
            try:
                msg = protocol.decode(self.sock.recv_multipart(zmq.NOBLOCK, copy=False))
            except zmq.Again:
                return
            except protocol.ProtocolError:
                continue
            if not isinstance(msg, protocol.Change) or msg.seq <= self.seq:
                continue  # old news, or the same change from another replica
            if not msg.values:  # a replica's periodic "I am at seq": we missed changes
                self._gap()
                continue
            if msg.seq > self.seq + 1:
                # A gap: joined late, a dropped message, a replica that fell behind.
                if self.ask_snapshot is not None:
                    self.early[msg.seq] = msg.values  # applied after the snapshot, if it follows it
                if not self._gap() or msg.seq != self.seq + 1:
                    continue
            self._apply(msg.seq, msg.values)

    def pump(self, timeout_s: float) -> None:
        """Apply what arrives for up to ``timeout_s`` (tools and tests)."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if self.sock.poll(int(left * 1000) + 1):
                self.on_readable()

    def close(self) -> None:
        self.sock.close(0)


def replica_configs(ports: list[int], host: str = "127.0.0.1", journal_dir: str | None = None, names: list[str] | None = None,
                    hosts: list[str] | None = None, **options: Any):
    """Configs of a manager group on ``host`` (or replica i on ``hosts[i]``: one emulated host
    each): replica i uses ports[3i] (raft), ports[3i+1] (control ROUTER), ports[3i+2] (PUB);
    ``options`` are further ManagerConfig fields."""
    from keel.common.config import ManagerConfig

    n = len(ports) // 3
    at = hosts or [host] * n
    raft = [f"{at[i]}:{ports[3 * i]}" for i in range(n)]
    control = [f"tcp://{at[i]}:{ports[3 * i + 1]}" for i in range(n)]
    names = names or [f"manager-{i + 1}" for i in range(n)]
    out = []
    for i in range(n):
        partners = {raft[j]: control[j] for j in range(n) if j != i}
        journal = f"{journal_dir}/{names[i]}.journal" if journal_dir else None
        cfg = ManagerConfig(name=names[i], raft_address=raft[i], raft_partners=partners, endpoint=control[i],
                            publish_endpoint=f"tcp://{at[i]}:{ports[3 * i + 2]}", journal_file=journal, **options)
        cfg.validate()
        out.append(cfg)
    return out


class ManagerLink:
    """A service's link to the manager group, run from the service's own loop.

    * ``feed``: the Clone-pattern view of the manager's state; ``on_change(key, value)``.
    * With ``me`` (``{"name", "group", "host", "endpoints"}``): the service registers in its
      group (re-sent each heartbeat until the leader's ``ok``) and heartbeats every replica
      every ``interval_s``, or as often as the manager's answers ask (its
      ``heartbeat_interval_s``, so its silence window always holds several heartbeats);
      each answer gives ``on_role(holder, epoch)``: the group's holder
      and epoch, so a process that was frozen or cut off learns it is stale. With ``ready``
      (a callable), each heartbeat says whether this member could take over now: one still
      catching up on its primary's state is never promoted (HAMS §IV-E).
    * ``watch(sock, name)``: a ZeroMQ socket-monitor disconnect on ``sock`` (immediate when
      the peer's process dies) is reported to every replica as a suspicion of ``name``.
    * ``request(op, args, on_reply)``: a decision asked without waiting: sent to every
      replica (only the leader decides; followers answer ``not_leader``), re-sent every
      ``retry_s`` while no replica decides (an election, a frozen or cut-off group: a
      compare-and-set decision is safe to ask again), and ``on_reply(result)`` called from
      the service's loop with the first decided answer, or ``{"status": "timeout"}`` once
      ``timeout_s`` passed. One request per op at a time: a newer one replaces it.

    Nothing here blocks the loop: the one snapshot taken at start-up (before the service
    serves; every service reads the manager's view right after linking) is waited for, up
    to ``2 x attempt_s``; a gap in the feed later asks for one with ``request``."""

    def __init__(self, service, endpoints: list[str], publish_endpoints: list[str], on_change=None,
                 me: dict | None = None, on_role=None, interval_s: float = 0.03, attempt_s: float = 0.2,
                 may_register=None, ready=None):
        self.service, self.me, self.on_role, self.may_register = service, me, on_role, may_register
        self.ready = ready
        self.epoch = 0  # the highest group epoch this service has seen (reported to the manager)
        self.registered = False
        self.client = ManagerClient(endpoints, ctx=zmq.Context(), attempt_s=attempt_s)
        # a gap in the feed asks for a snapshot like any other request: nothing waits for it
        self.feed = ChangeFeed(self.client, publish_endpoints, on_change, ctx=service.ctx,
                               ask_snapshot=lambda on_reply: self.request("snapshot", {}, on_reply,
                                                                          timeout_s=10 * attempt_s))
        service.add_socket(self.feed.sock, self.feed.on_readable)
        self.dealers = [service.add_socket(
            transport.make_socket(service.ctx, zmq.DEALER, connect=e, hwm=16), self._on_answer) for e in endpoints]
        self.monitors: dict[zmq.Socket, tuple[zmq.Socket, str]] = {}
        self.suspicions = 0
        self.beats = 0  # heartbeats sent (a loop that stalls sends none)
        # op -> (args, on_reply, give-up time): decisions asked, not yet answered; one timer per op
        self.pending: dict[str, tuple[dict, Any, float]] = {}
        self.resends: dict[str, Any] = {}
        self.retry_s = attempt_s
        self.beat = None
        if me is not None:
            service.every(interval_s, self._beat)
            self.beat = service.chores[-1]
        self.feed.resync()

    def _beat(self, now: float) -> None:
        me = self.me
        if not self.registered and (self.may_register is None or self.may_register()):
            self._to_all(protocol.Control(op="register", args={**me, "epoch": self.epoch}))
        args = {"name": me["name"], "epoch": self.epoch}
        if self.ready is not None:
            args["ready"] = bool(self.ready())
        self._to_all(protocol.Control(op="heartbeat", args=args))
        self.beats += 1

    def request(self, op: str, args: dict, on_reply, timeout_s: float = 10.0) -> None:
        """Ask the manager for ``op`` without blocking; ``on_reply(result)`` comes later."""
        if op not in self.resends:
            self.resends[op] = self.service.timer(lambda now, op=op: self._resend(op, now))
        self.pending[op] = (args, on_reply, time.monotonic() + timeout_s)
        self._resend(op, time.monotonic())

    def _resend(self, op: str, now: float) -> None:
        if op not in self.pending:
            return
        args, _, give_up = self.pending[op]
        if now >= give_up:
            self._answered(op, {"status": "timeout", "error": f"no manager replica decided {op!r} in time"})
            return
        self._to_all(protocol.Control(op=op, args=args))
        self.resends[op].at(min(now + self.retry_s, give_up))

    def _answered(self, op: str, result: dict) -> None:
        _, on_reply, _ = self.pending.pop(op)
        self.resends[op].at(None)
        on_reply(result)

    def _to_all(self, msg: protocol.Control) -> None:
        for dealer in self.dealers:
            transport.try_send(dealer, msg)  # a dead replica's queue fills; never block

    def _on_answer(self, sock: zmq.Socket) -> None:
        for _, msg in self.service.messages(sock):
            if not isinstance(msg, protocol.Control) or msg.result is None:
                continue
            result = msg.result
            interval = result.get("interval_s")
            if self.beat is not None and isinstance(interval, (int, float)) and 0 < interval < self.beat.interval:
                # the manager's silence window is counted in its own intervals: beat at least as often
                self.beat.interval = interval
                self.beat.due = min(self.beat.due, time.monotonic() + interval)
            if msg.op in self.pending and result.get("status") not in RETRY:
                self._answered(msg.op, result)  # the leader's decision (ok, or stale: compare-and-set)
                continue
            if result.get("status") != "ok":
                continue
            if msg.op == "register":
                self.registered = True
            if msg.op in ("register", "heartbeat") and isinstance(result.get("epoch"), int):
                self.epoch = max(self.epoch, result["epoch"])
                if self.on_role is not None:
                    self.on_role(result.get("holder"), result["epoch"])

    def suspect(self, name: str, why: str, **detail: Any) -> None:
        self.suspicions += 1
        reporter = self.me["name"] if self.me else self.service.name
        self.service.log.info("reporting suspected", service=name, why=why, **detail)
        self._to_all(protocol.Control(op="suspect", args={"name": name, "why": why, "reporter": reporter}))

    def watch(self, sock: zmq.Socket, name: str) -> None:
        """Report ``name`` suspected when ``sock`` (connected to it) sees a disconnect."""
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.monitors[monitor] = (sock, name)
        self.service.add_socket(monitor, self._on_monitor)

    def unwatch(self, sock: zmq.Socket) -> None:
        for monitor, (watched, _) in list(self.monitors.items()):
            if watched is sock:
                del self.monitors[monitor]
                sock.disable_monitor()
                self.service.remove_socket(monitor)

    def _on_monitor(self, monitor: zmq.Socket) -> None:
        """A disconnect of a watched socket: probe its endpoint first. Refused means the
        process is gone (its port closed with it), which the manager acts on at once; a
        disconnect alone may be a blip, which it gives a heartbeat interval to disprove."""
        if transport.disconnect_seen(monitor) and monitor in self.monitors:
            sock, name = self.monitors[monitor]
            endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            t0 = time.monotonic()
            why = REFUSED if transport.refused(endpoint) else "disconnect"
            self.suspect(name, why, endpoint=endpoint, probe_ms=round(1000 * (time.monotonic() - t0), 2))

    def holder(self, group: str) -> tuple[str | None, int, dict]:
        """(holder, epoch, the holder's registered endpoints) of ``group`` in the feed's view."""
        grp = self.feed.values.get(f"group/{group}") or {}
        holder = grp.get("holder")
        svc = self.feed.values.get(f"service/{holder}") or {} if holder else {}
        return holder, grp.get("epoch", 0), svc.get("endpoints") or {}

    def close(self) -> None:
        """The client's own sockets and context (the rest are the service's)."""
        self.pending.clear()
        for timer in self.resends.values():
            timer.at(None)
        self.client.close()
        self.client.ctx.term()
