"""The manager group as three real processes (``keel serve manager``) on loopback.

Leader discovery through any replica, the Clone-pattern change feed across a leader's
SIGKILL, failure detection by silence and by suspicion (the leader promotes the standby,
the old holder's heartbeat answer says it is stale), and equal replicas at the end.
"""
from __future__ import annotations

import signal
import threading
import time

import pytest
import zmq

from keel.common import transport
from keel.common.control import ChangeFeed, ManagerClient
from keel.deploy.manager_cli import show
from keel.deploy.manager_group import LocalGroup

pytestmark = pytest.mark.slow


@pytest.fixture
def group(launcher, tmp_path):
    made: list[LocalGroup] = []

    def make(**options) -> LocalGroup:
        g = LocalGroup(launcher("managers"), tmp_path / f"journal-{len(made)}", **options)
        made.append(g)
        g.start()
        g.leader(timeout_s=30.0)
        return g

    yield make
    for g in made:
        g.close()


class Heartbeats:
    """A stand-in service: heartbeats every replica every ``interval_s`` from a thread;
    the latest answers are kept. (A service outside Keel's processes: what is tested is the
    manager's reaction.)"""

    def __init__(self, g: LocalGroup, name: str, interval_s: float = 0.03, ready: bool = True):
        self.g, self.name, self.interval_s = g, name, interval_s
        self.epoch = 0
        self.ready = ready  # what each heartbeat says: could this member take over now
        self.answers: list[dict] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        client = ManagerClient(self.g.endpoints, attempt_s=0.05)
        try:
            while not self.stop.is_set():
                for e in self.g.endpoints:
                    answer = client.ask(e, "heartbeat", {"name": self.name, "epoch": self.epoch, "ready": self.ready},
                                        timeout_s=0.05)
                    if answer and answer.get("status") == "ok":
                        self.answers.append(answer)
                self.stop.wait(self.interval_s)
        finally:
            client.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def _register(client: ManagerClient, name: str) -> dict:
    return client.call("register", {"name": name, "group": "dispatcher", "host": "local", "endpoints": {}})


def _holder_and_member(g: LocalGroup, wait) -> tuple[ManagerClient, Heartbeats, Heartbeats]:
    """d1 holding the dispatcher group and d2 a member, both heartbeating every 50 ms."""
    client = g.client()
    d1, d2 = Heartbeats(g, "d1", interval_s=0.05), Heartbeats(g, "d2", interval_s=0.05)
    _register(client, "d1")
    _register(client, "d2")
    wait(lambda: d1.answers and d2.answers, what="heartbeats answered")
    return client, d1, d2


def _suspect_everywhere(g: LocalGroup, client: ManagerClient, name: str, why: str, reporter: str) -> None:
    """The report every replica hears (as from several upstreams)."""
    for e in g.endpoints:
        client.ask(e, "suspect", {"name": name, "why": why, "reporter": reporter}, timeout_s=1.0)


def test_any_replica_leads_a_client_to_the_leader(group):
    g = group()
    leader = g.leader()
    follower = next(e for i, e in enumerate(g.endpoints) if i != leader)
    client = ManagerClient([follower])  # told of one follower only
    try:
        assert _register(client, "d1")["role"] == "active"
        assert client.leader == g.endpoints[leader]
    finally:
        client.close()


