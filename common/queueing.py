"""SERF's latency model: the M/D_interf/c queue (SERF §IV-C, Eq. 2-13).

A model served with service parallelism c (c requests at once) has a profiled mean
service rate ``mu[i-1]`` per request when i requests run together (i = 1..c; interference
makes mu fall with i). Poisson arrivals at rate ``lam``. The mean latency is the mean
wait in queue plus the mean service time:

- Eq. 2-4: state probabilities of the M/M_interf/c birth-death chain, p_n;
- Eq. 7: its mean wait W_q (Little's law on L_q, Eq. 5-6);
- Eq. 8-11: Cosmetatos' correction from exponential to deterministic service;
- Eq. 12: the mean service time seen by an arrival (PASTA). The paper's tail term drops
  p0; the corrected form (../shared/papers/NOTES.md) is
  ``p0 * prod(rho_i) / (mu_c * c! * (1 - rho))``;
- Eq. 13: W = S + W_q.

Example
-------
>>> round(latency([100.0], 50.0) * 1000, 3)   # M/D/1, rho = 0.5: 10 ms + 5 ms wait
15.0
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np


def utilisation(mu: Sequence[float], lam: float) -> float:
    """rho = lam / (c * mu_c): the queue is stable only below 1."""
    return lam / (len(mu) * mu[-1])


def latencies(mu: Sequence[float], rates) -> np.ndarray:
    """Mean latency (s) of the M/D_interf/c queue at each arrival rate (Eq. 13), NaN where
    it is unstable (rho >= 1). One array operation per term across the rates: the
    reference table of 20 configurations (8 cores) x 200 rates took 57-64 ms one rate at a
    time, where the configurator's table is meant to take under 10 ms."""
    c = len(mu)
    if c == 0 or any(m <= 0 for m in mu):
        raise ValueError("need c >= 1 profiled rates > 0")
    lam = np.asarray(rates, float)
    rho = lam / (c * mu[-1])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        terms = [np.ones_like(lam)]  # terms[n] = prod_{i<=n} rho_i / n!
        for n, m in enumerate(mu, start=1):
            terms.append(terms[-1] * lam / m / n)
        tail = terms[c] / (1 - rho)  # sum_{n>=c} p_n / p0
        p0 = 1.0 / (sum(terms[:c]) + tail)  # Eq. 3-4
        service = sum(p0 * terms[i - 1] / mu[i - 1] for i in range(1, c + 1)) + p0 * tail / mu[-1]  # Eq. 12, corrected
        wait_mm = p0 * terms[c] / lam * rho / (1 - rho) ** 2  # Eq. 7 (terms[c] holds the 1/c!)
        f = (c - 1) * (math.sqrt(4 + 5 * c) - 2) / (16 * c)  # Eq. 9
        g = (1 - rho) / rho  # Eq. 10
        wait = 0.5 * (1 + f * g) * wait_mm  # Eq. 8, 11
        out = service + wait  # Eq. 13
    return np.where((rho < 1) & (lam > 0), out, np.nan)


def latency(mu: Sequence[float], lam: float) -> float:
    """Mean latency (s) of the M/D_interf/c queue at arrival rate ``lam`` (Eq. 13).

    Raises ValueError when the queue is unstable (rho >= 1) or an input is not positive."""
    if len(mu) == 0 or lam <= 0 or any(m <= 0 for m in mu):
        raise ValueError("need c >= 1 profiled rates > 0 and an arrival rate > 0")
    rho = utilisation(mu, lam)
    if rho >= 1:
        raise ValueError(f"unstable: utilisation {rho:.3f} >= 1")
    return float(latencies(mu, [lam])[0])


def simulate(mu: Sequence[float], lam: float, n: int = 100_000, seed: int = 0, warmup: float = 0.1,
             arrivals: Sequence[float] | None = None) -> float:
    """Mean latency (s) of the same queue by discrete-event simulation: FCFS, c servers,
    Poisson arrivals (or the given ``arrivals`` times, s, sorted: a replay of a measured
    run); a request's service time is ``1 / mu[k-1]``, k being the number of requests in
    service once it starts. The reference Eq. 13 is tested against."""
    if arrivals is None:
        arrivals = np.cumsum(np.random.default_rng(seed).exponential(1.0 / lam, n))
    latencies = sojourn_times(mu, arrivals)
    return float(latencies[int(len(latencies) * warmup):].mean())


