"""The manager's replicated state machine: three in-process replicas stepped with ``tick``.

Real pysyncobj nodes on loopback, no threads: each test calls every replica's ``tick``
until a condition holds, so decisions, a stale compare-and-set, a leader's loss and a full
restart from the journal are checked one step at a time.
"""
from __future__ import annotations

import time

import pytest

from keel.common.control import replica_configs
from keel.deploy.local import free_port_block
from keel.services.manager.service import Manager
from keel.services.manager.state import ClusterState


def _ports(n: int) -> list[int]:
    base = free_port_block(n)
    return list(range(base, base + n))


class Group:
    """Three Manager replicas in this process, stepped together."""

    def __init__(self, journal_dir=None, ports=None):
        self.ports = ports or _ports(9)
        self.cfgs = replica_configs(self.ports, journal_dir=journal_dir)
        self.replicas: list[Manager | None] = [Manager(c) for c in self.cfgs]

    def live(self) -> list[Manager]:
        return [r for r in self.replicas if r is not None]

    def step(self, until, timeout_s: float = 10.0, what: str = "condition"):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for r in self.live():
                r.tick(0.0005)
            value = until()
            if value:
                return value
        raise AssertionError(f"{what} did not hold within {timeout_s} s")

    def leader(self) -> Manager:
        def one():
            leaders = [r for r in self.live() if r.raft._isLeader()]
            return leaders[0] if len(leaders) == 1 else None
        return self.step(one, what="one leader")

    def decide(self, replica: Manager, op: str, args: dict) -> dict:
        box: list[dict] = []
        replica.decide(op, args, box.append)
        return self.step(lambda: box[0] if box else None, what=f"{op} applied")

    def kill(self, i: int) -> None:
        self.replicas[i].shutdown()
        self.replicas[i] = None

    def close(self) -> None:
        for i, r in enumerate(self.replicas):
            if r is not None:
                self.kill(i)


@pytest.fixture
def group():
    made: list[Group] = []

    def make(**kwargs) -> Group:
        g = Group(**kwargs)
        made.append(g)
        return g

    yield make
    for g in made:
        g.close()


def _register(g: Group, leader: Manager, name: str, epoch: int = 0) -> dict:
    return g.decide(leader, "register", {"name": name, "group": "dispatcher", "host": "h", "endpoints": {}, "epoch": epoch})


def test_decisions_are_compare_and_set_and_every_replica_applies_them(group):
    g = group()
    leader = g.leader()
    first = _register(g, leader, "d1")
    assert first == {"status": "ok", "role": "active", "epoch": 1, "holder": "d1"}
    second = _register(g, leader, "d2")
    assert second["role"] == "standby" and second["holder"] == "d1"

    ok = g.decide(leader, "promote", {"group": "dispatcher", "name": "d2", "expected_epoch": 1, "reason": "test"})
    assert ok == {"status": "ok", "epoch": 2, "holder": "d2"}
    # A second decider that still believes epoch 1 loses: stale, with the current epoch.
    stale = g.decide(leader, "promote", {"group": "dispatcher", "name": "d1", "expected_epoch": 1, "reason": "late"})
    assert stale == {"status": "stale", "epoch": 2, "holder": "d2"}
    unknown = g.decide(leader, "promote", {"group": "dispatcher", "name": "nobody", "expected_epoch": 2})
    assert unknown["status"] == "unknown"

    g.step(lambda: len({r.state.seq for r in g.live()}) == 1 and g.live()[0].state.seq == leader.state.seq,
           what="followers applied the log")
    snaps = [r.state.snapshot() for r in g.live()]
    assert snaps[0] == snaps[1] == snaps[2]
    assert snaps[0]["services"]["d1"]["role"] == "standby" and snaps[0]["services"]["d2"]["role"] == "active"
    assert [d["holder"] for d in snaps[0]["decisions"]] == ["d1", "d2"]


def test_a_follower_refuses_decisions_and_names_the_leader(group):
    g = group()
    leader = g.leader()
    g.step(lambda: all(r.leader_info()["leader"] == leader.cfg.endpoint for r in g.live()), what="everyone knows the leader")
    follower = next(r for r in g.live() if r is not leader)
    answer = follower._answer("promote", {"group": "dispatcher", "name": "d1", "expected_epoch": 0}, [b"x"])
    assert answer == {"status": "not_leader", "leader": leader.cfg.endpoint}


def test_new_epochs_exceed_every_epoch_services_report(group):
    g = group()
    leader = g.leader()
    # A service that held epoch 41 under an earlier manager (state lost) reports it.
    first = _register(g, leader, "d1", epoch=41)
    assert first["epoch"] == 42


