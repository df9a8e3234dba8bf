"""A frontend SIGKILLed under load and started again on the same endpoints, while a
builtin ``sleep`` worker keeps answering the old incarnation's backlog: the new
incarnation must never hand an old query's prediction to a new query (its query ids carry
its epoch), so every ``model`` reply equals the expected output for ITS input."""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 16, 4


def test_restarted_frontend_never_answers_with_an_old_prediction(tmp_path, launcher, client):
    spec = load_spec({
        "cluster": {"name": "restart", "base_port": free_port_block(), "run_dir": str(tmp_path / "run")},
        "frontend": {"cache_size": 0},
        # one query per batch at 20 ms: a backlog of seconds builds at the dispatcher
        "models": {"sleep": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "fixed_ms": 20.0,
                             "fixed_batch": 1}},
    })
    run = launcher("restart")
    run.start_spec(spec)
    endpoint = spec.client_endpoints[0]
    c = client(endpoint, timeout_ms=20_000, retries=0)
    rng = np.random.default_rng(3)
    inputs: dict[str, np.ndarray] = {}

    def submit(n: int) -> None:
        for x in rng.random((n, DIM), dtype=np.float32):
            inputs[c.submit("sleep", x)] = x

    submit(150)  # ~3 s of work for the worker
    results = c.collect(500)  # the first answers are in: the load is flowing
    run.kill("frontend", signal.SIGKILL)
    run.start(spec.service("frontend"))
    run.wait_status(endpoint)
    after = len(inputs)
    submit(100)  # new queries, numbered by the new incarnation, behind the old backlog

    deadline = time.monotonic() + 60
    new = set(list(inputs)[after:])
    while new - {r.request_id for r in results}:
        assert time.monotonic() < deadline, "the new incarnation left queries unanswered"
        results.extend(c.collect(100))
    by_source: dict[str, int] = {}
    for result in results:
        by_source[result.source] = by_source.get(result.source, 0) + 1
        if result.source == Source.MODEL:
            np.testing.assert_array_equal(result.output, inputs[result.request_id][:OUT], err_msg=result.request_id)
    assert all(r.source == Source.MODEL for r in results if r.request_id in new), by_source
    info = request_status(endpoint, 5.0)
    assert info["answered"].get("stale", 0) > 0, "no prediction of the old incarnation reached the new one"
