"""Selection policies offline (Clipper §5): Listing 2's calls, Exp3 and Exp4 on Fig. 8's
scenario with synthetic models of known accuracy, robust defaults, stragglers, A/B."""
from __future__ import annotations

import numpy as np
import pytest

from keel.services.selection.policies import ABSplit, Default, Exp3, Exp4, Robust, State, loss

CLASSES = 10
ACCURACY = [0.60, 0.70, 0.75, 0.80, 0.92]  # model m4 is the best
MODELS = [f"m{i}" for i in range(len(ACCURACY))]


def scenario(n: int = 20_000, degrade=(5_000, 10_000), seed: int = 0):
    """Per query: the true class and each model's score vector. Each model is right with
    its accuracy (independently); the best model's outputs are scrambled (a wrong class
    every time) inside ``degrade``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, n)
    outputs = np.zeros((n, len(MODELS), CLASSES), np.float32)
    for j, acc in enumerate(ACCURACY):
        right = rng.random(n) < acc
        wrong = (y + rng.integers(1, CLASSES, n)) % CLASSES
        if j == len(MODELS) - 1:
            right[degrade[0]:degrade[1]] = False
        outputs[np.arange(n), j, np.where(right, y, wrong)] = 1.0
    return y, outputs


def run(policy, y, outputs):
    """Immediate feedback after every query: (errors, the models each query asked)."""
    state, errors, chosen = policy.init(), np.zeros(len(y), bool), []
    for t in range(len(y)):
        asked = policy.select(state, None)
        predictions = {m: outputs[t, MODELS.index(m)] for m in asked}
        errors[t] = loss(y[t], policy.combine(state, None, predictions).output) > 0
        state = policy.observe(state, None, int(y[t]), predictions)
        chosen.append(asked)
    return errors, chosen


def test_exp3_and_exp4_beat_every_single_model_through_a_degradation_and_recovery():
    y, outputs = scenario()
    single = [(np.argmax(outputs[:, j], 1) != y).mean() for j in range(len(MODELS))]
    exp3, chosen = run(Exp3(MODELS, seed=1), y, outputs)
    exp4, _ = run(Exp4(MODELS), y, outputs)
    assert exp3.mean() < min(single) and exp4.mean() < min(single), (exp3.mean(), exp4.mean(), single)
    best = MODELS[-1]
    picks = np.array([c == (best,) for c in chosen])
    assert picks[5_000:5_300].mean() < 0.10  # within 300 queries of the degradation
    assert picks[10_000:11_000].mean() > 0.50  # within 1,000 queries of the recovery
    assert picks[:5_000].mean() > 0.5


def test_without_the_spread_bound_a_degraded_model_never_comes_back():
    """What the bound is for (the test fails if ``spread`` stops mattering)."""
    y, outputs = scenario()
    _, chosen = run(Exp3(MODELS, seed=1, spread=1e9), y, outputs)
    picks = np.array([c == (MODELS[-1],) for c in chosen])
    assert picks[10_000:11_000].mean() < 0.2


def test_exp3_updates_only_the_drawn_model_importance_weighted():
    policy = Exp3(["a", "b"], eta=0.5, gamma=0.0)
    state = policy.init()
    after = policy.observe(state, None, 1, {"a": np.array([1.0, 0.0])})  # a was wrong; p_a = 0.5
    assert after.log_w == [-1.0, 0.0] and after.feedback == 1


def test_exp4_combines_by_weight_and_counts_stragglers_as_disagreeing():
    policy = Exp4(["a", "b", "c", "d"])
    state = State([0.0, 0.0, -5.0, 0.0])
    out = policy.combine(state, None, {"a": np.array([0.2, 0.8]), "b": np.array([0.4, 0.6]), "c": np.array([1.0, 0.0])})
    assert int(np.argmax(out.output)) == 1 and out.missing == ("d",)
    assert out.confidence == pytest.approx(2 / 4)  # a and b agree; c disagrees; d did not answer
    assert policy.combine(state, None, {}).output is None


def test_robust_answers_the_default_below_the_threshold():
    policy = Robust(["a", "b", "c"], default_output=[-1.0, -1.0], threshold=0.9)
    state = policy.init()
    agreed = policy.combine(state, None, {m: np.array([0.0, 1.0]) for m in "abc"})
    split = policy.combine(state, None, {"a": np.array([0.0, 1.0]), "b": np.array([1.0, 0.0]), "c": np.array([0.0, 1.0])})
    assert not agreed.default and agreed.confidence == 1.0
    assert split.default and split.output.tolist() == [-1.0, -1.0] and split.confidence == pytest.approx(2 / 3)


def test_default_and_ab_split():
    assert Default(["a", "b"]).select(State([0.0]), None) == ("a",)
    ab = ABSplit(["a", "b"], [0.25, 0.75], seed=3)
    picks = [ab.select(ab.init(), None)[0] for _ in range(4000)]
    assert abs(picks.count("a") / 4000 - 0.25) < 0.03
    with pytest.raises(ValueError, match="summing to 1"):
        ABSplit(["a", "b"], [0.5, 0.6])


def test_states_round_trip_and_bad_parameters_are_refused():
    state = State([0.0, -1.5], 7)
    assert State.from_dict(state.to_dict()) == state
    for bad in (dict(models=[]), dict(models=["a", "a"]), dict(models=["a"], eta=0)):
        with pytest.raises(ValueError):
            Exp4(**bad)


def test_context_states_survive_a_reopen_and_are_bounded(tmp_path):
    from keel.services.selection.contexts import ContextStore

    path = tmp_path / "contexts.sqlite"
    policy = Exp4(["a", "b"])
    store = ContextStore(path, ttl_s=100.0, cap=3)
    learned = policy.observe(policy.init(), None, 0, {"a": np.array([1.0, 0.0]), "b": np.array([0.0, 1.0])})
    store.put("app", "alice", learned.to_dict(), now=1.0)
    store.close()  # a frontend restart
    store = ContextStore(path, ttl_s=100.0, cap=3)
    assert State.from_dict(store.get("app", "alice", now=2.0)) == learned
    for i, user in enumerate(["u1", "u2", "u3"]):  # the cap: alice, least recently used, goes
        store.put("app", user, policy.init().to_dict(), now=3.0 + i)
    assert store.contexts("app") == ["u1", "u2", "u3"] and store.get("app", "alice", now=6.0) is None
    assert store.get("app", "u1", now=200.0) is None  # older than the TTL
    store.close()
