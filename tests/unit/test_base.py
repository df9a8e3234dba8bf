"""The process shape every service shares: a failing handler, chore or timer is logged with
its traceback and the loop goes on; timers whose due time moves; Status on a side ROUTER."""
from __future__ import annotations

import time

import orjson
import pytest
import zmq

from keel.common import logs, protocol, transport
from keel.services.base import Service


class Probe(Service):
    role = "probe"

    def __init__(self):
        super().__init__("probe")
        self.ran: list[str] = []


def _lines(capsys) -> list[dict]:
    return [orjson.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_a_failing_chore_is_logged_and_the_loop_goes_on(capsys):
    svc = Probe()
    logs.setup("probe", json=True)
    svc.log = logs.setup("probe", json=True)

    def boom(now: float) -> None:
        raise KeyError("no such deadline")

    svc.every(0.0, boom)
    svc.every(0.0, lambda now: svc.ran.append("after"))
    try:
        svc.tick(0)
        svc.tick(0)
    finally:
        svc.shutdown()
    assert svc.ran == ["after", "after"]
    failures = [e for e in _lines(capsys) if e["event"] == "chore failed"]
    assert len(failures) == 2
    assert "KeyError" in failures[0]["exception"] and "no such deadline" in failures[0]["exception"]
    assert "Traceback" in failures[0]["exception"] and failures[0]["fn"] == "boom"


def test_a_timer_runs_once_when_due_and_can_be_moved():
    svc = Probe()
    timer = svc.timer(lambda now: svc.ran.append("timer"))
    try:
        svc.tick(0)
        assert svc.ran == []  # not set
        timer.at(time.monotonic() + 60)
        assert svc.next_timeout() > 1
        timer.at_latest(time.monotonic() - 1)  # moved earlier: due now
        assert svc.next_timeout() == 0
        svc.tick(0)
        svc.tick(0)
        assert svc.ran == ["timer"]  # once, then clear until set again
        assert timer.due is None
    finally:
        svc.shutdown()


def test_a_failing_timer_does_not_stop_the_loop(capsys):
    svc = Probe()
    svc.log = logs.setup("probe", json=True)
    timer = svc.timer(lambda now: 1 / 0)
    timer.at(0.0)
    try:
        svc.tick(0)
    finally:
        svc.shutdown()
    assert any(e["event"] == "timer failed" and "ZeroDivisionError" in e["exception"] for e in _lines(capsys))


def test_status_on_a_side_router():
    svc = Probe()
    svc.serve_status("tcp://127.0.0.1:*")
    endpoint = transport.endpoint_of(svc.sockets[-1])
    ctx = zmq.Context()
    asker = transport.make_socket(ctx, zmq.DEALER, connect=endpoint)
    try:
        transport.send(asker, protocol.Status())
        deadline = time.monotonic() + 5
        while not asker.poll(0) and time.monotonic() < deadline:
            svc.tick(0.01)
        reply = protocol.decode(asker.recv_multipart())
        assert reply.info == {"service": "probe", "role": "probe"}
    finally:
        asker.close(0)
        ctx.term()
        svc.shutdown()


def test_the_status_port_survives_garbage_and_still_answers():
    svc = Probe()
    svc.serve_status("tcp://127.0.0.1:*")
    endpoint = transport.endpoint_of(svc.sockets[-1])
    ctx = zmq.Context()
    hostile = transport.make_socket(ctx, zmq.DEALER, connect=endpoint)
    asker = transport.make_socket(ctx, zmq.DEALER, connect=endpoint)
    try:
        for frames in ([b""], [b"\xff" * 64], [b'{"v": 1, "kind": "status", "info": 3}'], [b'{"v": 1}', b"x"],
                       protocol.encode(protocol.Done(worker="w", batch_id=1, batch_size=1, service_ms=1.0))):
            hostile.send_multipart(frames)
        transport.send(asker, protocol.Status())
        deadline = time.monotonic() + 5
        while not asker.poll(0) and time.monotonic() < deadline:
            svc.tick(0.01)
        assert protocol.decode(asker.recv_multipart()).info["role"] == "probe"
        assert not hostile.poll(100)  # nothing to answer a message that is not a Status request
    finally:
        hostile.close(0)
        asker.close(0)
        ctx.term()
        svc.shutdown()


class _FailsAfterASocket(Service):
    def __init__(self, endpoint: str):
        super().__init__("fails-after-a-socket")
        self.sock = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=endpoint))
        raise RuntimeError("a later step of the constructor failed")


def test_a_service_whose_constructor_fails_closes_its_sockets_and_context():
    with pytest.raises(RuntimeError) as failed:
        _FailsAfterASocket("tcp://127.0.0.1:*")
    service = failed.traceback[-1].frame.f_locals["self"]  # the half-built service
    assert service.sock.closed and service.ctx.closed
