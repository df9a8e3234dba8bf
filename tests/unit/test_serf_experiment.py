"""The SERF experiment's own arithmetic (bench/serf_experiment.py, bench/serf_design.py,
bench/serf_step.py): a
point's standard error by batch means, the candidate configurations on the emulated
8-core host, and the step load's longer low phases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from keel.bench.serf_accuracy import analyse_model, within
from keel.bench.serf_experiment import candidates
from keel.bench.serf_points import batch_means_se
from keel.bench.serf_design import oracle_mean, step_offsets
from keel.bench.serf_step import phase_means, switch_times
from keel.common.serf_host import PRESETS, SerfHost
from keel.services.serf.profile import Profile, tuples


def test_batch_means_see_the_correlation_a_queue_puts_in_its_latencies():
    rng = np.random.default_rng(3)
    independent = rng.normal(100.0, 10.0, 1000)
    # independent values: batch means agree with sigma / sqrt(n) (within their own noise)
    assert batch_means_se(independent) == pytest.approx(10.0 / math.sqrt(1000), rel=0.5)
    # a slow drift (as a queue's waits): the plain formula sees the same spread, batch means far more
    drifting = independent + 30.0 * np.sin(np.linspace(0, 3 * np.pi, 1000))
    assert batch_means_se(drifting) > 3 * np.std(drifting) / math.sqrt(1000)
    assert batch_means_se([1.0, 2.0, 3.0]) == float("inf")  # too few to say


def _host_profile(preset: str) -> Profile:
    host = SerfHost(**PRESETS[preset])
    return Profile("m", "1", 8, {(i, t): host.service_ms(t, i) for i, t in tuples(8)}, path_ms=3.0,
                   handoff_ms={c: 2.0 for c in range(1, 9)})


def test_the_candidates_are_the_tables_picks_and_the_extremes():
    small = candidates(_host_profile("small"))
    assert (1, 8) in small and (8, 1) in small and len(small) <= 6
    assert any(c * t == 8 and 1 < c < 8 for c, t in small)  # a middle configuration is best somewhere
    large = candidates(_host_profile("large"))
    assert (2, 4) in large  # the interfering model's heavy-load pick (SERF Fig. 12)
    two = Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0})
    assert candidates(two) == two.configurations()  # on 2 cores: all three


def test_the_step_loads_low_phases_last_longer_and_every_figure_follows_them():
    offsets, starts, lengths = step_offsets(10.0, 100.0, 2.0, seed=1, low_factor=3.0)
    assert lengths == [6.0, 2.0, 6.0, 2.0] and starts == [0.0, 6.0, 8.0, 14.0]
    counts = [np.sum((offsets >= s) & (offsets < s + n)) for s, n in zip(starts, lengths)]
    assert all(40 <= c <= 300 for c in counts), counts  # about 60, 200, 60, 200 requests
    series = [[float(t), 10.0 if t < 6 or 8 <= t < 14 else 50.0] for t in np.arange(0, 16, 0.1)]

    class R:
        def __init__(self, t, ms):
            self.sent, self.latency_ms = t, ms

    assert phase_means([R(t, ms) for t, ms in series], starts, lengths) == pytest.approx([10.0, 50.0, 10.0, 50.0])
    # phases are the schedule's: a run whose first request came 0.5 s in is timed from 0.5 s before it
    late = [R(t - 0.5, ms) for t, ms in series if t >= 0.5]
    assert phase_means(late, starts, lengths, first=0.5) == pytest.approx([10.0, 50.0, 10.0, 50.0])
    mean, picks = oracle_mean({"a": {"phases_ms": [10.0, 50.0, 10.0, 50.0], "series": series}}, starts, lengths)
    assert picks == ["a"] * 4
    # a switch 0.5 s after each step, in phases of unequal length
    seen = [(0.0, "1x8", None), (6.5, "4x2", None), (8.5, "1x8", None), (14.5, "4x2", None)]
    assert switch_times(seen, 0.0, starts, lengths) == [0.5, 0.5, 0.5]


def test_a_real_models_drift_is_how_far_its_second_profile_moves_eq13_at_the_points():
    from keel.bench.serf_experiment import drift_error

    a = Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0})
    same = Profile("m", "1", 2, dict(a.service_ms))
    slower = Profile("m", "1", 2, {k: 1.1 * v for k, v in a.service_ms.items()})
    points = [{"config": [1, 1], "rate": 5.0}, {"config": [2, 1], "rate": 60.0}]
    assert drift_error(points, a, same) == 0.0
    moved = drift_error(points, a, slower)
    assert 0.1 < moved < 1.0  # 10% slower service, more than 10% longer latency under load
    # a point the second profile finds unstable counts as a 100% move
    assert drift_error([{"config": [1, 1], "rate": 49.0}], a, slower) == 1.0


def test_the_step_is_designed_where_the_light_loads_best_cannot_carry_the_high_phase():
    from keel.bench.serf_design import ADAPTIVE_TARGET, ORACLE_TARGET, SCORE_AIM, adaptive_replayed, design, replay_bound

    p = _host_profile("small")
    configs = candidates(p)
    plan = design(p, configs, 4.0)
    # each phase has another best configuration, and both the bound the runs can show and
    # the adaptive run replayed are under their targets by the aim's margin
    assert plan["picks"][0] != plan["picks"][1], plan
    assert plan["score"] <= SCORE_AIM, plan
    assert plan["bound"] <= SCORE_AIM * ORACLE_TARGET and plan["adaptive_replayed"] <= SCORE_AIM * ADAPTIVE_TARGET, plan
    assert plan["high_rate"] > plan["low_rate"] and plan["low_factor"] >= 3
    # the light load's best cannot carry the high rate (its backlog grows), even with no hand-off
    light = tuple(map(int, plan["picks"][0].split("x")))
    assert plan["high_rate"] > p.capacity(light) and plan["high_rate"] > light[0] * 1000.0 / p.service_ms[(light[0], light[1])]
    # and some configuration carries it for good (Eq. 13's steady state has a bound)
    assert plan["eq13_bound"] is not None
    # --quick runs every configuration that could be the best single fixed one, and each phase's best
    assert set(plan["picks"]) | {plan["best_single"]} <= set(plan["named"])
    # the figures are the replay's: the bound the worse of the profile's hand-offs and none
    low, high, f = plan["low_rate"], plan["high_rate"], plan["low_factor"]
    worlds = [replay_bound(p, configs, low, high, 4.0, f, h) for h in (True, False)]
    assert max(w["bound"] for w in worlds) == pytest.approx(plan["bound"], abs=1e-3)
    single = worlds[0]["means"][worlds[0]["single"]]
    assert adaptive_replayed(p, low, high, 4.0, f, plan["picks"]) / single == pytest.approx(plan["adaptive_replayed"], abs=1e-3)


def test_high_phases_too_short_for_the_configurator_give_no_step_it_can_show():
    from keel.bench.serf_design import ADAPTIVE_TARGET, SCORE_AIM, design

    # 1.5 s high phases: the backlog built before a switch is still there at the next step
    plan = design(_host_profile("small"), candidates(_host_profile("small")), 1.5)
    assert plan["score"] > SCORE_AIM and plan["adaptive_replayed"] > ADAPTIVE_TARGET, plan


def test_the_replay_sees_the_backlog_and_the_short_phase_that_eq13s_steady_state_does_not():
    from keel.bench.serf_design import replay

    p = _host_profile("small")
    # 2x4 (capacity ~ 2 / 14.1 ms = 142/s) through a 4 s phase at 160/s: the backlog grows,
    # and the low phase after it starts with it
    offsets, starts, lengths = step_offsets(40.0, 160.0, 4.0, seed=5, low_factor=2.0)
    r = replay(p, (2, 4), offsets, starts, [40.0, 160.0] * 2)
    assert r["phases_ms"][1] > 3 * r["phases_ms"][0] and r["phases_ms"][2] > r["phases_ms"][0] + 5.0
    # 4x2 at 86% of its capacity for 1.5 s from an empty queue: well under Eq. 13's steady state
    rate = 0.86 * p.capacity((4, 2))
    offsets, starts, lengths = step_offsets(10.0, rate, 1.5, seed=5, low_factor=2.0)
    r = replay(p, (4, 2), offsets, starts, [10.0, rate] * 2)
    assert r["phases_ms"][1] < p.predict_ms((4, 2), rate)
    # every request's figure is in the series, in the schedule's time
    assert len(r["series"]) == len(offsets) and r["series"][0][0] == pytest.approx(offsets[0])



def test_the_adaptive_run_replayed_switches_after_each_step_and_is_the_fixed_one_without_switches():
    from keel.bench.serf_design import replay, replay_adaptive

    p = _host_profile("small")
    offsets, starts, lengths = step_offsets(40.0, 160.0, 4.0, seed=5, low_factor=2.0)
    rates = np.array([40.0, 160.0] * 2)[np.searchsorted(starts, offsets, side="right") - 1]
    # one configuration throughout: the fixed run's replay, request for request
    same = replay_adaptive(p, [(0.0, (2, 4))], offsets, rates)
    assert same == pytest.approx(np.array(replay(p, (2, 4), offsets, starts, [40.0, 160.0] * 2)["series"])[:, 1])
    # 2x4 cannot carry 160/s; switching to 8x1 0.6 s into each high phase cuts its backlog
    plan = [(0.0, (2, 4)), (starts[1] + 0.6, (8, 1)), (starts[2] + 0.6, (2, 4)), (starts[3] + 0.6, (8, 1))]
    switching = replay_adaptive(p, plan, offsets, rates)
    high = (offsets >= starts[1]) & (offsets < starts[2])
    assert switching[high].mean() < 0.5 * same[high].mean()
    # and the low phase after it starts clean: 2x4 again within a second
    low = (offsets >= starts[2] + 1.0) & (offsets < starts[3])
    assert switching[low].mean() < 1.2 * same[offsets < starts[1]].mean()


def test_no_step_makes_the_interfering_models_bound_small_and_the_design_says_so():
    from keel.bench.serf_design import design

    p = _host_profile("large")
    plan = design(p, candidates(p), 1.5)
    # 2x4 is within ~12% of the best at every load (SERF Fig. 12): the bound stays near 1
    assert 0.85 < plan["bound"] <= 1.0 and plan["best_single"] == "2x4", plan
    assert 0.85 < plan["eq13_bound"] <= 1.0 and plan["eq13_best_single"] == "2x4", plan
    # and with nothing to show, the shortest step of those that tie
    assert plan["low_factor"] <= 4, plan


def test_the_bound_takes_a_low_phase_after_a_high_one_from_its_clean_start():
    from keel.bench.serf_design import oracle_picks

    # "low" is best idle but cannot carry the high phase: its second low phase drains the
    # backlog (100 ms); "high" carries everything. A configurator that switches at the
    # step never builds that backlog: the second low phase is the first one again
    fixed = {"low": {"phases_ms": [10.0, 400.0, 100.0, 300.0]}, "high": {"phases_ms": [30.0, 50.0, 30.0, 50.0]}}
    assert oracle_picks(fixed, 4) == [("low", 0), ("high", 1), ("low", 0), ("high", 3)]
    # where a later phase did better itself, it stands for itself
    fixed["low"]["phases_ms"][2] = 9.0
    assert oracle_picks(fixed, 4)[2] == ("low", 2)
    # a configuration picked for the phase before keeps its own backlog: no clean start for it
    kept = {"mid": {"phases_ms": [20.0, 60.0, 45.0, 60.0]}, "high": {"phases_ms": [30.0, 70.0, 30.0, 70.0]}}
    assert oracle_picks(kept, 4) == [("mid", 0), ("mid", 1), ("high", 2), ("mid", 3)]
    # a high phase stands for itself: its arrivals, not the first high phase's, however
    # much better the first one went (no configuration that carries it enters with a backlog)
    luckier = {"low": {"phases_ms": [10.0, 400.0, 12.0, 300.0]}, "high": {"phases_ms": [30.0, 50.0, 30.0, 60.0]}}
    assert oracle_picks(luckier, 4)[3] == ("high", 3)
    starts, lengths = [0.0, 6.0, 8.0, 14.0], [6.0, 2.0, 6.0, 2.0]
    series = {"low": [[0.5 * k, 10.0] for k in range(12)] + [[6.0 + 0.5 * k, 400.0] for k in range(4)]
              + [[8.0 + 0.5 * k, 100.0] for k in range(12)] + [[14.0 + 0.5 * k, 300.0] for k in range(4)],
              "high": [[0.5 * k, 30.0] for k in range(12)] + [[6.0 + 0.5 * k, 50.0] for k in range(4)]
              + [[8.0 + 0.5 * k, 30.0] for k in range(12)] + [[14.0 + 0.5 * k, 50.0] for k in range(4)]}
    fixed["low"]["phases_ms"][2] = 100.0
    for name in fixed:
        fixed[name]["series"] = series[name]
    mean, picks = oracle_mean(fixed, starts, lengths)
    assert picks == ["low", "high", "low", "high"]
    lat = [10.0] * 12 + [50.0] * 4 + [10.0] * 12 + [50.0] * 4
    assert mean == pytest.approx(np.mean(lat[3:]))


def test_each_points_error_is_split_into_eq13_and_the_path_and_judged_against_its_standard_error():
    # the profile's spaced requests said 3 ms; its loops said 7 ms at 20-40/s and 5 ms at 100/s
    p = Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0}, path_ms=3.0,
                path_points=[(20.0, 7.0, 5), (40.0, 7.0, 5), (100.0, 5.0, 5)])
    # measured: Eq. 13 + 7 ms at 30/s, + 5 ms at 100/s, and one point 10 ms off any path
    points = [{"config": [1, 1], "load": 0.3, "rate": 30.0, "eq13": 25.0, "measured_ms": 32.0, "se_ms": 0.5},
              {"config": [2, 1], "load": 0.9, "rate": 100.0, "eq13": 40.0, "measured_ms": 45.0, "se_ms": 2.0},
              {"config": [2, 1], "load": 0.5, "rate": 50.0, "eq13": 30.0, "measured_ms": 47.0, "se_ms": 1.0}]
    for pt in points:
        pt["path_term_ms"] = p.path_at(pt["rate"])
        pt["predicted_ms"] = pt.pop("eq13") + pt["path_term_ms"]
    out = analyse_model({"profile": p.to_json(), "points": points})
    rows = out["points"]
    assert [r["eq13_ms"] for r in rows] == pytest.approx([25.0, 40.0, 30.0])
    assert [r["implied_path_ms"] for r in rows] == pytest.approx([7.0, 5.0, 17.0])
    assert [r["error_ms"]["const"] for r in rows] == pytest.approx([4.0, 2.0, 14.0])  # the one spaced path
    assert [r["error_ms"]["rate"] for r in rows] == pytest.approx([0.0, 0.0, 17.0 - p.path_at(50.0)])
    # within two standard errors: by the path by rate the first two; by one path only the second
    # fitted to the points (bounds, not predictions): their median 7 ms; one band per point, exact
    assert out["within_2se"] == {"points": 3, "const": 1, "rate": 2, "best_const": 2, "best_rate": 3}
    assert out["mean_error"]["rate"] < out["mean_error"]["const"]
    assert within(-1.9, 1.0) and not within(2.1, 1.0) and not within(0.0, None)


def test_a_poisson_requests_wait_for_one_slot_follows_lindleys_recursion():
    from keel.bench.serf_path import lindley_waits

    # a slot held 10 ms a request: sent at 0, 5, 30 and 32 ms
    waits = lindley_waits(np.array([0.0, 0.005, 0.030, 0.032]), 10.0)
    assert waits == pytest.approx([0.0, 5.0, 0.0, 8.0])
