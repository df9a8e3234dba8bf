"""The manager's replicated state machine: who holds which role, at which epoch.

Every replica applies the same decisions in the same order (pysyncobj's Raft log), so
every method marked ``@replicated`` is deterministic: timestamps come in as arguments,
nothing reads a clock, a file or a socket. A decision is a compare-and-set: ``promote``
names the epoch its caller last saw for the group; if another decision got there first
the answer is ``stale`` with the current epoch and holder, and nothing changes. Callers act
on the applied result only, never on "am I the leader" (two replicas can believe that for
a while).

A *group* is one role that exactly one service holds at a time (the active dispatcher,
the primary of a stateful model); the others in the group wait in the second role
(standby, backup). Each holder change gives the group a new *epoch*: one more than the
highest epoch any service has reported and any this state has given (never the Raft
term: pysyncobj does not persist it across a full restart). A process holding an older
epoch is stale and steps down; messages stamped with an older epoch are refused.

Example
-------
>>> state = ClusterState()
>>> state.register("d1", "dispatcher", "h1", {}, 0, 1.0, _doApply=True)["role"]
'active'
>>> state.promote("dispatcher", "d1", 0, 0, 2.0, "test", _doApply=True)["status"]
'stale'
"""
from __future__ import annotations

import copy
from typing import Any

from pysyncobj import SyncObjConsumer, replicated

#: a group's two roles: (the one holder, everyone else in it)
ROLE_PAIRS = {"dispatcher": ("active", "standby")}
DEFAULT_PAIR = ("primary", "backup")

OK, STALE, UNKNOWN = "ok", "stale", "unknown"


def roles_of(group: str) -> tuple[str, str]:
    """(holder role, waiting role) of ``group``: a group is named for its service kind."""
    return ROLE_PAIRS.get(group.split("/", 1)[0], DEFAULT_PAIR)


class ClusterState(SyncObjConsumer):
    """The replicated state: services, groups, the desired deployment and the decision log.

    ``seq`` counts applied changes; ``touched`` keeps, for the latest changes, which keys
    each changed (``service/NAME``, ``group/NAME``, ``desired``), so a replica can publish
    them (Clone pattern)."""

    def __init__(self, decisions_kept: int = 256, touched_kept: int = 1024):
        super().__init__()
        self.services: dict[str, dict[str, Any]] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.desired: dict[str, Any] = {}
        self.decisions: list[dict[str, Any]] = []
        self.seq = 0
        self.max_epoch = 0
        self.touched: list[tuple[int, list[str]]] = []
        self.decisions_kept, self.touched_kept = decisions_kept, touched_kept

    # -- replicated decisions (deterministic: no clock, no I/O) ---------------------------

    @replicated
    def register(self, name: str, group: str, host: str, endpoints: dict, reported_epoch: int,
                 now: float) -> dict:
        """Add (or refresh) ``name`` in ``group``. A group with no holder gets this service as
        its holder at a new epoch; otherwise it waits in the group's second role. A service
        that registers again keeps its role (its endpoints and host are refreshed)."""
        self._saw(reported_epoch)
        holder_role, waiting_role = roles_of(group)
        grp = self.groups.setdefault(group, {"holder": None, "epoch": 0})
        svc = self.services.get(name)
        if svc is not None and svc["group"] != group:
            return {"status": UNKNOWN, "error": f"{name} is in group {svc['group']}, not {group}"}
        if svc is None:
            svc = self.services[name] = {"group": group, "role": waiting_role, "epoch": grp["epoch"]}
        svc.update(host=host, endpoints=dict(endpoints))
        keys = [f"service/{name}"]
        if grp["holder"] is None:
            keys += self._hand(group, name, now, "first in its group")
        self._changed(keys)
        return {"status": OK, "role": svc["role"], "epoch": grp["epoch"], "holder": grp["holder"]}

    @replicated
    def promote(self, group: str, name: str, expected_epoch: int, reported_epoch: int, now: float,
                reason: str) -> dict:
        """Compare-and-set: ``name`` becomes the holder of ``group`` at a new epoch if the
        group is still at ``expected_epoch``; else ``stale`` with the current epoch and
        holder (someone decided first: re-read, then decide again if still needed)."""
        self._saw(reported_epoch)
        grp = self.groups.get(group)
        svc = self.services.get(name)
        if grp is None or svc is None or svc["group"] != group:
            return {"status": UNKNOWN, "error": f"no service {name} in group {group}"}
        if grp["epoch"] != expected_epoch:
            return {"status": STALE, "epoch": grp["epoch"], "holder": grp["holder"]}
        self._changed(self._hand(group, name, now, reason))
        return {"status": OK, "epoch": grp["epoch"], "holder": name}

    @replicated
    def set_desired(self, desired: dict, now: float) -> dict:
        """The deployment the spec asks for (what should run where)."""
        self.desired = copy.deepcopy(desired)
        self._changed(["desired"])
        return {"status": OK}

    # -- helpers of the replicated methods --------------------------------------------------

    def _saw(self, reported_epoch: int) -> None:
        if isinstance(reported_epoch, int) and reported_epoch > self.max_epoch:
            self.max_epoch = reported_epoch

    def _hand(self, group: str, name: str, now: float, reason: str) -> list[str]:
        """Make ``name`` the holder of ``group`` at a fresh epoch; the previous holder (and
        every other member) waits. Returns the keys changed."""
        holder_role, waiting_role = roles_of(group)
        grp = self.groups[group]
        epoch = max(self.max_epoch, grp["epoch"]) + 1
        self.max_epoch = epoch
        previous = grp["holder"]
        grp.update(holder=name, epoch=epoch)
        keys = [f"group/{group}"]
        for member, svc in self.services.items():
            if svc["group"] != group:
                continue
            role = holder_role if member == name else waiting_role
            if svc["role"] != role or member == name:
                svc.update(role=role, epoch=epoch)
                keys.append(f"service/{member}")
        self.decisions.append({"at": now, "group": group, "holder": name, "previous": previous, "epoch": epoch,
                               "reason": reason})
        del self.decisions[:-self.decisions_kept]
        return keys

    def _changed(self, keys: list[str]) -> None:
        self.seq += 1
        self.touched.append((self.seq, sorted(set(keys))))
        del self.touched[:-self.touched_kept]

    # -- reads (local, not replicated) ---------------------------------------------------------

    def value(self, key: str) -> dict | None:
        """The current value of a published key (None: it was removed)."""
        kind, _, name = key.partition("/")
        if kind == "service":
            svc = self.services.get(name)
            return dict(svc, name=name) if svc is not None else None
        if kind == "group":
            grp = self.groups.get(name)
            return dict(grp, name=name) if grp is not None else None
        if kind == "desired":
            return dict(self.desired)
        return None

    def changes_since(self, seq: int) -> list[tuple[int, dict]]:
        """(seq, {key: value now}) for each change after ``seq`` still remembered, oldest
        first (a subscriber that sees a gap catches up by snapshot)."""
        return [(s, {key: self.value(key) for key in keys}) for s, keys in self.touched if s > seq]

    def snapshot(self) -> dict:
        """The whole replicated state as plain data (Clone snapshot; equal on every replica
        that applied the same log)."""
        return copy.deepcopy({"seq": self.seq, "max_epoch": self.max_epoch, "services": self.services,
                              "groups": self.groups, "desired": self.desired, "decisions": self.decisions})
