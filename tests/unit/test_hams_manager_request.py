"""``ManagerLink.request``: a decision an operator asks of the manager without waiting in
its loop (HAMS §IV-E's roll-back). A real Service and ManagerLink ticked here; the manager
replicas are ROUTER sockets of the test that answer as the test says: followers'
``not_leader`` is no decision, silence is re-asked, the leader's answer is handed to the
callback once, and no answer by the deadline gives ``timeout``."""
import time

import zmq

from keel.common import protocol, transport
from keel.common.control import ManagerLink
from keel.services.base import Service


def replicas(n: int):
    ctx = zmq.Context.instance()
    socks = [ctx.socket(zmq.ROUTER) for _ in range(n)]
    endpoints = [f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in socks]
    return socks, endpoints


def asked(sock: zmq.Socket, op: str) -> list:
    """Envelopes of the requests for ``op`` waiting at ``sock``."""
    out = []
    while sock.poll(0):
        frames = sock.recv_multipart()
        msg = protocol.decode(frames[1:])
        if isinstance(msg, protocol.Control) and msg.op == op:
            out.append(frames[0])
    return out


def gathered(socks: list, got: list[list], op: str) -> bool:
    """Add the requests for ``op`` now waiting at each socket to its list in ``got``; has
    every socket had one? (Other requests, such as the link's snapshot ask, are read past.)"""
    for sock, envelopes in zip(socks, got):
        envelopes.extend(asked(sock, op))
    return all(got)


def answer(sock: zmq.Socket, who: bytes, op: str, result: dict) -> None:
    transport.send(sock, protocol.Control(op=op, result=result), envelope=[who])


def run_until(svc: Service, done, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        svc.tick(0.01)


def test_the_leaders_decision_reaches_the_callback_once_and_silence_is_asked_again():
    socks, endpoints = replicas(3)
    svc = Service("op-test")
    link = ManagerLink(svc, endpoints, [], attempt_s=0.05)
    replies = []
    try:
        link.request("promote", {"group": "graph/g2", "name": "op-g2", "expected_epoch": 3}, replies.append)
        first = [[] for _ in socks]  # the link's other asks (its feed's snapshot) may come first
        run_until(svc, lambda: gathered(socks, first, "promote"))
        assert all(len(a) >= 1 for a in first), first  # to every replica: only the leader decides
        answer(socks[0], first[0][0], "promote", {"status": "not_leader", "leader": endpoints[1]})
        again = [[]]
        run_until(svc, lambda: gathered(socks[1:2], again, "promote"))  # the leader, silent so far
        again = again[0]
        assert link.pending and not replies
        assert again, "a silent leader is asked again while no replica decides"
        answer(socks[1], again[0], "promote", {"status": "ok", "epoch": 4, "holder": "op-g2"})
        run_until(svc, lambda: replies)
        answer(socks[1], again[0], "promote", {"status": "stale", "epoch": 4})  # a late answer to a re-sent ask
        run_until(svc, lambda: False, timeout_s=0.2)
        assert replies == [{"status": "ok", "epoch": 4, "holder": "op-g2"}] and not link.pending
    finally:
        link.close()
        svc.shutdown()
        for s in socks:
            s.close(0)


def test_no_decision_by_the_deadline_is_a_timeout_and_the_loop_went_on_meanwhile():
    socks, endpoints = replicas(3)
    svc = Service("op-test")
    link = ManagerLink(svc, endpoints, [], attempt_s=0.05)
    replies, ticks = [], []
    svc.every(0.01, ticks.append)
    try:
        link.request("promote", {"group": "graph/g2", "name": "op-g2", "expected_epoch": 3}, replies.append,
                     timeout_s=0.5)
        run_until(svc, lambda: replies, timeout_s=3.0)
        assert replies and replies[0]["status"] == "timeout" and not link.pending
        assert len(ticks) >= 20  # the loop's chores ran while the decision was outstanding
        assert sum(len(asked(s, "promote")) for s in socks) >= 3 * 5  # re-asked about every 50 ms
    finally:
        link.close()
        svc.shutdown()
        for s in socks:
            s.close(0)


def test_a_gap_in_the_feed_asks_for_a_snapshot_without_waiting_and_keeps_the_changes_after_it():
    """The feed's snapshot after a gap is a request like the others: the loop goes on while
    it is outstanding, and the change that came meanwhile is applied after the snapshot."""
    socks, endpoints = replicas(1)
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub_endpoint = f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}"
    svc = Service("op-test")
    changes, ticks = [], []
    link = ManagerLink(svc, endpoints, [pub_endpoint], on_change=lambda k, v: changes.append((k, v)), attempt_s=0.1)
    asked(socks[0], "snapshot")  # the start-up snapshot (silence: the feed starts empty)
    svc.every(0.01, ticks.append)
    group = {"holder": "op-g2", "epoch": 3}
    try:
        deadline = time.monotonic() + 5.0
        while not socks[0].poll(0) and time.monotonic() < deadline:  # a SUB joins late: publish until heard
            transport.send(pub, protocol.Change(seq=5, values={"group/graph/g2": group}))
            svc.tick(0.02)
        transport.send(pub, protocol.Change(seq=6, values={"group/graph/g1": {"holder": "op-g1", "epoch": 2}}))
        run_until(svc, lambda: False, timeout_s=0.3)  # the snapshot is not answered yet
        assert link.feed.asking and link.feed.seq == -1 and not changes
        assert len(ticks) >= 15  # the loop went on
        who = asked(socks[0], "snapshot")
        assert who, "the gap asked a replica for a snapshot"
        answer(socks[0], who[-1], "snapshot", {"seq": 5, "services": {}, "groups": {"graph/g2": group}, "desired": {}})
        run_until(svc, lambda: link.feed.seq == 6)
        assert link.feed.seq == 6 and not link.feed.asking
        assert [k for k, _ in changes] == ["group/graph/g2", "desired", "group/graph/g1"]  # the snapshot, then 6
        assert link.feed.values["group/graph/g1"]["holder"] == "op-g1"
    finally:
        link.close()
        svc.shutdown()
        pub.close(0)
        for s in socks:
            s.close(0)
