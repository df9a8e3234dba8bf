"""A model rolled to a new version and back under open-loop load (the chaos experiment
chaos/experiments/model_rollout.toml, shortened): every request answered once, every
reply equal offline to the version it names (cache on), both versions served."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from keel.chaos.experiment import load_experiment, run_experiment
from keel.chaos.workload import read_records

pytestmark = pytest.mark.slow

EXPERIMENT = Path(__file__).resolve().parents[2] / "chaos" / "experiments" / "model_rollout.toml"


def test_rollout_and_rollback_under_load_lose_nothing_and_answer_each_version_exactly(tmp_path):
    raw = tomllib.loads(EXPERIMENT.read_text())
    raw.update(netns=False, max_duration_s=90, settle_s=0.2)
    # a rollout takes 0.3 s on a quiet machine and up to 2.7 s on a loaded one (each worker
    # leaves, loads, checks and registers in turn): the rollback waits 4 s so v2 is served
    raw["workload"].update(rate=100.0, count=700, duration_s=7.0, drain_s=1.5)
    raw["faults"][0]["at_s"], raw["faults"][1]["at_s"] = 1.0, 5.0
    report = run_experiment(load_experiment(raw), json_path=tmp_path / "rollout.json")
    assert [(e["kind"], e["ok"]) for e in report["faults"]] == [("rollout", True), ("rollout", True)], report["faults"]
    assert report["faults"][0]["detail"].endswith("version 2") and report["faults"][1]["detail"].endswith("version 1")
    results = {r["name"]: r for r in report["invariants"]["none"]}
    assert all(r["ok"] for r in results.values()), results
    assert results["model_replies_match_offline"]["checked"] == 700
    replies = [r for rec in read_records(Path(report["records"]["none"])) for r in rec["replies"]]
    versions = [r["version"] for r in sorted(replies, key=lambda r: r["recv_t"])]
    assert "2" in versions and versions[0] == "1" and versions[-1] == "1"
