"""The client over two frontends: when one frontend's process dies, its socket's disconnect
sends every call it held to the other frontend at once (same request id), instead of each
waiting for its timeout."""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 8, 4
TIMEOUT_MS = 30_000.0  # far longer than the test may take: only the disconnect can explain an answer in time


def _two_frontends(tmp_path, launcher, name: str):
    """Two frontends before one 50 ms-a-query worker (a frontend still holds calls when it
    dies); returns (spec, the running launcher)."""
    spec = load_spec({
        "cluster": {"name": name, "base_port": free_port_block(), "run_dir": str(tmp_path / "run")},
        "frontend": {"hosts": ["local", "local"], "cache_size": 0},
        "models": {"sleep": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "fixed_ms": 50.0,
                             "workers": 1, "deadline_ms": TIMEOUT_MS}},
    })
    run = launcher(name)
    run.start_spec(spec)
    return spec, run


def test_a_dead_frontends_calls_move_at_once(tmp_path, launcher, client):
    spec, run = _two_frontends(tmp_path, launcher, "fe-kill")
    c = client(spec.client_endpoints, timeout_ms=TIMEOUT_MS, retries=1)
    rng = np.random.default_rng(5)
    inputs = {c.submit("sleep", x): x for x in rng.random((40, DIM), dtype=np.float32)}
    results = c.collect(100)
    held = [rid for rid, call in c.calls.items() if call.frontend == 0]
    assert held  # one worker at 50 ms a query: frontend-0 still holds calls when it dies
    run.kill("frontend-0", signal.SIGKILL)
    deadline = time.monotonic() + 20  # less than TIMEOUT_MS: a timeout-driven retry would fail this
    while len(results) < len(inputs) and time.monotonic() < deadline:
        results.extend(c.collect(200))
    assert len({r.request_id for r in results}) == len(results) == len(inputs)
    assert all(r.source == Source.MODEL for r in results)
    for r in results:
        np.testing.assert_allclose(r.output, inputs[r.request_id][:OUT], atol=1e-5)
    assert c.moved >= len(held)
    answered_by = {r.request_id: r.frontend for r in results}
    assert {answered_by[rid] for rid in held} == {spec.client_endpoints[1]}


def test_a_dead_frontends_calls_move_at_once_with_the_async_client(tmp_path, launcher):
    import asyncio

    from keel.common.async_client import AsyncClient

    spec, run = _two_frontends(tmp_path, launcher, "fe-kill-async")
    xs = np.random.default_rng(6).random((40, DIM), dtype=np.float32)

    async def drive():
        async with AsyncClient(spec.client_endpoints, timeout_ms=TIMEOUT_MS, retries=1) as c:
            calls = [asyncio.ensure_future(c.predict("sleep", x)) for x in xs]
            await asyncio.sleep(0.1)
            held = sum(call.frontend == 0 for call in c.calls.values())
            assert held  # one worker at 50 ms a query: frontend-0 still holds calls when it dies
            run.kill("frontend-0", signal.SIGKILL)
            # less than TIMEOUT_MS: a timeout-driven retry would fail this
            results = await asyncio.wait_for(asyncio.gather(*calls), 20)
            return results, held, c.moved

    results, held, moved = asyncio.run(drive())
    assert len({r.request_id for r in results}) == len(results) == len(xs)
    assert all(r.source == Source.MODEL for r in results)
    for r, x in zip(results, xs):
        np.testing.assert_allclose(r.output, x[:OUT], atol=1e-5)
    assert moved >= held
    assert sum(r.frontend == spec.client_endpoints[1] for r in results) >= held