def test_the_majority_decides_on_after_the_leader_dies_and_one_history_remains(group):
    g = group()
    leader = g.leader()
    _register(g, leader, "d1")
    _register(g, leader, "d2")
    g.kill(g.replicas.index(leader))
    new = g.leader()
    assert new is not leader
    ok = g.decide(new, "promote", {"group": "dispatcher", "name": "d2", "expected_epoch": 1, "reason": "failover"})
    assert ok["status"] == "ok" and ok["epoch"] == 2
    g.step(lambda: len({r.state.seq for r in g.live()}) == 1, what="survivors equal")
    a, b = (r.state.snapshot() for r in g.live())
    assert a == b


def test_a_full_restart_keeps_committed_decisions_and_never_reuses_an_epoch(group, tmp_path):
    g = group(journal_dir=str(tmp_path))
    leader = g.leader()
    _register(g, leader, "d1")
    _register(g, leader, "d2")
    assert g.decide(leader, "promote", {"group": "dispatcher", "name": "d2", "expected_epoch": 1})["epoch"] == 2
    g.step(lambda: all(r.state.seq == leader.state.seq for r in g.live()), what="all applied")
    before = leader.state.snapshot()
    g.close()

    g2 = group(journal_dir=str(tmp_path), ports=g.ports)
    g2.step(lambda: all(r.state.seq == before["seq"] for r in g2.live()), what="journal replayed")
    for r in g2.live():
        assert r.state.snapshot() == before
    leader = g2.leader()
    again = g2.decide(leader, "promote", {"group": "dispatcher", "name": "d1", "expected_epoch": 2})
    assert again["status"] == "ok" and again["epoch"] == 3


def test_state_machine_alone_is_deterministic():
    """The same decisions in the same order give the same state (what Raft relies on)."""
    a, b = ClusterState(), ClusterState()
    for s in (a, b):
        s.register("d1", "dispatcher", "h1", {"q": "tcp://x:1"}, 0, 1.0, _doApply=True)
        s.register("d2", "dispatcher", "h2", {}, 7, 2.0, _doApply=True)
        stale = s.promote("dispatcher", "d2", 7, 0, 3.0, "test", _doApply=True)
        assert stale == {"status": "stale", "epoch": 1, "holder": "d1"}
        s.promote("dispatcher", "d2", 1, 0, 3.0, "test", _doApply=True)
    assert a.snapshot() == b.snapshot()
    # d2 reported epoch 7 when it registered: the next epoch is above it.
    assert a.snapshot()["groups"]["dispatcher"] == {"holder": "d2", "epoch": 8}
    assert [s for s, _ in a.changes_since(1)] == [2, 3]


def test_a_preferred_replica_gets_the_leadership_and_the_final_state_is_written(group, tmp_path):
    import dataclasses

    import orjson

    g = group(journal_dir=str(tmp_path))
    preferred = g.cfgs[2].raft_address
    for r in g.live():
        r.cfg = dataclasses.replace(r.cfg, preferred_leader=preferred)
        r._prefer = preferred
    g.step(lambda: g.replicas[2].raft._isLeader() and all(r.leader_info()["leader_raft"] == preferred for r in g.live()),
           what="the preferred replica leads")
    _register(g, g.replicas[2], "d1")
    g.step(lambda: all(r.state.seq == 1 for r in g.live()), what="all applied")
    g.close()
    finals = [orjson.loads((tmp_path / f"manager-{i}.journal.final.json").read_bytes()) for i in (1, 2, 3)]
    assert finals[0]["state"] == finals[1]["state"] == finals[2]["state"]
    assert finals[0]["state"]["groups"]["dispatcher"]["holder"] == "d1"


def test_a_new_leader_gives_every_service_a_window_before_silence_counts(group):
    """A replica that was cut off holds stale "last heard" times: when it becomes leader it
    must not replace a holder for silence it did not witness (the partition chaos run did)."""
    g = group()
    leader = g.leader()
    _register(g, leader, "d1")
    _register(g, leader, "d2")
    follower = next(r for r in g.live() if r is not leader)
    g.step(lambda: follower.state.seq == leader.state.seq, what="follower applied")
    now = time.monotonic()
    follower.heard = {"d1": (now - 10.0, 1), "d2": (now, 1)}  # d1 last heard long ago, d2 just now
    leader.raft.transferLeadership(node=follower.cfg.raft_address)
    g.step(lambda: follower.raft._isLeader(), what="the follower leads")
    became = time.monotonic()
    window = follower.cfg.heartbeat_interval_s * follower.cfg.heartbeat_liveness
    g.step(lambda: time.monotonic() > became + window / 2, what="half a window")
    assert follower.state.groups["dispatcher"] == {"holder": "d1", "epoch": 1}
    # d1 stays silent for a whole window under the new leader: now it is replaced
    follower.heard["d2"] = (time.monotonic() + 5.0, 1)  # keep d2 live
    g.step(lambda: follower.state.groups["dispatcher"]["holder"] == "d2", what="d1 replaced after the window")