def sojourn_times(mu: Sequence[float], arrivals: Sequence[float],
                  plan: Sequence[tuple[float, Sequence[float], float]] | None = None) -> np.ndarray:
    """Each request's time in the queue of ``simulate`` (s), from an empty start, for the
    given ``arrivals`` (s, sorted): a replay of one schedule, transients and backlogs in.

    ``plan`` (from s, mu, hand-off s; in time order) changes the queue as it runs, as a
    worker switching configurations does: a request is served as it started, a new one
    starts only while fewer than ``len(mu)`` run, and is held ``1 / mu[k-1]`` plus the
    hand-off (a slot idle between requests), which is left out of its sojourn. Without it: ``mu``, no hand-off."""
    import heapq
    from collections import deque

    plan = list(plan) if plan else [(0.0, mu, 0.0)]
    times = [t for t, _, _ in plan]
    arrivals = np.asarray(arrivals, dtype=float)
    n = len(arrivals)
    running, waiting = [], deque()
    latencies = np.empty(n)

    def queue_at(t: float) -> tuple[Sequence[float], float]:
        _, rates, handoff = plan[max(0, bisect.bisect_right(times, t) - 1)]
        return rates, handoff

    def start(t: float, idx: int) -> None:
        rates, handoff = queue_at(t)
        heapq.heappush(running, (t + 1.0 / rates[len(running)] + handoff, idx, handoff))

    i = done = 0
    while done < n:
        if i < n and (not running or arrivals[i] <= running[0][0]):
            t, idx, i = arrivals[i], i, i + 1
            if len(running) < len(queue_at(t)[0]):
                start(t, idx)
            else:
                waiting.append(idx)
            continue
        t, idx, handoff = heapq.heappop(running)
        latencies[idx], done = t - arrivals[idx] - handoff, done + 1
        while waiting and len(running) < len(queue_at(t)[0]):
            start(t, waiting.popleft())
    return latencies


def reference_table(profiles: dict[tuple[int, int], Sequence[float]], rates: Sequence[float]) -> list[dict]:
    """SERF's configuration reference table (§IV-C, §IV-D): for each arrival rate, the
    predicted mean latency (Eq. 13) of every configuration and the best one.

    ``profiles`` maps a configuration (c requests at once, t threads each) to its profiled
    rates ``mu[0..c-1]``; a configuration unstable at a rate is left out of that row.
    Rows: ``{"rate", "latency_s": {config: W}, "best": config or None}``."""
    by_config = {}
    for config, mu in profiles.items():
        if len(mu) != config[0]:
            raise ValueError(f"configuration {config}: needs {config[0]} profiled rates, got {len(mu)}")
        by_config[config] = latencies(mu, rates).tolist()
    table = []
    for k, lam in enumerate(rates):
        row = {config: w[k] for config, w in by_config.items() if w[k] == w[k]}  # NaN: unstable there
        table.append({"rate": lam, "latency_s": row, "best": min(row, key=row.get) if row else None})
    return table


def shared_sojourn_times(mu: Sequence[float], arrivals: Sequence[float]) -> np.ndarray:
    """Each request's time (s) in the same queue read as its birth-death chain reads it
    (Eq. 2-4): while k requests run, each progresses at ``mu[k-1]`` (its share of the
    host), so a request slows when others start beside it and speeds up when they end,
    as requests that interfere do on a host (``common.serf_host``). FCFS, at most
    ``len(mu)`` at once, from an empty start; ``arrivals`` (s) sorted. With no
    interference (``mu`` all equal) it is ``sojourn_times``.

    Every running request progresses at the same rate, so one clock of the work done by
    each since the start (``work``) orders their ends: a request started at work ``w`` ends
    when the clock reaches ``w + 1``."""
    import heapq
    from collections import deque

    arrivals = np.asarray(arrivals, dtype=float)
    n, c = len(arrivals), len(mu)
    running, waiting = [], deque()  # (work at which it ends, index)
    out = np.empty(n)
    t = work = 0.0
    i = done = 0
    while done < n:
        rate = mu[len(running) - 1] if running else 0.0
        end = t + (running[0][0] - work) / rate if running else math.inf
        if i < n and arrivals[i] <= end:
            work, t, idx, i = work + (arrivals[i] - t) * rate, arrivals[i], i, i + 1
            if len(running) < c:
                heapq.heappush(running, (work + 1.0, idx))
            else:
                waiting.append(idx)
            continue
        finish, idx = heapq.heappop(running)
        work, t = finish, end
        out[idx], done = t - arrivals[idx], done + 1
        if waiting:
            heapq.heappush(running, (work + 1.0, waiting.popleft()))
    return out