def test_change_feed_survives_the_leaders_death_and_a_late_subscriber_catches_up(group, wait):
    g = group()
    client = g.client()
    feed = ChangeFeed(client, g.publish_endpoints)
    try:
        _register(client, "d1")
        _register(client, "d2")
        feed.pump(0.3)
        assert feed.values["group/dispatcher"]["holder"] == "d1"

        g.kill(g.leader(), signal.SIGKILL)
        result = client.call("promote", {"group": "dispatcher", "name": "d2", "expected_epoch": 1}, timeout_s=10.0)
        assert result["status"] == "ok"
        wait(lambda: (feed.pump(0.05), feed.values["group/dispatcher"]["holder"] == "d2")[1], timeout_s=10.0,
             what="the feed saw the new leader's decision")
        assert feed.values["service/d1"]["role"] == "standby"
        assert feed.values["group/dispatcher"]["epoch"] == result["epoch"]

        late = ChangeFeed(g.client(), g.publish_endpoints)
        try:
            _register(client, "d3")  # a change whose seq shows the late feed its gap
            wait(lambda: (late.pump(0.05), "service/d3" in late.values)[1], timeout_s=10.0, what="late feed caught up")
            assert late.snapshots >= 1
            assert late.values["group/dispatcher"] == feed.values["group/dispatcher"]
        finally:
            late.close()
            late.client.close()
    finally:
        feed.close()
        client.close()


def test_a_silent_holder_is_replaced_and_learns_it_is_stale(group, wait):
    g = group()
    client = g.client()
    d1, d2 = Heartbeats(g, "d1"), Heartbeats(g, "d2")
    try:
        d1.epoch = _register(client, "d1")["epoch"]
        _register(client, "d2")
        wait(lambda: d1.answers and d2.answers, what="heartbeats answered")
        d1.stop.set()  # d1 freezes: no more heartbeats
        d1.thread.join(5)

        snap = wait(lambda: (s := client.call("snapshot"))["groups"]["dispatcher"]["holder"] == "d2" and s,
                    timeout_s=10.0, what="d2 promoted")
        assert snap["groups"]["dispatcher"]["epoch"] > d1.epoch
        assert snap["decisions"][-1]["reason"].startswith("d1 suspected: silent")
        # d1 comes back with its old epoch: the answer tells it to step down.
        answer = client.call("heartbeat", {"name": "d1", "epoch": d1.epoch})
        assert answer["stale"] is True and answer["holder"] == "d2" and answer["role"] == "standby"
    finally:
        d1.close()
        d2.close()
        client.close()
    assert g.wait_equal()


def test_a_member_not_ready_is_never_promoted_and_a_ready_one_is(group, wait):
    # d2 is still taking d1's state (a new backup catching up): d1's death must not hand the
    # group to it; once d2 says it is ready, d1's next failure does.
    g = group()
    client = g.client()
    d1, d2 = Heartbeats(g, "d1"), Heartbeats(g, "d2", ready=False)
    try:
        _register(client, "d1")
        _register(client, "d2")
        wait(lambda: d1.answers and d2.answers, what="heartbeats answered")
        d1.close()
        time.sleep(1.0)  # many silence windows (heartbeat_interval_s x liveness is well under this)
        snap = client.call("snapshot")
        assert snap["groups"]["dispatcher"]["holder"] == "d1"
        assert [d["holder"] for d in snap["decisions"]] == ["d1"]

        d2.ready = True
        snap = wait(lambda: (s := client.call("snapshot"))["groups"]["dispatcher"]["holder"] == "d2" and s,
                    timeout_s=10.0, what="d2 promoted once ready")
        assert snap["decisions"][-1]["reason"].startswith("d1 suspected: silent")
    finally:
        d1.close()
        d2.close()
        client.close()
    assert g.wait_equal()


def test_a_suspicion_replaces_a_dead_holder_before_silence_would_and_never_a_live_one(group, wait):
    # A long silence window (0.5 s) beside the report's one interval (0.1 s).
    g = group(heartbeat_interval_s=0.1, heartbeat_liveness=5)
    client, d1, d2 = _holder_and_member(g, wait)
    try:
        # d1 is alive and heartbeating: a report (a network blip) must not demote it.
        _suspect_everywhere(g, client, "d1", "disconnect", "w1")
        time.sleep(0.5)
        assert client.call("snapshot")["groups"]["dispatcher"]["holder"] == "d1"

        d1.close()  # d1 dies; every replica hears the report (as from several upstreams)
        _suspect_everywhere(g, client, "d1", "disconnect", "w1")
        snap = wait(lambda: (s := client.call("snapshot"))["groups"]["dispatcher"]["holder"] == "d2" and s,
                    timeout_s=5.0, what="d2 promoted")
        assert snap["decisions"][-1]["reason"] == "d1 suspected: disconnect"
        time.sleep(0.3)
        snap = client.call("snapshot")
        assert [d["holder"] for d in snap["decisions"]] == ["d1", "d2"]  # one decision, not one per replica
    finally:
        d1.close()
        d2.close()
        client.close()


