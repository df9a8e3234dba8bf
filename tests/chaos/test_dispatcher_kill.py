"""A dispatcher under supervisord SIGKILLed under load (``chaos/experiments/dispatcher_kill.toml``,
shortened): supervisord restarts it, every worker registers with the new one, every request
gets exactly one answer, and the report says when each step happened after the kill."""
from __future__ import annotations

import pytest

from keel.chaos import supervised
from keel.chaos.experiment import load_experiment, run_experiment
from keel.chaos.faults import PlanError, parse_fault
from keel.chaos.resources import ChaosError

WORKERS = 3


def experiment() -> dict:
    return {
        "name": "dkill", "seed": 5, "netns": False, "max_duration_s": 90, "modes": ["none"], "settle_s": 0.5,
        "supervised": ["d1"],
        "cluster": {
            "hosts": {"fe": "127.0.0.1", "d1": "127.0.0.1", "w1": "127.0.0.1"},
            "frontend": {"host": "fe", "cache_size": 0}, "dispatcher": {"host": "d1"},
            "models": {"m": {"builtin": "sleep", "fixed_ms": 1.0, "input_shape": [64], "output_size": 10,
                             "workers": WORKERS, "hosts": ["w1"], "deadline_ms": 1000}},
        },
        "workload": {"model": "m", "rate": 100.0, "count": 400, "duration_s": 4.0, "timeout_ms": 1000, "retries": 0,
                     "drain_s": 1.0},
        "faults": [{"at_s": 1.5, "kind": "crash", "host": "d1", "service": "dispatcher"}],
    }


@pytest.mark.parametrize("spare", [False, True], ids=["cold", "spare"])
def test_a_crashed_dispatcher_is_restarted_by_supervisord_and_every_worker_registers_again(tmp_path, spare):
    """Cold: supervisord's restart serves. Spare (``spare = true``): the hot spare serves, and
    the restarted process becomes the next spare."""
    config = experiment()
    config["cluster"]["dispatcher"]["spare"] = spare
    exp = load_experiment(config)
    report = run_experiment(exp, json_path=tmp_path / "dkill.json")
    crash = next(e for e in report["faults"] if e["kind"] == "crash")
    assert crash["ok"] is True and crash["crash"]["service"] == "dispatcher", crash
    summary = supervised.augment(exp, report, tmp_path / "dkill.json", tmp_path / "dkill")["none"]
    assert summary["kills"] == 1 and summary["all_registered"] == 1
    (figures,) = summary["crashes"]
    assert len(figures["registered_s"]) == WORKERS
    if spare:  # the spare, already running, started serving; supervisord restarted the killed one beside it
        assert figures["spawned_s"] is not None and 0 <= figures["started_s"] <= figures["all_registered_s"]
        logs = tmp_path / "dkill" / "none" / "supervised" / "d1" / "logs"
        assert "spare: lock taken, serving" in (logs / "dispatcher-spare.log").read_text() + (logs / "dispatcher.log").read_text()
    else:  # spawned by supervisord, then started, then every worker registered with it
        assert 0 <= figures["spawned_s"] <= figures["started_s"] <= figures["all_registered_s"]
    invariants = {i["name"]: i for i in report["invariants_all"]}
    assert invariants["answered_exactly_once"]["ok"] is True, invariants["answered_exactly_once"]["examples"]
    assert invariants["model_replies_match_offline"]["ok"] is True
    assert report["leftovers"] == []


def test_a_crash_names_its_service_and_a_supervised_host():
    with pytest.raises(PlanError, match="service"):
        parse_fault({"at_s": 1.0, "kind": "crash", "host": "d1"}, ["d1"])
    with pytest.raises(ChaosError, match="supervised"):
        load_experiment({**experiment(), "supervised": ["nowhere"]})
