"""Cancellation below the frontend, with real processes: a real dispatcher and worker of a
spec (the builtin ``sleep`` model, slow enough that queries really wait), the test playing
the frontend (PUSH of ``Queries`` and ``Withdraw``, a PULL for predictions); and a real
worker whose dispatcher the test plays (a ROUTER), to show a withdrawn query is skipped."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.protocol import Batch, Done, Heartbeat, Predictions, Queries, Register, Withdraw
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 4, 2


def sleep_spec(tmp_path, name: str, fixed_ms: float, **model) -> object:
    return load_spec({
        "cluster": {"name": name, "base_port": free_port_block(), "run_dir": str(tmp_path / "run")},
        "frontend": {"cache_size": 0},
        "models": {"slow": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "fixed_ms": fixed_ms,
                            "workers": 1, **model}},
    })


def predictions(pull: zmq.Socket, quiet_ms: int) -> list[int]:
    """The qids of every prediction that arrives until ``pull`` has been quiet for ``quiet_ms``."""
    got = []
    while pull.poll(quiet_ms):
        msg = protocol.decode(pull.recv_multipart(copy=False))
        assert isinstance(msg, Predictions)
        got += msg.qids
    return got


def test_the_dispatcher_removes_withdrawn_queries_and_the_worker_never_runs_them(tmp_path, launcher, zsock, wait):
    spec = sleep_spec(tmp_path, "withdraw", fixed_ms=100.0, fixed_batch=1, max_batch=1)
    run = launcher("withdraw")
    for svc in spec.role("dispatcher") + spec.role("worker"):  # no frontend: the test is the frontend
        run.start(svc)
    dispatcher = spec.service("dispatcher").config
    run.wait_workers(dispatcher.worker_endpoint, 1)
    worker = spec.role("worker")[0].config
    pull = zsock(zmq.PULL, bind="tcp://127.0.0.1:*")
    push = zsock(zmq.PUSH, connect=dispatcher.query_endpoint)
    n = 200
    qids = list(range(1, n + 1))
    transport.send(push, Queries(model="slow", qids=qids, budgets_ms=[60_000.0] * n,
                                 reply_to=transport.endpoint_of(pull), inputs=np.ones((n, DIM), np.float32),
                                 sent_at=time.time()))
    assert pull.poll(10_000), "no prediction came"
    first = protocol.decode(pull.recv_multipart(copy=False)).qids  # the worker is busy; the rest wait
    kept = set(qids[:5])  # the queries the test keeps; the others are cancelled, one Withdraw each
    for qid in qids:
        if qid not in kept:
            transport.send(push, Withdraw(model="slow", qids=[qid]))
    info = wait(lambda: (i := request_status(dispatcher.worker_endpoint, 1.0)) and i["queues"]["slow"] == 0
                and not any(w["inflight"] for w in i["workers"].values()) and i, timeout_s=15, what="queue empty")
    got = set(first) | set(predictions(pull, 1000))
    status = request_status(worker.status_endpoint, 2.0)
    assert kept <= got
    # every query was run (and answered), removed from the queue, or skipped by the worker
    assert len(got) + info["withdrawn"] + status["skipped_cancelled"] == n
    assert info["withdrawn"] >= (n - len(kept)) // 2  # most waited in the queue when withdrawn
    # the worker ran exactly the queries answered (one a batch)
    assert status["batches"] - status["skipped_cancelled"] == len(got)


def test_a_worker_skips_a_withdrawn_query_whose_batch_has_not_started(tmp_path, launcher, zsock):
    spec = sleep_spec(tmp_path, "skip", fixed_ms=600.0)
    run = launcher("skip")
    dispatcher = zsock(zmq.ROUTER, bind=spec.service("dispatcher").config.worker_endpoint)  # the test is the dispatcher
    svc = spec.role("worker")[0]
    run.start(svc)
    pull = zsock(zmq.PULL, bind="tcp://127.0.0.1:*")
    reply_to = transport.endpoint_of(pull)
    identity = None
    done: list[Done] = []

    def serve(until, timeout_s: float = 30.0) -> None:
        """Answer the worker's heartbeats and note its Register and Dones until ``until()``."""
        nonlocal identity
        end = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < end, "the worker did not get there"
            if dispatcher.poll(50):
                envelope, body = protocol.split_envelope(dispatcher.recv_multipart())
                msg = protocol.decode(body)
                if isinstance(msg, Register):
                    identity = envelope
                elif isinstance(msg, Heartbeat):
                    transport.send(dispatcher, Heartbeat(sender="dispatcher", known=True), envelope)
                elif isinstance(msg, Done):
                    done.append(msg)

    serve(lambda: identity is not None)

    def batch(batch_id: int, qids: list[int]) -> Batch:
        return Batch(batch_id=batch_id, model="slow", qids=qids, reply_to=[reply_to] * len(qids),
                     inputs=np.array([[q] * DIM for q in qids], np.float32))

    # one slot: the second batch waits for the first, and two of its three queries are withdrawn meanwhile
    transport.send(dispatcher, batch(1, [1]), identity)
    transport.send(dispatcher, batch(2, [2, 3, 4]), identity)
    transport.send(dispatcher, Withdraw(model="slow", qids=[2, 4]), identity)
    serve(lambda: len(done) == 2)
    assert [(d.batch_id, d.batch_size, d.ok) for d in done] == [(1, 1, True), (2, 1, True)]  # credits still come back
    assert sorted(predictions(pull, 500)) == [1, 3]
    status = request_status(svc.config.status_endpoint, 2.0)
    assert status["skipped_cancelled"] == 2 and status["batches"] == 2
