"""The HAMS fault-free chaos experiment (chaos/experiments/hams_fault_free.toml), shortened:
a real graph on loopback hosts passes the default checks and the HAMS invariants the
runner reads from the graph's traces."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from keel.chaos.experiment import load_experiment, run_experiment

pytestmark = pytest.mark.timeout(120)

TOML = Path(__file__).resolve().parents[2] / "chaos" / "experiments" / "hams_fault_free.toml"


def test_hams_fault_free_experiment_passes_the_graph_invariants(tmp_path):
    raw = tomllib.loads(TOML.read_text())
    raw.update(netns=False, settle_s=0.2, max_duration_s=90)
    raw["workload"].update(count=150, rate=60.0, duration_s=2.5, drain_s=1.0)
    report = run_experiment(load_experiment(raw), json_path=tmp_path / "hams.json")
    results = {i["name"]: i for i in report["invariants_all"]}
    for name in ("answered_exactly_once", "graph_durable_before_release", "graph_algorithm2_order",
                 "graph_one_output_per_operator_seq", "graph_request_applied_once"):
        assert results[name]["ok"] is True and results[name]["checked"] > 0, results[name]
    assert results["graph_durable_before_release"]["checked"] == report["modes"]["nspb"]["answered"] > 100
    assert report["leftovers"] == []
