"""A frontend of a HAMS graph SIGKILLed under load (chaos/experiments/hams_frontend_kill.toml),
shortened, on loopback hosts: clients retry on the other frontend, every request is answered
exactly once, and each (client, request id) changes each stateful operator's state at most
once."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from keel.chaos.experiment import load_experiment, run_experiment

pytestmark = pytest.mark.timeout(120)

TOML = Path(__file__).resolve().parents[2] / "chaos" / "experiments" / "hams_frontend_kill.toml"


def test_a_frontend_killed_under_graph_load_loses_nothing_and_applies_each_request_once(tmp_path):
    raw = tomllib.loads(TOML.read_text())
    raw.update(netns=False, settle_s=0.2, max_duration_s=90)
    raw["workload"].update(count=600, duration_s=3.0, drain_s=2.0)
    raw["faults"][0]["at_s"] = 1.5
    report = run_experiment(load_experiment(raw), json_path=tmp_path / "fe-kill.json")
    assert report["faults"][0]["ok"] and report["faults"][0]["host"] == "fe1"
    run = report["modes"]["nspb"]
    assert run["lost"] == 0 and run["answered"] == run["accepted"] > 500
    results = {i["name"]: i for i in report["invariants_all"]}
    for name in ("answered_exactly_once", "no_conflicting_answers", "graph_durable_before_release",
                 "graph_request_applied_once"):
        assert results[name]["ok"] is True and results[name]["checked"] > 0, results[name]
    assert report["leftovers"] == []
