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
  run's loads stop at 60%. ``--quick`` takes the pilot alone (2 s);
- the mean is estimated with a control variate (``merge``): each request's arrival is
  replayed through the profile's own queue (``common.queueing.shared_sojourn_times``: while
  k run, each progresses at mu_k, as on a host whose requests interfere; the same arrival
  times, from the same empty start), and the point's mean is that queue's
  steady-state mean (``steady``, a long simulation) plus the mean of measured minus
  replayed. The two share the arrivals' bursts, which are most of a loaded queue's
  variance, so the difference's standard error is a fraction of the plain mean's (and the
  replay's transient from an empty start cancels the measured one's). The estimate is
  unbiased whatever the profile says (the replay's expected mean is ``steady``'s by
  construction); a profile far from the host only makes the difference noisier. The plain
  mean and its standard error are reported beside it (``plain_mean_ms``, ``plain_se_ms``).
"""
from __future__ import annotations

import math
import time

import numpy as np

from keel.bench.serf_accuracy import within
from keel.bench.serf_design import WARMUP
from keel.bench.serf_step import run_load
from keel.common.queueing import latency, shared_sojourn_times, utilisation
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
#: arrivals of the long simulation that gives the replayed queue's steady-state mean (``steady``)
STEADY_ARRIVALS = 400_000


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


def queue_of(p, config) -> tuple[list[float], float]:
    """The profile's queue of ``config`` as the replay serves it: (mu_1..mu_c with the
    hand-off, the hand-off ms), as ``Profile.predict_ms`` reads it."""
    return p.mu(config), p.handoff_ms.get(config[0], 0.0)


def replayed_ms(queue: tuple[list[float], float], sent: list[float]) -> np.ndarray:
    """Each request's time (ms) in ``queue`` for the arrivals ``sent`` (s), from an empty
    start, less the hand-off (as ``Profile.predict_ms``)."""
    mu, handoff_ms = queue
    return shared_sojourn_times(mu, np.maximum.accumulate(np.asarray(sent, float) - sent[0])) * 1000.0 - handoff_ms


def steady(queue: tuple[list[float], float], rate: float, seed: int = 0) -> tuple[float, float]:
    """The replayed queue's steady-state mean (ms) at ``rate``, and its batch-means standard
    error: ``STEADY_ARRIVALS`` Poisson arrivals (~0.6 s), the first ``WARMUP`` left out."""
    sent = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, STEADY_ARRIVALS))
    lat = replayed_ms(queue, sent)[int(WARMUP * STEADY_ARRIVALS):]
    return float(lat.mean()), batch_means_se(lat)


def run_point(client, model, inputs, rate: float, seconds: float, warm_s: float, seed: int,
              queue: tuple[list[float], float] | None = None) -> dict:
    """One continuous run of Poisson arrivals at ``rate`` for ``seconds``: the latencies of
    the requests sent after its first ``warm_s`` (at least its first ``WARMUP`` share: the
    queue fills from empty), the requests sent and lost, and the time it took. With
    ``queue`` (``queue_of``), also each kept request's latency less its replay through
    that queue (``diff``: every request sent is replayed, answered or not)."""
    t = time.monotonic()
    records, s = run_load(client, model, inputs, rate, seconds, 100_000, seed=seed)
    t0 = records[0].sent if records else 0.0
    skip = max(int(WARMUP * len(records)), sum(1 for r in records if r.sent - t0 < warm_s))
    keep = [k for k in range(skip, len(records)) if records[k].latency_ms is not None and not records[k].error_code]
    part = {"kept": [records[k].latency_ms for k in keep], "sent": len(records), "lost": s["lost"],
            "kept_s": max(0.0, seconds - warm_s), "took_s": time.monotonic() - t}
    if queue is not None and records:
        replay = replayed_ms(queue, [r.sent for r in records])
        part["diff"] = [records[k].latency_ms - replay[k] for k in keep]
    return part


def merge(parts: list[dict], steady_ms: tuple[float, float] | None = None) -> dict:
    """A point from its runs. Without ``steady_ms``: the mean and batch-means standard error
    of every kept latency. With it (``steady``: the replayed queue's steady-state mean and
    its standard error), the control-variate estimate (the module's docstring): that mean
    plus the mean of measured minus replayed, its standard error the two's combined; the
    plain mean beside it (``plain_mean_ms``, ``plain_se_ms``)."""
    kept = [ms for part in parts for ms in part["kept"]]
    plain = float(np.mean(kept)) if kept else float("nan")
    plain_se = batch_means_se(kept)
    mean, se = plain, plain_se
    if steady_ms is not None and all("diff" in part for part in parts):
        diff = [ms for part in parts for ms in part["diff"]]
        mean = steady_ms[0] + float(np.mean(diff)) if diff else float("nan")
        se = math.hypot(batch_means_se(diff), steady_ms[1])
    return {"mean_ms": mean, "se_ms": se, "plain_mean_ms": plain, "plain_se_ms": plain_se,
            "n": sum(part["sent"] for part in parts), "kept": len(kept),
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
        # a point just short of it needs a fraction of a second: a run of MIN_RUN_S then
        give = min(max(need[k], MIN_RUN_S) if need[k] > 0 else 0.0, max(0.0, max_s - points[k]["took_s"]), budget_s)
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
    (``relaxation_s``) left out, each mean estimated against the profile's queue on the
    same arrivals (``merge``). The points and the time they took."""
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    workers = [s.config.status_endpoint for s in spec.services if s.role == "worker"]
    keys = [(config, k, load) for config in configs for k, load in enumerate(loads)]
    parts: dict = {key: [] for key in keys}
    intervals: dict = {key: [] for key in keys}
    steal: dict = {key: [] for key in keys}
    steadies = {key: steady(queue_of(p, key[0]), key[2] * p.capacity(key[0]), seed=key[1]) for key in keys}

    def measure(key, seconds: float) -> None:
        config, k, load = key
        rate = load * p.capacity(config)
        warm = min(WARM_RELAX * relaxation_s(p, config, rate), 0.5 * seconds)
        seed = 100 + k + 1000 * len(parts[key])  # each run of a point its own arrivals

        def one_run():
            before = service_counters(workers)
            part = run_point(client, model, inputs, rate, seconds, warm, seed, queue=queue_of(p, config))
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
        figures = [merge(parts[key], steadies[key]) for key in keys]
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
        m = merge(parts[key], steadies[key])
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
                       "plain_mean_ms": round(m["plain_mean_ms"], 3),
                       "plain_se_ms": round(m["plain_se_ms"], 3) if math.isfinite(m["plain_se_ms"]) else None,
                       "steady_ms": round(steadies[key][0], 3),
                       "inrun_predicted_ms": None if inrun is None else round(inrun, 3),
                       "inrun_error": None if inrun is None else round(abs(inrun - measured) / measured, 4),
                       "lost": m["lost"], "stable_n": stable_n,
                       "stable_s": None if stable_n is None else round(stable_n / rate, 1),
                       "steal": None if stolen is None else round(stolen, 4), "takes": sum(t for _, t in steal[key])})
        log(f"   {config[0]}x{config[1]} at {load:4.0%} ({rate:6.1f}/s, {m['n']:5d} req, {m['runs']} runs, {m['took_s']:4.1f} s): "
            f"predicted {predicted:7.2f} ms, measured {measured:7.2f} +- {m['se_ms']:.2f} ms "
            f"(SE {stderr or float('inf'):.1%}{', capped' if m['capped'] else ''}; plain {m['plain_mean_ms']:.2f} "
            f"+- {m['plain_se_ms']:.2f}), error {err:6.1%} "
            f"(one path {abs(const - measured) / measured:6.1%}); in-run "
            + ("unstable" if inrun is None else f"{inrun:7.2f} ms") + f"; steal {stolen or 0:.0%}")
    return points, exhaustive_s
