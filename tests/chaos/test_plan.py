"""Fault plans, Poisson schedules and mode specs: pure functions, no processes."""
from __future__ import annotations

import numpy as np
import pytest

from keel.chaos.deployment import spec_for_mode
from keel.chaos.faults import FaultPlan, PlanError, parse_fault, random_plan
from keel.chaos.resources import ChaosError
from keel.chaos.workload import load_inputs
from keel.common import loadgen

HOSTS = ["fe", "w1", "w2"]


def test_timeline_expands_undo_faults_in_time_order():
    plan = FaultPlan.from_config({"faults": [
        {"at_s": 5, "kind": "kill", "host": "w1", "restart_after_s": 2},
        {"at_s": 1, "kind": "freeze", "host": "w2", "duration_s": 0.5},
        {"at_s": 3, "kind": "shuffle", "duration_s": 4},
    ]}, HOSTS)
    assert [(f.at_s, f.kind, f.host) for f in plan.faults] == [
        (1, "freeze", "w2"), (1.5, "thaw", "w2"), (3, "shuffle", None), (5, "kill", "w1"), (7, "restart", "w1")]
    shuffle = plan.faults[2]
    assert shuffle.params["hosts"] == HOSTS and shuffle.params["concurrent"] == 4 and shuffle.params["size_mb"] == [128, 256]


@pytest.mark.parametrize("fault, message", [
    ({"at_s": 1, "kind": "explode", "host": "w1"}, "kind"),
    ({"kind": "kill", "host": "w1"}, "at_s: required"),
    ({"at_s": 1, "kind": "kill", "host": "nowhere"}, "host"),
    ({"at_s": 1, "kind": "shuffle"}, "must be bounded"),
    ({"at_s": 1, "kind": "shuffle", "hosts": ["w1"], "duration_s": 1}, "two or more"),
    ({"at_s": 1, "kind": "delay", "host": "w1"}, "delay_ms"),
    ({"at_s": 1, "kind": "rollout", "version": 2}, "model"),
])
def test_bad_faults_name_the_key(fault, message):
    with pytest.raises(PlanError, match=message):
        parse_fault(fault, HOSTS)


def test_random_plan_is_seeded_and_bounded():
    cfg = {"duration_s": 50, "rates": {"freeze": 0.2, "kill": 0.05}, "freeze": {"duration_s": 1.0}, "hosts": ["w1", "w2"]}
    a, b = random_plan(cfg, HOSTS, seed=3), random_plan(cfg, HOSTS, seed=3)
    assert [f.to_dict() for f in a.faults] == [f.to_dict() for f in b.faults]
    assert a.faults and all(0 <= f.at_s < 50 and f.host in ("w1", "w2") for f in a.faults)
    assert [f.to_dict() for f in random_plan(cfg, HOSTS, seed=4).faults] != [f.to_dict() for f in a.faults]
    full = FaultPlan.from_config({"faults_random": {**cfg, "seed": 3}}, HOSTS)
    assert sum(f.kind == "thaw" for f in full.faults) == sum(f.kind == "freeze" for f in full.faults)


def schedule(rate, count, duration_s, seed):
    """The arrival offsets of the one open-loop schedule (``common.loadgen.schedule``)."""
    return loadgen.schedule(rate, count, seed, n_inputs=10, duration_s=duration_s)[0]


def test_schedule_is_bounded_by_count_and_duration():
    by_count = schedule(rate=1000, count=50, duration_s=100, seed=1)
    assert len(by_count) == 50
    by_time = schedule(rate=200, count=None, duration_s=2.0, seed=1)
    assert by_time.max() < 2.0 and 300 < len(by_time) < 500  # ~400 expected
    assert np.all(np.diff(by_time) > 0)
    np.testing.assert_array_equal(by_time, schedule(rate=200, count=None, duration_s=2.0, seed=1))


def test_inputs_come_from_the_digits_dataset_in_the_model_shape():
    x = load_inputs("digits", [64])
    assert x.shape == (1797, 64) and x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0
    assert load_inputs("digits", [3, 10]).shape == (1797, 3, 10)


def test_modes_set_each_coded_model_or_apply_overrides():
    spec = {"models": {"m": {"builtin": "noop", "k": 2}, "plain": {"builtin": "noop"}}}
    assert spec_for_mode(spec, "equal")["models"]["m"]["mode"] == "equal"
    assert "mode" not in spec_for_mode(spec, "parm")["models"]["plain"]
    assert "mode" not in spec["models"]["m"]  # the original is untouched
    custom = spec_for_mode(spec, "big", {"models": {"m": {"workers": 4}}})
    assert custom["models"]["m"]["workers"] == 4 and custom["models"]["m"]["k"] == 2
    with pytest.raises(ChaosError, match="mode_overrides"):
        spec_for_mode(spec, "big")
