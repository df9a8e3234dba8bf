"""How a SERF experiment point is measured (bench/serf_points.py): its warm-up, its runs
merged, and the time for points spent where the standard errors need it."""
from __future__ import annotations

import numpy as np
import pytest

from keel.bench import serf_points
from keel.common.queueing import shared_sojourn_times
from keel.bench.serf_points import POINT_SE, extensions, inrun_prediction, merge, relaxation_s, run_point
from keel.services.serf.profile import Profile


def _point(rel_se: float, kept_s: float, took_s: float | None = None) -> dict:
    return {"mean_ms": 100.0, "se_ms": 100.0 * rel_se, "kept": 500, "kept_s": kept_s, "took_s": took_s or kept_s}


def test_the_time_for_points_goes_first_to_those_that_need_least():
    # standard errors 0.5%, 2%, 3% and 10% after 6 s kept: none more, 3 x 6 s, 8 x 6 s, 99 x 6 s
    points = [_point(0.005, 6.0), _point(0.02, 6.0), _point(0.03, 6.0), _point(0.10, 6.0)]
    more = extensions(points, budget_s=100.0, max_s=120.0)
    assert more[0] == 0.0  # already there
    margin = serf_points.NEED_MARGIN
    assert more[1] == pytest.approx(margin * 6.0 * 3.0) and more[2] == pytest.approx(margin * 6.0 * 8.0)
    # what is left goes to the point that cannot reach it, within the budget
    assert more[3] == pytest.approx(100.0 - more[1] - more[2]) and sum(more) <= 100.0 + 1e-9
    # with less time, the cheaper point gets its whole need and the dearer none of what it cannot use
    tight = extensions(points, budget_s=30.0, max_s=120.0)
    assert tight[1] == pytest.approx(margin * 18.0) and tight[2] == pytest.approx(30.0 - margin * 18.0)
    # no point runs past its own cap
    assert extensions([_point(0.10, 6.0, took_s=110.0)], 1000.0, 120.0) == [pytest.approx(10.0)]
    # a point with too few requests to say runs as long as a point may
    assert extensions([{"mean_ms": 50.0, "se_ms": float("inf"), "kept": 3, "kept_s": 1.0, "took_s": 2.0}], 500.0, 60.0) == [58.0]
    assert extensions(points, 0.0, 120.0) == [0.0] * 4  # --quick: the pilot alone
    # a point just over it (a need of a fraction of a second) still gets one short run
    assert extensions([_point(0.0101, 6.0)], 100.0, 120.0) == [serf_points.MIN_RUN_S]


def test_a_queue_from_empty_takes_longer_to_fill_near_its_capacity_and_on_slower_servers():
    p = Profile("m", "1", 8, {(1, 8): 10.0, (8, 1): 40.0, **{(i, 1): 40.0 for i in range(1, 9)}})
    cap = p.capacity((1, 8))  # 100/s
    assert relaxation_s(p, (1, 8), 0.75 * cap) > 3 * relaxation_s(p, (1, 8), 0.45 * cap)
    assert relaxation_s(p, (1, 8), 0.75 * cap) == pytest.approx(1.0 / (cap * (1 - np.sqrt(0.75)) ** 2))
    assert relaxation_s(p, (1, 8), 2 * cap) < float("inf")  # past capacity: bounded, not a crash


class _Rec:
    def __init__(self, sent: float, ms: float | None, error_code=None):
        self.sent, self.latency_ms, self.error_code = sent, ms, error_code


def test_a_points_warm_up_is_left_out_and_its_runs_merge(monkeypatch):
    # 10 s at 20/s: the first 2 s fill the queue (100 ms), then 10 ms; one request lost
    records = [_Rec(100.0 + k / 20, 100.0 if k < 40 else 10.0) for k in range(200)] + [_Rec(110.0, None)]
    monkeypatch.setattr(serf_points, "run_load", lambda *a, **k: (records, {"lost": 1}))
    part = run_point(None, "m", None, 20.0, 10.0, warm_s=2.0, seed=1)
    assert part["kept"] == [10.0] * 160 and part["kept_s"] == 8.0 and part["sent"] == 201
    # a warm-up shorter than the WARMUP share: the share still goes
    short = run_point(None, "m", None, 20.0, 10.0, warm_s=0.0, seed=1)
    assert len(short["kept"]) == len(records) - 1 - int(serf_points.WARMUP * len(records))
    m = merge([part, part])
    assert m["mean_ms"] == 10.0 and m["kept"] == 320 and m["runs"] == 2 and m["lost"] == 2 and m["kept_s"] == 16.0
    assert m["se_ms"] == 0.0 and not m["capped"]  # constant latencies: the standard error is nil
    noisy = merge([{"kept": list(np.linspace(10, 30, 40)), "sent": 40, "lost": 0, "kept_s": 2.0, "took_s": 2.1}])
    assert noisy["capped"] and noisy["se_ms"] > POINT_SE * noisy["mean_ms"]


