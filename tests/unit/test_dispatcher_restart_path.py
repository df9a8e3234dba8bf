"""How workers find a dispatcher that restarted: a real Dispatcher and a real Worker, each
stepped with ``tick``, the test playing the other side over real sockets.

- The dispatcher answers an unknown worker's heartbeats with one ``Heartbeat(known=False)``
  per burst (the heartbeats that queued while it was down), and none when the worker
  registers in the same burst: the worker registers once.
- A worker heartbeats as soon as its connection to the dispatcher comes back, so a
  restarted dispatcher (same endpoint) has it registered within a round trip, not at its
  next heartbeat (here 30 s away).
"""
from __future__ import annotations

import time

import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import BatchPolicy, DispatcherConfig, WorkerConfig
from keel.common.protocol import Heartbeat, Register
from keel.services.dispatcher import Dispatcher
from keel.services.worker import Worker

ANY = "tcp://127.0.0.1:*"


@pytest.fixture
def dispatcher():
    cfg = DispatcherConfig(name="dispatcher", query_endpoint=ANY, worker_endpoint=ANY, models={"m": BatchPolicy()},
                           heartbeat_interval_s=30.0)
    cfg.validate()
    d = Dispatcher(cfg)
    yield d
    d.shutdown()


def _burst(d: Dispatcher, sock: zmq.Socket, messages: list) -> None:
    """Send ``messages`` and let the dispatcher read them in one burst (one tick)."""
    for msg in messages:
        transport.send(sock, msg)
    deadline = time.monotonic() + 3.0
    while not d.router.poll(0) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)  # the rest of the burst arrives behind the first
    d.tick(0.01)


def _heartbeats(sock: zmq.Socket, wait_s: float = 0.2) -> list[bool]:
    """``known`` of each Heartbeat waiting on a test DEALER."""
    out, deadline = [], time.monotonic() + wait_s
    while time.monotonic() < deadline:
        while sock.poll(10):
            msg = protocol.decode(sock.recv_multipart())
            if isinstance(msg, Heartbeat):
                out.append(msg.known)
    return out


def test_an_unknown_workers_queued_heartbeats_get_one_answer(dispatcher, zsock):
    w = zsock(zmq.DEALER, connect=transport.endpoint_of(dispatcher.router), identity=b"w1")
    _burst(dispatcher, w, [Heartbeat(sender="w1")] * 3)
    assert _heartbeats(w) == [False]


def test_a_worker_that_registers_in_the_same_burst_is_not_told_it_is_unknown(dispatcher, zsock):
    w = zsock(zmq.DEALER, connect=transport.endpoint_of(dispatcher.router), identity=b"w1")
    _burst(dispatcher, w, [Heartbeat(sender="w1"), Register(worker="w1", model="m", role="deployed", slots=1, max_batch=8)])
    assert b"w1" in dispatcher.workers
    assert _heartbeats(w) == []
    _burst(dispatcher, w, [Heartbeat(sender="w1")])
    assert _heartbeats(w) == [True]


def _registered(worker: Worker, router: zmq.Socket, timeout_s: float = 3.0) -> bool:
    """Whether the test's dispatcher receives a Register while stepping the worker for
    ``timeout_s``; it answers heartbeats ``known=False``, as a restarted dispatcher would."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        worker.tick(0.01)
        while router.poll(0):
            identity, *body = router.recv_multipart()
            msg = protocol.decode(body)
            if isinstance(msg, Register):
                return True
            if isinstance(msg, Heartbeat):
                transport.send(router, Heartbeat(sender="dispatcher", known=False), [identity])
    return False


def test_a_worker_registers_with_a_restarted_dispatcher_before_its_next_heartbeat(zsock):
    first = zsock(zmq.ROUTER, bind=ANY)
    endpoint = transport.endpoint_of(first)
    cfg = WorkerConfig(name="w-restart", model="m", builtin="noop", builtin_input_shape=[4], builtin_output_size=2,
                       dispatcher_worker_endpoint=endpoint, heartbeat_interval_s=30.0)
    worker = Worker(cfg)
    try:
        assert _registered(worker, first)
        first.close(0)  # the dispatcher dies; a new one binds the same endpoint
        for _ in range(50):
            worker.tick(0.01)
        second = zsock(zmq.ROUTER, bind=endpoint)
        assert _registered(worker, second)  # its next heartbeat is 30 s away
    finally:
        worker.shutdown()
