"""A query's budget counts from the frontend's admission, time in every queue and socket
buffer included: a dispatcher frozen (SIGSTOP) under load, then resumed, drops (counts
``expired``) the queries the frontend has answered by their deadline meanwhile, instead of
computing them for nothing. Live frontend, dispatcher and worker processes."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from keel.common.client import Client
from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

DEADLINE_MS = 200
RATE = 200  # queries per second
FREEZE_S = 2.5


def test_a_frozen_dispatcher_does_not_compute_what_the_frontend_answered(tmp_path, launcher):
    spec = load_spec({
        "cluster": {"name": "freeze", "base_port": free_port_block(), "run_dir": str(tmp_path / "freeze")},
        "frontend": {"cache_size": 0, "log_requests": False},
        "models": {"noop": {"builtin": "noop", "input_shape": [4], "output_size": 2, "deadline_ms": DEADLINE_MS}},
    })
    run = launcher("freeze")
    run.start_spec(spec)
    endpoint = spec.client_endpoints[0]
    dispatcher = run.procs["dispatcher"]
    xs = np.random.default_rng(3).random((64, 4), dtype=np.float32)
    results, sent = [], 0
    with Client(endpoint, timeout_ms=DEADLINE_MS, retries=0, grace_ms=2000) as client:
        start = time.monotonic()
        frozen = resumed = None
        while sent < RATE * 5:  # 5 s of load, the freeze in its middle
            now = time.monotonic() - start
            if frozen is None and now >= 1.0:
                os.kill(dispatcher.pid, signal.SIGSTOP)
                frozen = now
            if frozen is not None and resumed is None and now >= frozen + FREEZE_S:
                os.kill(dispatcher.pid, signal.SIGCONT)
                resumed = now
            if sent < now * RATE:
                client.submit("noop", xs[sent % len(xs)])
                sent += 1
            results.extend(client.collect(1.0))
        while len(results) < sent:
            got = client.collect(1000.0)
            assert got, f"{sent - len(results)} queries never answered"
            results.extend(got)
    by_default = sum(r.source == Source.DEFAULT for r in results)
    assert by_default >= RATE * FREEZE_S * 0.5, {r.source for r in results}  # the freeze was felt
    time.sleep(0.5)  # late predictions, if any, reach the frontend
    fe = request_status(endpoint, 5.0)
    disp = request_status(spec.service("dispatcher").config.worker_endpoint, 5.0)
    assert disp["expired"] > 0, disp
    late = fe["answered"].get("late_model", 0)
    # a few may be on the worker when the freeze starts; the backlog is not computed
    assert late <= 0.05 * by_default, (late, by_default, disp["expired"])
