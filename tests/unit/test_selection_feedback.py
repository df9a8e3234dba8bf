"""The feedback log (bounded, time-limited, taken once) and the spec's [applications]
tables (typed, checked, turned into policies)."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common.spec.applications import read_applications
from keel.services.selection.policies import policy_of
from keel.common.spec.tables import SpecError
from keel.services.selection.feedback import Entry, FeedbackLog
from keel.services.selection.policies import ABSplit, Default, Exp3, Exp4, Robust


def entry(context="alice"):
    return Entry("app", context, {"m0": [1.0, 0.0]})


def test_feedback_log_takes_an_entry_once():
    log = FeedbackLog(ttl_s=10, cap=10)
    log.put("r1", entry(), now=0.0)
    assert log.take("r1", now=1.0) == entry()
    assert log.take("r1", now=1.0) is None
    assert log.take("never-seen", now=1.0) is None


def test_feedback_log_forgets_late_entries():
    log = FeedbackLog(ttl_s=10, cap=10)
    log.put("old", entry("a"), now=0.0)
    log.put("new", entry("b"), now=8.0)
    assert log.take("old", now=11.0) is None  # 11 s old: past the TTL
    assert log.take("new", now=11.0).context == "b"
    assert len(log) == 0


def test_feedback_log_drops_the_oldest_past_its_cap():
    log = FeedbackLog(ttl_s=100, cap=3)
    for i in range(5):
        log.put(f"r{i}", entry(str(i)), now=float(i))
    assert len(log) == 3
    assert log.take("r0", now=5.0) is None and log.take("r1", now=5.0) is None
    assert [log.take(f"r{i}", now=5.0).context for i in (2, 3, 4)] == ["2", "3", "4"]


def test_feedback_log_refuses_bad_bounds():
    with pytest.raises(ValueError):
        FeedbackLog(ttl_s=0)
    with pytest.raises(ValueError):
        FeedbackLog(cap=0)


SPEC = {
    "ens": {"models": ["a", "b", "c"], "policy": "robust", "threshold": 0.5,
            "default_output": [0.5, 0.5], "context": "user", "deadline_ms": 20},
    "bandit": {"models": ["a", "b"], "policy": "exp3", "gamma": 0.1},
    "test": {"models": ["a", "b"], "policy": "ab", "split": [0.9, 0.1]},
    "plain": {"models": ["a"]},
    "avg": {"models": ["a", "b"]},
}


def test_applications_read_into_their_policies():
    apps = read_applications(SPEC, known_models=["a", "b", "c"])
    assert apps["ens"].context == "user" and apps["ens"].deadline_ms == 20.0
    kinds = {name: type(policy_of(app, seed=0)) for name, app in apps.items()}
    assert kinds == {"ens": Robust, "bandit": Exp3, "test": ABSplit, "plain": Default, "avg": Exp4}
    bandit = policy_of(apps["bandit"], seed=0)
    assert bandit.gamma == 0.1 and bandit.eta == 0.2
    robust = policy_of(apps["ens"])
    out = robust.combine(robust.init(), None, {"a": np.array([1.0, 0.0]), "b": np.array([0.0, 1.0])})
    assert out.default and out.missing == ("c",)  # 1 of 3 agree: below 0.5


@pytest.mark.parametrize("bad, at", [
    ({"x": {"models": ["a", "zz"]}}, "applications.x.models: unknown model 'zz'"),
    ({"x": {"models": []}}, "applications.x.models"),
    ({"x": {"models": ["a", "a"]}}, "applications.x.models"),
    ({"x": {"models": ["a"], "policy": "greedy"}}, "applications.x.policy"),
    ({"x": {"models": ["a", "b"], "policy": "exp3", "gamma": 0}}, "applications.x.gamma"),
    ({"x": {"models": ["a", "b"], "policy": "robust"}}, "applications.x.default_output: required"),
    ({"x": {"models": ["a", "b"], "policy": "ab", "split": [1.0]}}, "applications.x.split"),
    ({"x": {"models": ["a"], "colour": "red"}}, "applications.x.colour: unknown key"),
    ({"x": {"models": ["a"], "deadline_ms": -1}}, "applications.x.deadline_ms"),
])
def test_applications_refuse_bad_tables_naming_the_key(bad, at):
    with pytest.raises(SpecError, match=at.replace(".", r"\.").replace("(", r"\(")):
        read_applications(bad, known_models=["a", "b", "c"])


def test_application_split_that_does_not_sum_to_one_is_a_spec_error():
    with pytest.raises(SpecError, match="applications.x.split"):
        read_applications({"x": {"models": ["a", "b"], "policy": "ab", "split": [0.5, 0.6]}})
    with pytest.raises(SpecError, match="applications.x.split"):
        read_applications({"x": {"models": ["a", "b"], "policy": "ab", "split": [1.5, -0.5]}})
