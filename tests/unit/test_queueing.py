"""SERF's M/D_interf/c model (Eq. 2-13, Eq. 12 with p0 restored) against closed forms and a
discrete-event simulation of the same queue."""
from __future__ import annotations

import pytest

from keel.common.queueing import latency, reference_table, simulate, utilisation


def test_md1_closed_form():
    # M/D/1: W = 1/mu + rho / (2 mu (1 - rho))
    mu, lam = 100.0, 70.0
    rho = lam / mu
    assert latency([mu], lam) == pytest.approx(1 / mu + rho / (2 * mu * (1 - rho)), rel=1e-12)


def test_light_load_is_the_single_request_service_time():
    assert latency([100.0, 60.0, 40.0], 0.01) == pytest.approx(0.01, rel=1e-3)


@pytest.mark.parametrize("mu", [[100.0, 100.0], [100.0, 90.0], [100.0, 90.0, 80.0, 70.0], [200.0, 150.0, 120.0, 100.0]],
                         ids=str)
@pytest.mark.parametrize("load", [0.2, 0.5, 0.8])
def test_eq13_agrees_with_simulation_within_2_percent(mu, load):
    lam = load * len(mu) * mu[-1]
    assert utilisation(mu, lam) == pytest.approx(load)
    assert latency(mu, lam) == pytest.approx(simulate(mu, lam, n=60_000, seed=1), rel=0.02)


def test_eq12_as_printed_disagrees_with_simulation():
    """The paper's Eq. 12 drops p0 from its tail term (NOTES.md); as printed, the latency at
    c=2, rho=0.8 is far off the simulation, while the corrected form is within 2%."""
    mu, lam = [100.0, 90.0], 0.8 * 2 * 90.0
    rho, r1, r2 = utilisation(mu, lam), lam / mu[0], lam / mu[1]
    tail = r1 * r2 / (2 * (1 - rho))
    p0 = 1 / (1 + r1 + tail)
    printed = latency(mu, lam) + (1 - p0) * tail / mu[1]  # the tail term without its p0
    measured = simulate(mu, lam, n=60_000, seed=2)
    assert abs(printed - measured) / measured > 0.10
    assert latency(mu, lam) == pytest.approx(measured, rel=0.02)


@pytest.mark.parametrize("mu,lam", [([100.0], 100.0), ([100.0, 50.0], 120.0), ([], 1.0), ([100.0], 0.0), ([0.0], 1.0)])
def test_unstable_or_bad_inputs_are_refused(mu, lam):
    with pytest.raises(ValueError):
        latency(mu, lam)


def test_reference_table_picks_threads_at_light_load_and_concurrency_at_heavy_load():
    """SERF's Fig. 2 shape: one request with two threads is faster alone (10 ms vs 16 ms),
    two requests at once with one thread each carry more load (2 x 62.5/s vs 100/s)."""
    profiles = {(1, 2): [100.0], (2, 1): [62.5, 62.5]}
    table = reference_table(profiles, [10.0, 90.0, 110.0])
    assert [row["best"] for row in table] == [(1, 2), (2, 1), (2, 1)]
    assert (1, 2) not in table[2]["latency_s"]  # unstable at 110/s: left out
    assert table[0]["latency_s"][(1, 2)] == pytest.approx(latency([100.0], 10.0))


def test_reference_table_refuses_a_profile_of_the_wrong_length():
    with pytest.raises(ValueError, match="profiled rates"):
        reference_table({(2, 1): [100.0]}, [10.0])


def test_every_load_of_a_table_of_many_configurations_has_a_best_one():
    profiles = {(c, t): [100.0 / t ** 0.5 * (1 - 0.05 * i) for i in range(c)] for c in range(1, 9) for t in range(1, 9)
                if c * t <= 16}
    table = reference_table(profiles, [10.0 * i for i in range(1, 9)])
    assert all(row["best"] is not None for row in table) and len(table) == 8


def test_simulate_replays_given_arrivals():
    # M/D/1 at 10 ms: alone, each takes 10 ms; three at once wait 0, 10 and 20 ms
    assert simulate([100.0], 1.0, arrivals=[0.0, 1.0, 2.0], warmup=0.0) == pytest.approx(0.010)
    assert simulate([100.0], 1.0, arrivals=[0.0, 0.0, 0.0], warmup=0.0) == pytest.approx(0.020)
    # two servers, interference: the second to start runs at mu_2 (20 ms)
    assert simulate([100.0, 50.0], 1.0, arrivals=[0.0, 0.0], warmup=0.0) == pytest.approx(0.015)


def test_shared_sojourns_slow_a_request_while_others_run_beside_it():
    import numpy as np

    from keel.common.queueing import shared_sojourn_times, sojourn_times

    # alone 100 ms; two at once each at half speed
    mu = [10.0, 5.0]
    # both at 0: 200 ms each (timed at their start, the same)
    assert shared_sojourn_times(mu, [0.0, 0.0]) == pytest.approx([0.2, 0.2])
    # the second 50 ms later: the first alone for half its work, then both at half speed;
    # the second ends alone (150 ms each), where timing by the start gives 100 and 200 ms
    assert shared_sojourn_times(mu, [0.0, 0.05]) == pytest.approx([0.15, 0.15])
    assert sojourn_times(mu, [0.0, 0.05]) == pytest.approx([0.1, 0.2])
    # FCFS and at most len(mu) at once: a third waits for the first to end
    assert shared_sojourn_times(mu, [0.0, 0.0, 0.0]) == pytest.approx([0.2, 0.2, 0.3])
    # with no interference the two readings are one
    arrivals = np.cumsum(np.random.default_rng(0).exponential(1 / 100.0, 5000))
    assert shared_sojourn_times([60.0] * 2, arrivals) == pytest.approx(sojourn_times([60.0] * 2, arrivals))