def test_the_in_run_prediction_pools_the_service_times_of_every_run_of_a_point():
    p = Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0})
    zero = {}
    # two runs: 10 batches at 24 ms, then 30 at 28 ms alone: 27 ms pooled
    first, second = {1: (10, 240.0, 0.0)}, {1: (40, 1080.0, 0.0)}
    pooled = inrun_prediction(p, (1, 1), 10.0, [(zero, first), (first, second)])
    alone = inrun_prediction(Profile("m", "1", 2, {(1, 1): 27.0, (1, 2): 12.0, (2, 1): 21.0}), (1, 1), 10.0, [])
    assert pooled == pytest.approx(alone)
    # fewer than 3 batches: the profile's own figure
    assert inrun_prediction(p, (1, 1), 10.0, [(zero, {1: (2, 60.0, 0.0)})]) == pytest.approx(p.predict_ms((1, 1), 10.0))


def _loaded_run(monkeypatch, mu_true: list[float], rate: float, seconds: float, seed: int, path_ms: float = 2.0):
    """A run whose latencies are those of a queue with ``mu_true`` on its own Poisson
    arrivals, plus a path with noise: what ``run_load`` would give from a live host."""
    rng = np.random.default_rng(seed)
    sent = 50.0 + np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds)))
    ms = shared_sojourn_times(mu_true, sent - sent[0]) * 1000.0 + path_ms + rng.normal(0.0, 0.3, len(sent))
    records = [_Rec(t, float(v)) for t, v in zip(sent, ms)]
    monkeypatch.setattr(serf_points, "run_load", lambda *a, **k: (records, {"lost": 0}))


def test_a_loaded_points_mean_is_estimated_against_the_profiles_queue_on_the_same_arrivals(monkeypatch):
    # 2 slots of 10 ms at 75% load (150/s): the plain mean of 20 s moves by several percent
    p = Profile("m", "1", 2, {(1, 1): 10.0, (2, 1): 10.0})
    rate, queue = 150.0, serf_points.queue_of(p, (2, 1))
    truth = serf_points.steady(queue, rate, seed=99)[0] + 2.0  # the queue's long-run mean, plus the path
    steady = serf_points.steady(queue, rate)
    for seed in range(3):
        _loaded_run(monkeypatch, queue[0], rate, 20.0, seed)
        m = merge([run_point(None, "m", None, rate, 20.0, warm_s=1.0, seed=seed, queue=queue)], steady)
        # the arrivals' bursts are the replay's too: the difference is the path and its noise
        assert m["se_ms"] < m["plain_se_ms"] / 4
        assert abs(m["mean_ms"] - truth) < 3 * m["se_ms"] + 0.02 * truth
        assert m["se_ms"] <= POINT_SE * m["mean_ms"] and not m["capped"]
    # without the steady state (or a run without its replay): the plain mean, as before
    plain = merge([run_point(None, "m", None, rate, 20.0, warm_s=1.0, seed=0)], steady)
    assert plain["mean_ms"] == plain["plain_mean_ms"] and plain["se_ms"] == plain["plain_se_ms"]


def test_the_estimate_follows_the_host_not_the_profile_when_they_differ(monkeypatch):
    # the host serves 15% slower than its profile says: the estimate is the host's mean,
    # not the profile's (the replay only takes out the noise both share)
    p = Profile("m", "1", 2, {(1, 1): 10.0, (2, 1): 10.0})
    rate, queue = 130.0, serf_points.queue_of(p, (2, 1))
    slower = [m / 1.15 for m in queue[0]]
    truth = serf_points.steady((slower, 0.0), rate, seed=99)[0] + 2.0
    assert truth > 1.3 * serf_points.steady(queue, rate)[0]  # far apart: the test can tell them
    estimates = []
    for seed in range(4):
        _loaded_run(monkeypatch, slower, rate, 30.0, seed)
        m = merge([run_point(None, "m", None, rate, 30.0, warm_s=1.0, seed=seed, queue=queue)],
                  serf_points.steady(queue, rate))
        estimates.append(m["mean_ms"])
    assert abs(np.mean(estimates) - truth) < 0.05 * truth
