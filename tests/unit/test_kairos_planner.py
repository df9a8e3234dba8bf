"""Kairos pool planner (common/kairos/planner.py, §5.2 Eq. 9-15, Algorithm 1)."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common.kairos.planner import (Pool, TypeProfile, derive, enumerate_pools, kairos_plus,
                                   pick_without_trials, plan_pools, upper_bounds)
from keel.common.kairos.profiles import BASE_TYPE, DEFAULT_ROOT, Profiles

needs_data = pytest.mark.skipif(not (DEFAULT_ROOT / "data.tar.gz").exists(),
                                reason=f"Kairos profile data absent at {DEFAULT_ROOT}")
TYPES = ["base", "cpu"]
FIG = {"base": TypeProfile(qps=10.0), "cpu": TypeProfile(qps=4.0, vio_batch=500, small_ratio=0.8, time_ratio=0.5)}


def below(type_, v):
    return FIG[type_].qps


@pytest.fixture(scope="module")
def prof():
    return Profiles.load()


def test_upper_bound_two_regimes_by_hand():
    # 1 base + 1 cpu: Q_b = 10, t = .5, r = .8, Q_A = 4 -> base bound 20, aux bound 10 + .5*4/.8 = 12.5
    # 1 base + 8 cpu: Q_A = 32 -> aux bound 30 > base bound 20: the base is the bottleneck (Eq. 9)
    ub = upper_bounds(np.array([[1, 1], [1, 8], [2, 0], [0, 5]]), FIG, below, TYPES)
    assert ub.tolist() == pytest.approx([12.5, 20.0, 20.0, 0.0])


def test_upper_bound_eq11_slack_form_equals_closed_form():
    q_b, q_a, r, t = 10.0, 4.0, 0.8, 0.5
    q_large = q_b * (1 - r) / (1 - t)                     # base on large queries alone
    slack = 1 - q_a * (1 - r) / r / q_large
    assert q_a / r + slack * q_b == pytest.approx(q_b + t * q_a / r)


def test_enumerate_respects_budget_and_max():
    pools = enumerate_pools([1.0, 0.3], [3, 5], 2.0)
    assert len(pools) and (pools @ np.array([1.0, 0.3]) <= 2.0 + 1e-9).all()
    assert (pools[:, 0] <= 3).all() and (pools[:, 1] <= 5).all() and (pools.sum(axis=1) > 0).all()
    assert [2, 0] in pools.tolist() and [1, 3] in pools.tolist() and [2, 1] not in pools.tolist()


def test_pick_top3_agree_else_similarity():
    agree = [Pool((1, 5), 1, 9), Pool((1, 4), 1, 8), Pool((1, 3), 1, 7), Pool((2, 0), 1, 6)]
    assert pick_without_trials(agree) == (agree[0], "top-3 agree on base count")
    # an outlier (3, 0) on top; summed squared distances: (1, 4) 35, (1, 5) 39, (1, 3) 43, (3, 0) 155
    ranked = [Pool((3, 0), 1, 10)] + [Pool((1, k), 1, 9 - k / 10) for k in (4, 5, 6, 3, 7)]
    pick, rule = pick_without_trials(ranked)
    assert rule == "similarity" and pick.counts == (1, 4)


def test_kairos_plus_prunes_by_bound_and_subconfiguration():
    ranked = [Pool((1, 2), 1, 10), Pool((1, 1), 1, 9), Pool((2, 0), 1, 8.5), Pool((0, 3), 1, 5)]
    seen = []

    def evaluate(p):
        seen.append(p.counts)
        return {(1, 2): 7.0, (2, 0): 8.0}[p.counts]
    out = kairos_plus(ranked, evaluate)
    # (1, 1) is a sub-configuration of (1, 2); (0, 3)'s bound 5 < 8 stops the search
    assert seen == [(1, 2), (2, 0)]
    assert out["best"].counts == (2, 0) and out["qps"] == 8.0 and out["evaluated"] == 2


@needs_data
@pytest.mark.parametrize("model", ["dien", "mtwnd", "ncf", "rm2", "wnd"])
def test_derivation_matches_allocator_profile(prof, model):
    figures, _ = derive(prof, model)
    given = prof.allocator[model]
    assert figures[BASE_TYPE].qps == pytest.approx(given[BASE_TYPE]["qps"], rel=0.02)
    for t in ("c5n.2xlarge", "r5n.large"):   # t3.xlarge: see test below
        g, f = given[t], figures[t]
        assert abs(f.vio_batch - g["vio_batch"]) <= 10
        assert f.qps == pytest.approx(g["qps"], rel=0.06)
        assert f.small_ratio == pytest.approx(g["small_ratio"], abs=0.01)
        assert f.time_ratio == pytest.approx(g["time_ratio"], abs=0.01)


@needs_data
def test_derivation_t3_within_looser_margin(prof):
    # the burstable t3's recorded region sits 0-50 items above what its latencies give
    for model in prof.models:
        g, f = prof.allocator[model]["t3.xlarge"], derive(prof, model)[0]["t3.xlarge"]
        assert 0 <= g["vio_batch"] - f.vio_batch <= 50
        assert f.small_ratio == pytest.approx(g["small_ratio"], abs=0.03)
        assert f.qps == pytest.approx(g["qps"], rel=0.15)


@needs_data
def test_plan_rm2_real_data(prof):
    plan = plan_pools(prof, "rm2", budget=2.5)
    assert all(p.cost <= 2.5 + 1e-9 for p in plan.ranked)
    ubs = [p.upper_bound for p in plan.ranked]
    assert ubs == sorted(ubs, reverse=True)
    assert plan.argmax == plan.ranked[0]
    assert plan.homogeneous.counts == (4, 0, 0, 0)          # only the base meets QoS alone
    assert plan.argmax.upper_bound > 2 * plan.homogeneous.upper_bound
    assert plan.pick in plan.ranked[:10]
    js = plan.to_json()
    assert js["pools"] == len(plan.ranked) and js["pick"]["counts"][BASE_TYPE] == plan.pick.counts[0]


@needs_data
def test_plan_kairos_plus_with_bound_as_trial_evaluates_one(prof):
    plan = plan_pools(prof, "mtwnd", evaluate=lambda p: p.upper_bound)
    assert plan.kairos_plus["evaluated"] == 1 and plan.kairos_plus["best"] == plan.ranked[0]


@needs_data
def test_keel_kairos_plan_cli_writes_json(tmp_path, capsys):
    import orjson

    from keel.deploy.keel import main

    out = tmp_path / "plan.json"
    assert main(["kairos", "plan", "--model", "rm2", "--budget", "2.5", "--top", "3", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "homogeneous" in printed and "pick" in printed and "argmax" in printed
    js = orjson.loads(out.read_bytes())
    assert len(js["top"]) == 3 and js["homogeneous"]["counts"]["g4dn.xlarge"] == 4
    assert js["pick"]["cost"] <= 2.5
