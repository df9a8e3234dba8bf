"""The SERF experiment's points on live processes (bench/serf_points.py): a pilot run of
each point, then the time for points spent on the point that needs it, through the real
path. The model is the builtin "sleep" one (20 ms, the CPU idles)."""
from __future__ import annotations

import numpy as np
import pytest

from keel.bench import serf_points
from keel.common.client import Client
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block
from keel.services.serf.profile import Profile

pytestmark = pytest.mark.slow


def test_a_pilot_then_the_budget_goes_where_the_standard_error_needs_it(tmp_path, launcher, monkeypatch):
    spec = load_spec({
        "cluster": {"name": "serf-points", "base_port": free_port_block(), "run_dir": str(tmp_path / "run")},
        "frontend": {"cache_size": 0},
        "models": {"m": {"builtin": "sleep", "fixed_ms": 20.0, "max_batch": 1, "input_shape": [8],
                         "output_size": 4, "deadline_ms": 10_000.0}},
    })
    launcher("serf").start_spec(spec)
    p = Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 20.0, (2, 1): 20.0}, path_ms=2.0, handoff_ms={1: 1.0, 2: 1.0})
    # no point can reach this standard error: every one asks for more than the budget has
    # (2 s pilots: at 14 req/s a 1 s pilot keeps too few requests for a standard error)
    monkeypatch.setattr(serf_points, "POINT_SE", 1e-6)
    inputs = np.zeros((4, 8), np.float32)
    with Client(spec.client_endpoints, timeout_ms=10_000.0) as client:
        points, took = serf_points.predicted_vs_measured(client, spec, "m", p, [(1, 1)], inputs, pilot_s=2.0,
                                                         budget_s=9.0, log=lambda *a: None, loads=(0.3, 0.6))
    assert [pt["load"] for pt in points] == [0.3, 0.6]
    # each point had its pilot; what was left of the budget went to one point, in one run
    assert sorted(pt["runs"] for pt in points) == [1, 2], points
    assert took <= 9.0 + 2.0  # the budget, and the drain of the last run
    for pt in points:
        assert 0 < pt["kept"] < pt["n"] and pt["lost"] == 0  # the warm-up left out, every request answered
        assert 20.0 <= pt["measured_ms"] <= 200.0 and pt["se_ms"] is not None and pt["capped"]
        assert pt["predicted_ms"] > 20.0 and pt["inrun_predicted_ms"] is not None
