"""The throughput search of ``keel bench core`` and ``keel bench gateway`` (bench/rates.py):
a bisection that ends within 5% of the highest rate that passes, from any start."""
from __future__ import annotations

import pytest

from keel.bench.rates import PRECISION, max_rate, spread


def capacity(limit: float, calls: list[float]):
    """A system whose p99 holds up to ``limit`` req/s: what ``probe`` returns, recorded."""
    def try_rate(rate: float) -> dict:
        calls.append(rate)
        return {"rate": rate, "p50_ms": 1.0, "p99_ms": 5.0 if rate <= limit else 50.0, "lost": 0, "ok": rate <= limit}
    return try_rate


@pytest.mark.parametrize("start", [50.0, 2000.0, 9000.0, 40000.0])
def test_the_search_ends_within_its_precision_below_the_capacity_from_any_start(start):
    calls: list[float] = []
    found, rows = max_rate(capacity(7300.0, calls), start, 60000.0, log=lambda s: None)
    assert 7300.0 / PRECISION <= found <= 7300.0
    assert [r["rate"] for r in rows] == calls and len(set(calls)) <= 14
    # a rate that passes is probed once; one that fails twice, and no more
    assert all(calls.count(r) == (1 if r <= 7300.0 else 2) for r in calls)


def test_a_finer_step_from_the_last_figure_needs_few_probes():
    calls: list[float] = []
    found, _ = max_rate(capacity(7300.0, calls), 7000.0, 60000.0, log=lambda s: None, step=1.25)
    assert 7300.0 / PRECISION <= found <= 7300.0 and len(set(calls)) <= 6


def test_a_probe_that_fails_by_chance_below_the_knee_does_not_send_the_search_down():
    """A stall spoils one probe of a rate the system holds: the rate is taken again and a
    majority of three decides; before, the search went on below it."""
    calls: list[float] = []
    holds = capacity(7300.0, calls)

    def stalls_once(rate: float) -> dict:
        row = holds(rate)
        if len(calls) == 3:  # the third probe (4000/s, well below the knee) stalls
            row = {**row, "p99_ms": 45.0, "ok": False}
        return row

    found, rows = max_rate(stalls_once, 1000.0, 60000.0, log=lambda s: None)
    assert 7300.0 / PRECISION <= found <= 7300.0
    assert [(r["rate"], r["ok"], r["probe"]) for r in rows[2:5]] == [(4000.0, False, 1), (4000.0, True, 2), (4000.0, True, 3)]


def test_a_rate_that_fails_two_probes_of_three_fails():
    at_2000 = iter([False, True, False])  # 2000/s: failed, passed, failed; below it every probe passes

    def try_rate(rate: float) -> dict:
        ok = next(at_2000) if rate == 2000.0 else rate < 2000.0
        return {"rate": rate, "p50_ms": 1.0, "p99_ms": 5.0 if ok else 50.0, "lost": 0, "ok": ok}

    found, rows = max_rate(try_rate, 1000.0, 60000.0, log=lambda s: None)
    assert 2000.0 / PRECISION <= found < 2000.0
    assert [r["probe"] for r in rows if r["rate"] == 2000.0] == [1, 2, 3]


def test_the_limit_and_nothing_passing_are_reported_as_such():
    assert max_rate(capacity(1e9, []), 1000.0, 5000.0, log=lambda s: None)[0] == 5000.0
    assert max_rate(capacity(0.5, []), 100.0, 5000.0, log=lambda s: None)[0] == 0.0


def test_two_searches_of_the_same_system_agree_within_their_precision():
    a, _ = max_rate(capacity(12345.0, []), 2000.0, 60000.0, log=lambda s: None)
    b, _ = max_rate(capacity(12345.0, []), 11000.0, 60000.0, log=lambda s: None, step=1.25)
    assert max(a, b) / min(a, b) <= PRECISION


def test_spread_is_the_median_and_range_of_the_repetitions():
    assert spread([5.0, 1.0, 3.0, 2.0]) == {"median": 2.5, "range": [1.0, 5.0], "runs": [5.0, 1.0, 3.0, 2.0]}


def test_bench_core_breakdown_is_a_mode_with_its_own_report():
    from keel.bench import core
    from keel.bench.cli import json_path
    from keel.deploy.keel import parse_args

    args = parse_args(["bench", "core", "--breakdown", "--rate", "3000"])
    assert (args.breakdown, args.rate) == (True, 3000.0)
    assert str(json_path("core", args, core)) == "runs/core-breakdown.json"
    assert str(json_path("core", parse_args(["bench", "core", "--quick"]), core)) == "runs/core-quick.json"
    assert {"floor_p50_us", "floor_throughput_rps", "noop_p50_vs_floor", "noop_throughput_vs_floor"} <= set(core.FIGURES)
