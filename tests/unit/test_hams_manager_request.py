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
        run_until(svc, lambda: all(s.poll(0) for s in socks))
        first = [asked(s, "promote") for s in socks]
        assert all(len(a) >= 1 for a in first), first  # to every replica: only the leader decides
        answer(socks[0], first[0][0], "promote", {"status": "not_leader", "leader": endpoints[1]})
        run_until(svc, lambda: socks[1].poll(0), timeout_s=1.0)  # the leader (silent so far) is asked again
        assert link.pending and not replies
        again = asked(socks[1], "promote")
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
