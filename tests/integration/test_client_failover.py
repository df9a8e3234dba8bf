"""The client over two frontends, one of which does not answer (SIGSTOPped, or nothing
listening on its port): every call succeeds, and after the first timeout new calls go
to the live frontend first instead of each paying a retry."""
from __future__ import annotations

import signal

import numpy as np
import pytest

from keel.common.client import Client
from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block, local_endpoint

pytestmark = pytest.mark.slow

DIM, OUT = 16, 4


class RecordingClient(Client):
    """Records the frontend each call's first attempt went to."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.first: list[int] = []

    def submit(self, *args, **kwargs) -> str:
        rid = super().submit(*args, **kwargs)
        self.first.append(self.calls[rid].frontend)
        return rid


def check_failover(endpoints: list[str], dead: int) -> None:
    with RecordingClient(endpoints, timeout_ms=300, grace_ms=300, retries=1, suspect_s=120.0) as c:
        rng = np.random.default_rng(dead)
        for _ in range(12):
            x = rng.random(DIM, dtype=np.float32)
            result = c.predict("echo", x)
            assert result.source == Source.MODEL and result.frontend == endpoints[1 - dead], (result.source, result.error)
            np.testing.assert_array_equal(result.output, x[:OUT])
    # round-robin sends one of the first two calls to the dead frontend; it times out once
    # and is avoided from then on
    assert c.first.count(dead) == 1 and dead in c.first[:2], c.first


def start(launcher, tmp_path, frontends: int):
    hosts = {f"h{i}": "127.0.0.1" for i in range(frontends)}
    spec = load_spec({
        "cluster": {"name": "failover", "base_port": free_port_block(), "run_dir": str(tmp_path / "run")},
        "hosts": hosts, "frontend": {"hosts": list(hosts), "cache_size": 0},
        "models": {"echo": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT}},
    })
    run = launcher("failover")
    run.start_spec(spec)
    return run, spec


def test_a_frontend_nobody_listens_on_is_avoided(tmp_path, launcher):
    _, spec = start(launcher, tmp_path, 1)
    check_failover([local_endpoint(), spec.client_endpoints[0]], dead=0)


def test_a_stopped_frontend_is_avoided(tmp_path, launcher):
    run, spec = start(launcher, tmp_path, 2)
    run.kill("frontend-1", signal.SIGSTOP)
    try:
        check_failover([spec.client_endpoints[1], spec.client_endpoints[0]], dead=0)
    finally:
        run.procs["frontend-1"].send_signal(signal.SIGCONT)
