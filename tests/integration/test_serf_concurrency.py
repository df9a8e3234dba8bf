"""SERF's lever, live: a worker runs ``slots`` batches at once, and
``Configure`` changes its concurrency and torch threads without a restart and without
losing a query.

A live "sleep" worker (CPU idle, so two batches at once are two at once on any host)
driven by the test's fake dispatcher shows the concurrency; a real frontend, dispatcher
and worker serve an open-loop stream while the test switches the configuration through
the dispatcher (``Configure(model=...)`` on its ROUTER, what ``keel serf set`` and the
configurator use), and every query must be answered by the model."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq
from test_worker_edge import DIM, FakeDispatcher

from keel.common import transport
from keel.common.config import WorkerConfig
from keel.common.loadgen import open_loop, summarize
from keel.common.protocol import Configure, Done, Register, Source
from keel.common.spec import ServiceLaunch, load_spec
from keel.deploy.local import free_port_block, local_endpoint

pytestmark = pytest.mark.slow

ANY = "tcp://127.0.0.1:*"


def test_a_worker_runs_as_many_batches_at_once_as_its_slots(launcher, zsock):
    disp = FakeDispatcher(zsock)
    frontend = zsock(zmq.PULL, bind=ANY)
    good = transport.endpoint_of(frontend)
    cfg = WorkerConfig(name="w-conc", model="m", builtin="sleep", builtin_input_shape=[DIM], builtin_output_size=4,
                       fixed_ms=300.0, dispatcher_worker_endpoint=disp.endpoint, status_endpoint=local_endpoint(), slots=1)
    launcher("worker").start(ServiceLaunch(cfg.name, "worker", "local", cfg))
    disp.recv((Register,))

    def two_batches() -> dict:
        sent = {disp.batch([good]).batch_id, disp.batch([good]).batch_id}
        got = {disp.recv((Done,)).batch_id, disp.recv((Done,)).batch_id}
        assert got == sent
        return transport.request_status(cfg.status_endpoint, 5.0)

    info = two_batches()
    assert info["peak_concurrency"] == 1 and info["held"] == 0  # one slot: the second batch waited
    disp.send(Configure(slots=2, threads=1))
    info = two_batches()
    assert info["peak_concurrency"] == 2 and (info["slots"], info["threads"]) == (2, 1)
    disp.send(Configure(slots=1, threads=2))
    info = two_batches()
    assert (info["slots"], info["threads"], info["held"]) == (1, 2, 0)


def test_switching_live_loses_nothing(launcher, client):
    spec = load_spec({
        "cluster": {"name": "serf-switch", "base_port": free_port_block()},
        "frontend": {"cache_size": 0},
        "models": {"m": {"builtin": "sleep", "fixed_ms": 15.0, "max_batch": 1, "input_shape": [DIM],
                         "output_size": 4, "deadline_ms": 5000.0}},
    })
    launcher("serf").start_spec(spec)
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    answers: list[dict | None] = []
    stop = threading.Event()

    def switch() -> None:
        for slots, threads in [(2, 1), (1, 2), (2, 1), (1, 1), (2, 1), (1, 2)]:
            if stop.wait(0.3):
                return
            answers.append(transport.ask(dispatcher, Configure(model="m", slots=slots, threads=threads), 5.0))

    c = client(spec.client_endpoints[0], timeout_ms=5000.0)
    inputs = np.arange(20 * DIM, dtype=np.float32).reshape(20, DIM)
    switcher = threading.Thread(target=switch)
    switcher.start()
    try:
        records = open_loop(c, "m", inputs, rate=80.0, count=200, seed=14, duration_s=10.0, keep_outputs=True)
    finally:
        stop.set()
        switcher.join()
    s = summarize(records)
    assert s["lost"] == 0 and len(records) == 200
    assert all(r.source == Source.MODEL and r.error_code is None for r in records)
    for r in records:
        np.testing.assert_array_equal(r.output, inputs[r.index, :4])
    assert len(answers) >= 4 and all(a is not None and a["configured"] == ["worker-m-0"] for a in answers)
    bad = transport.ask(dispatcher, Configure(model="nope", slots=1), 5.0)
    assert bad["configured"] == [] and "nope" in bad["error"]
