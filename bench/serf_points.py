"""The predicted-against-measured points of ``keel experiment serf``
(``bench.serf_experiment``): each candidate configuration at each load, Poisson arrivals
through the real path, until its mean's standard error is ``POINT_SE`` of the mean.

How a point is measured, and why:
- each run is continuous, and the requests sent in its first ``WARM_RELAX`` relaxation
  times of the queue (``relaxation_s``; at least the first ``WARMUP`` share, at most half
  the run) are left out of its mean: a run starts from an empty queue, and near a
  configuration's capacity the queue takes seconds to fill (a 2 s point at 75% load of the
  large model read 26-35% under Eq. 13's steady state);
- the standard error is by batch means (``batch_means_se``): a queue's latencies are
  correlated, and sigma / sqrt(n) understates it several times at 50-85% load;
- the full run gives each point a pilot run (``PILOT_S``), then spends the model's time
  for points (``POINT_BUDGET_S`` a point on average) where the standard errors need it
  (``extensions``): the standard error falls as 1 / sqrt(the time kept), so a pilot says
  how much longer a point needs; the points that need least get it first, so that the
  most points reach ``POINT_SE``. A light point of a fast configuration reaches 1% in a few
  seconds; one at 75% load of a slow configuration needs minutes, which is why the full
  run's loads stop at 60%. ``--quick`` takes the pilot alone (2 s).
"""
from __future__ import annotations

import math
import time

import numpy as np

from keel.bench.serf_accuracy import within
from keel.bench.serf_design import WARMUP
from keel.bench.serf_step import run_load
from keel.common.queueing import latency, utilisation
from keel.common.steal import least_starved
from keel.services.serf.profiler import service_between, service_counters, set_configuration

#: a point is measured once its mean's standard error is at most this fraction of it
POINT_SE = 0.01
#: a point's warm-up: the requests sent in its first WARM_RELAX relaxation times of the queue
#: (``relaxation_s``), at most half of the run, are left out of its mean
WARM_RELAX = 3.0
#: the full run's points: a pilot run of PILOT_S each, then the model's time for points
#: (POINT_BUDGET_S a point on average, POINT_MAX_S at most for one) spent where the
#: standard error needs it (``extensions``), in at most PASSES rounds; runs of at least
#: MIN_RUN_S, with NEED_MARGIN x the time the standard error says
PILOT_S, POINT_BUDGET_S, POINT_MAX_S, PASSES, MIN_RUN_S, NEED_MARGIN = 6.0, 30.0, 120.0, 3, 2.0, 1.3
#: batches of the batch-means standard error
BATCHES = 10
#: a stable point for the projected exhaustive sweep (a 95% interval of +-3%)
STABLE_SE = 0.015


