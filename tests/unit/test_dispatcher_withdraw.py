"""The dispatcher's side of cancellation: a ``Withdraw`` from a frontend removes the queries
still queued, and tells the worker holding any of the others to skip them (a real
Dispatcher stepped with ``tick``, its peers played over real sockets as in test_dispatcher)."""
from __future__ import annotations

import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import BatchPolicy, DispatcherConfig
from keel.common.protocol import Leave, Withdraw
from keel.services.dispatcher import Dispatcher
from tests.unit.test_dispatcher import ANY_PORT, Harness


@pytest.fixture
def harness(zsock):
    made = []

    def make(models: dict[str, BatchPolicy]) -> Harness:
        cfg = DispatcherConfig(name="dispatcher", query_endpoint=ANY_PORT, worker_endpoint=ANY_PORT, models=models,
                               heartbeat_interval_s=30.0)
        cfg.validate()
        made.append(Dispatcher(cfg))
        return Harness(made[-1], zsock)

    yield make
    for dispatcher in made:
        dispatcher.shutdown()


def withdrawals(sock: zmq.Socket) -> list[Withdraw]:
    out = []
    while sock.poll(100):
        msg = protocol.decode(sock.recv_multipart(copy=False))
        if isinstance(msg, Withdraw):
            out.append(msg)
    return out


def test_withdrawn_queued_queries_are_never_dispatched(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)})
    sent = h.send_queries("m", 6)
    h.pump(lambda: h.d.status()["queues"]["m"] == 6, what="queued (no worker yet)")
    transport.send(h.frontend, Withdraw(model="m", qids=sent[1:5]))
    h.pump(lambda: h.d.status()["queues"]["m"] == 2, what="withdrawn")
    status = h.d.status()
    assert (status["withdrawn"], status["withdrawn_in_flight"]) == (4, 0)
    w = h.worker("w0")
    assert h.next_batch(w).qids == [sent[0], sent[5]]


def test_withdrawn_in_flight_queries_go_to_their_worker_and_are_not_run_again(harness):
    h = harness({"m": BatchPolicy(fixed_batch=3)})
    busy, idle = h.worker("busy"), h.worker("idle")
    sent = h.send_queries("m", 3)
    batch = h.next_batch(busy)
    assert batch.qids == sent
    # two of its queries cancelled, plus one never seen (done, expired: nothing to do)
    transport.send(h.frontend, Withdraw(model="m", qids=[sent[0], sent[2], 999]))
    h.pump(lambda: h.d.status()["withdrawn_in_flight"] == 2, what="forwarded")
    got = withdrawals(busy)
    assert [(w.model, w.qids) for w in got] == [("m", [sent[0], sent[2]])]
    assert withdrawals(idle) == []
    assert h.d.status()["withdrawn"] == 0
    # the worker leaves before its Done: only the query not withdrawn is run again
    transport.send(busy, Leave(worker="busy"))
    assert h.next_batch(idle).qids == [sent[1]]


def test_a_withdraw_for_another_model_changes_nothing(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)})
    sent = h.send_queries("m", 2)
    h.pump(lambda: h.d.status()["queues"]["m"] == 2, what="queued")
    transport.send(h.frontend, Withdraw(model="nope", qids=sent))
    h.pump(lambda: h.d.status()["unexpected"] == 1, what="refused")
    assert h.d.status()["queues"]["m"] == 2 and h.d.status()["withdrawn"] == 0