def test_a_refused_endpoint_is_proof_a_heartbeat_does_not_outweigh(group, wait):
    # The reporter probed the endpoint after the disconnect and was refused: nothing listens
    # there, so the manager replaces the holder at once, heartbeats or not (a "disconnect"
    # alone, as above, is cleared by them).
    g = group(heartbeat_interval_s=0.1, heartbeat_liveness=5)
    client, d1, d2 = _holder_and_member(g, wait)
    try:
        _suspect_everywhere(g, client, "d1", "refused", "d2")
        snap = wait(lambda: (s := client.call("snapshot"))["groups"]["dispatcher"]["holder"] == "d2" and s,
                    timeout_s=5.0, what="d2 promoted")
        assert snap["decisions"][-1]["reason"] == "d1 suspected: refused"
    finally:
        d1.close()
        d2.close()
        client.close()


def test_show_prints_every_replica_and_the_services(group, capsys):
    g = group()
    client = g.client()
    try:
        _register(client, "d1")
    finally:
        client.close()
    view = show(g.endpoints)
    out = capsys.readouterr().out
    assert sum(1 for info in view["replicas"].values() if info and info["is_leader"]) == 1
    assert "d1" in out and "active" in out


def test_a_feed_that_lost_the_last_change_notices_it_from_the_periodic_seq(group, wait):
    g = group()
    client = g.client()
    feed = ChangeFeed(client, g.publish_endpoints)
    try:
        _register(client, "d1")
        feed.pump(0.3)
        seq = feed.seq
        feed.sock.close(0)  # deaf while a change happens: as if its messages were dropped
        _register(client, "d2")
        assert g.wait_equal()  # every replica has applied and published it: only the periodic seq is left
        time.sleep(0.05)
        feed.sock = transport.make_socket(client.ctx, zmq.SUB, connect=g.publish_endpoints)
        feed.sock.setsockopt(zmq.SUBSCRIBE, b"")
        wait(lambda: (feed.pump(0.1), "service/d2" in feed.values)[1], timeout_s=5.0,
             what="the lost change recovered by snapshot")
        assert feed.seq > seq and feed.snapshots >= 2
    finally:
        feed.close()
        client.close()


def test_services_heartbeat_as_often_as_the_manager_asks_so_a_short_window_never_flaps(group):
    from keel.common.control import ManagerLink
    from keel.services.base import Service

    # a 100 ms silence window; links start at 120 ms (they would flap) and learn 20 ms from the answers
    g = group(heartbeat_interval_s=0.02, heartbeat_liveness=5)
    services, links = [], []
    try:
        for name in ("d1", "d2"):
            svc = Service(name)
            services.append(svc)
            links.append(ManagerLink(svc, g.endpoints, g.publish_endpoints, interval_s=0.12,
                                     me={"name": name, "group": "dispatcher", "host": "local", "endpoints": {}}))
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            for svc in services:
                svc.tick(0.002)
        assert [link.beat.interval for link in links] == [0.02, 0.02]
        decisions = g.probe.ask(g.endpoints[g.leader()], "snapshot", timeout_s=1.0)["decisions"]
        # whichever registration the leader applied first holds the group, and it is never replaced
        assert len(decisions) == 1 and decisions[0]["holder"] in ("d1", "d2")
        assert decisions[0]["previous"] is None and decisions[0]["reason"] == "first in its group"
    finally:
        for link, svc in zip(links, services):
            link.close()
            svc.shutdown()