def batch_means_se(values) -> float:
    """The standard error of the mean of a queue's latencies in arrival order. They are
    correlated (a request waits behind those before it), so the spread of ``BATCHES``
    consecutive batches' means, not of the values, says how far the mean may be off."""
    v = np.asarray(values, float)
    k = min(BATCHES, len(v) // 4)
    if k < 2:
        return float("inf")
    means = v[: k * (len(v) // k)].reshape(k, -1).mean(axis=1)
    return float(means.std(ddof=1) / math.sqrt(k))


def relaxation_s(p, config, rate: float) -> float:
    """How long a queue started empty takes to come near its steady state at ``rate``: the
    relaxation time of a queue in heavy traffic, 1 / (c mu_c (1 - sqrt(rho))^2) (0.1 s for
    1x8 at 45% of its capacity, 0.7 s at 75%, 4 s for the large model's 8x1 at 85%)."""
    cap = p.capacity(config)
    return 1.0 / (cap * (1.0 - math.sqrt(min(rate / cap, 0.99))) ** 2)


def run_point(client, model, inputs, rate: float, seconds: float, warm_s: float, seed: int) -> dict:
    """One continuous run of Poisson arrivals at ``rate`` for ``seconds``: the latencies of
    the requests sent after its first ``warm_s`` (at least its first ``WARMUP`` share: the
    queue fills from empty), the requests sent and lost, and the time it took."""
    t = time.monotonic()
    records, s = run_load(client, model, inputs, rate, seconds, 100_000, seed=seed)
    t0 = records[0].sent if records else 0.0
    skip = max(int(WARMUP * len(records)), sum(1 for r in records if r.sent - t0 < warm_s))
    kept = [r.latency_ms for r in records[skip:] if r.latency_ms is not None and not r.error_code]
    return {"kept": kept, "sent": len(records), "lost": s["lost"], "kept_s": max(0.0, seconds - warm_s),
            "took_s": time.monotonic() - t}


def merge(parts: list[dict]) -> dict:
    """A point from its runs: the mean and batch-means standard error of every kept latency."""
    kept = [ms for part in parts for ms in part["kept"]]
    mean = float(np.mean(kept)) if kept else float("nan")
    se = batch_means_se(kept)
    return {"mean_ms": mean, "se_ms": se, "n": sum(part["sent"] for part in parts), "kept": len(kept),
            "lost": sum(part["lost"] for part in parts), "runs": len(parts), "capped": not se <= POINT_SE * mean,
            "took_s": sum(part["took_s"] for part in parts), "kept_s": sum(part["kept_s"] for part in parts)}


def extensions(points: list[dict], budget_s: float, max_s: float) -> list[float]:
    """Seconds more for each point (``merge``'s figures), within ``budget_s`` in all and
    ``max_s`` a point: what its standard error says it needs to reach ``POINT_SE`` (it falls
    as 1 / sqrt(the time kept); ``NEED_MARGIN`` more, as the estimate is itself noisy),
    the points that need least first, so that the most points reach it; what is left goes
    to the rest, in the same order. Why: a point at light load of a fast configuration
    reaches 1% in a few seconds, one at 75% load of a slow one needs minutes: one cap for
    every point spends the time where it is not needed and stops short where it is."""
    need = []
    for m in points:
        rel = m["se_ms"] / m["mean_ms"] if m["kept"] and math.isfinite(m["se_ms"]) else float("inf")
        if rel <= POINT_SE:
            need.append(0.0)
        elif math.isfinite(rel) and m["kept_s"] > 0:
            need.append(NEED_MARGIN * m["kept_s"] * ((rel / POINT_SE) ** 2 - 1.0))
        else:
            need.append(max_s)  # too few requests to say: as long as a point may run
    more = [0.0] * len(points)
    for k in sorted(range(len(points)), key=lambda j: need[j]):
        give = min(need[k], max(0.0, max_s - points[k]["took_s"]), budget_s)
        if give >= MIN_RUN_S:
            more[k], budget_s = give, budget_s - give
    return more


def stable_requests(se_ms: float, n: int, mean_ms: float) -> int:
    """Requests a run needs for its mean's standard error to be ``STABLE_SE`` of ``mean_ms``,
    from the standard error ``se_ms`` that runs of ``n`` requests give (1/sqrt(n));
    the warm-up (``WARMUP``) added; at least the warm-up and one request."""
    need = n * (se_ms / (STABLE_SE * mean_ms)) ** 2 if mean_ms > 0 else float(n)
    return max(int(math.ceil(need / (1 - WARMUP))), int(WARMUP * n) + 1)


def inrun_prediction(p, config, rate: float, intervals: list[tuple[dict, dict]]) -> float | None:
    """Eq. 13 (+ path) with mu_i from the service times the worker measured during the
    point's runs (its counters before and after each; the profile's where fewer than 3
    batches started with i running)."""
    c, t = config
    h = p.handoff_ms.get(c, 0.0)
    mu = []
    for i in range(1, c + 1):
        k = total = 0.0
        for before, after in intervals:
            n, mean, _ = service_between(before, after, i)
            k, total = k + n, total + n * mean
        mu.append(1000.0 / ((total / k if k >= 3 else p.service_ms[(i, t)]) + h))
    if utilisation(mu, rate) >= 1:
        return None
    return latency(mu, rate) * 1000.0 - h + p.path_at(rate)


def predicted_vs_measured(client, spec, model, p, configs, inputs, pilot_s, budget_s, log, loads) -> tuple[list[dict], float]:
    """Every candidate at every load: a pilot run of ``pilot_s`` each, then what is left of
    ``budget_s`` (the pilots included) spent where the standard errors need it
    (``extensions``, at most ``PASSES`` rounds); each run continuous, its warm-up
    (``relaxation_s``) left out. The points and the time they took."""
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    workers = [s.config.status_endpoint for s in spec.services if s.role == "worker"]
    keys = [(config, k, load) for config in configs for k, load in enumerate(loads)]
    parts: dict = {key: [] for key in keys}
    intervals: dict = {key: [] for key in keys}
    steal: dict = {key: [] for key in keys}

    def measure(key, seconds: float) -> None:
        config, k, load = key
        rate = load * p.capacity(config)
        warm = min(WARM_RELAX * relaxation_s(p, config, rate), 0.5 * seconds)
        seed = 100 + k + 1000 * len(parts[key])  # each run of a point its own arrivals

        def one_run():
            before = service_counters(workers)
            part = run_point(client, model, inputs, rate, seconds, warm, seed)
            return before, service_counters(workers), part

        (before, after, part), stolen, takes = least_starved(one_run, log=log, what=f"{config[0]}x{config[1]} at {load:.0%}")
        parts[key].append(part)
        intervals[key].append((before, after))
        steal[key].append((stolen, takes))

    def measure_all(seconds: dict) -> None:
        current = None
        for key in keys:  # configuration by configuration: one switch each
            if seconds.get(key, 0.0) > 0:
                if key[0] != current:
                    set_configuration(dispatcher, model, *key[0])
                    current = key[0]
                measure(key, seconds[key])

    measure_all({key: pilot_s for key in keys})
    for _ in range(PASSES):
        figures = [merge(parts[key]) for key in keys]
        left = budget_s - sum(f["took_s"] for f in figures)  # the pilots count in the budget
        more = extensions(figures, left, POINT_MAX_S)
        if not any(more):
            break
        log(f"   {sum(m > 0 for m in more)} points need more for a {POINT_SE:.0%} standard error: "
            f"{sum(more):.0f} s of the {left:.0f} s left")
        measure_all(dict(zip(keys, more)))
    points, exhaustive_s = [], 0.0
    for key in keys:
        config, k, load = key
        rate = load * p.capacity(config)
        m = merge(parts[key])
        stolen = max((s for s, _ in steal[key] if s is not None), default=None)
        exhaustive_s += m["took_s"]
        inrun = inrun_prediction(p, config, rate, intervals[key])
        measured, predicted = m["mean_ms"], p.predict_ms(config, rate)
        err = abs(predicted - measured) / measured
        # beside it, the one path of the profile's spaced requests at every rate (as before the path by rate)
        const = predicted - p.path_at(rate) + p.path_ms
        stderr = m["se_ms"] / measured if math.isfinite(m["se_ms"]) else None
        stable_n = stable_requests(m["se_ms"], m["kept"], measured) if stderr is not None else None
        points.append({"config": list(config), "load": load, "rate": round(rate, 3), "n": m["n"], "kept": m["kept"],
                       "runs": m["runs"], "took_s": round(m["took_s"], 1),
                       "warmup_s": round(min(WARM_RELAX * relaxation_s(p, config, rate), 0.5 * pilot_s), 2),
                       "predicted_ms": round(predicted, 3), "measured_ms": round(measured, 3),
                       "error": round(err, 4), "se_ms": round(m["se_ms"], 3) if stderr is not None else None,
                       "path_term_ms": round(p.path_at(rate), 3), "predicted_const_ms": round(const, 3),
                       "error_const": round(abs(const - measured) / measured, 4),
                       "within_2se": within(predicted - measured, m["se_ms"]),
                       "within_2se_const": within(const - measured, m["se_ms"]),
                       "stderr": None if stderr is None else round(stderr, 4), "capped": m["capped"],
                       "inrun_predicted_ms": None if inrun is None else round(inrun, 3),
                       "inrun_error": None if inrun is None else round(abs(inrun - measured) / measured, 4),
                       "lost": m["lost"], "stable_n": stable_n,
                       "stable_s": None if stable_n is None else round(stable_n / rate, 1),
                       "steal": None if stolen is None else round(stolen, 4), "takes": sum(t for _, t in steal[key])})
        log(f"   {config[0]}x{config[1]} at {load:4.0%} ({rate:6.1f}/s, {m['n']:5d} req, {m['runs']} runs, {m['took_s']:4.1f} s): "
            f"predicted {predicted:7.2f} ms, measured {measured:7.2f} +- {m['se_ms']:.2f} ms "
            f"(SE {stderr or float('inf'):.1%}{', capped' if m['capped'] else ''}), error {err:6.1%} "
            f"(one path {abs(const - measured) / measured:6.1%}); in-run "
            + ("unstable" if inrun is None else f"{inrun:7.2f} ms") + f"; steal {stolen or 0:.0%}")
    return points, exhaustive_s
