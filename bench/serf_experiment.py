"""``keel experiment serf --json PATH [--quick]``: SERF on live Keel clusters.

Models: ``sleep`` (the builtin that holds each request 20 ms with the CPU idle: a control
whose service time does not move with the machine's load, so it checks Eq. 13 and the
path end to end), ``resnet18`` (the small ResNet-18 on 3x32x32 inputs) and, without
``--quick``, ``widemlp`` (8 x 4096^2 float32 layers, 512 MB, memory-bandwidth bound);
``common.architectures``, random weights: only their cost matters. ``--quick`` runs
fewer and shorter loads: four of the eight (10%, 30%, 55%, 85%), 25 requests or 5 s each.

Per model, on a cluster of one frontend, one dispatcher and one worker given 2 cores
(``max_batch`` 1: SERF does not batch), every part through the real path:

1. Profile (§IV-B, ``services.serf.profiler``): the mu table and the profiling time.
2. Predicted (Eq. 13 + the profiled path overhead) against measured mean latency (at
   the client, after a 10% warm-up) for each configuration at eight loads, 10%-85% of
   that configuration's capacity by its profile, Poisson arrivals. Beside it, Eq. 13 fed
   with the service times the worker measured during that very run (``inrun``): the
   queueing model's own error, apart from how far the machine's load moved the service
   times since profiling.
3. Best pick: every configuration measured at common loads (20%, 50%, 80% of the largest
   capacity); where the measured best two differ by > 5%, is Eq. 13's pick the measured
   best?
4. Step load (low, high, low, high; low 15%, high 70% of the largest capacity): each fixed
   configuration, then the adaptive configurator (a fresh dispatcher with ``serf`` set),
   on the same arrivals. Mean latency per phase and overall; the switch time is from a
   step to the dispatcher's status first showing the new configuration (polled every
   0.1 s).

The exhaustive alternative's cost is the time step 2 took (every configuration at every
load, 80 requests each: far from statistically stable, ``noise_error`` says how far);
``exhaustive_over_profiling`` is that over the profiling time. What measuring every pair
well enough to judge a 3% prediction error would take (``exhaustive_stable_s``, projected,
not run): per point, the requests for the mean's standard error to be ``STABLE_SE`` of it
(the same queue simulated: its standard error at the point's own request count, scaled as
1/sqrt(n); short runs from empty understate it at high load, so the projection is low),
over the point's arrival rate (SERF §V-D's "T", which it puts at >= 5,000 requests).

The step load's ``oracle_over_best_single_fixed`` is the bound on any configurator: each
phase served by the fixed configuration measured best in it (the fixed runs' own requests),
over the whole run, against the best single fixed configuration.

All figures are measured on a 2-core machine shared with other work (the load average
and the hypervisor's steal are recorded): they are figures under load.
"""
from __future__ import annotations

import argparse
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from keel.common.client import Client
from keel.common.loadgen import figures_table, open_loop, schedule, summarize, write_json_and_plot
from keel.common.spec import load_spec
from keel.common.steal import StealMeter, least_starved
from keel.common.transport import request_status
from keel.deploy.local import Launcher, free_port_block
from keel.services.serf import profile as serf_profile
from keel.common.queueing import latency, simulate, utilisation
from keel.services.serf.profiler import profile_model, service_between, service_counters, set_configuration

CORES = 2
#: a point measured "stable" once its mean's standard error is this fraction of it (a 95%
#: interval of +-3%: what judging a 3% prediction error needs)
STABLE_SE = 0.015
#: the share of a run's first requests left out of its mean (the queue starts empty)
WARMUP = 0.1
LOADS = (0.10, 0.20, 0.30, 0.40, 0.55, 0.65, 0.75, 0.85)
QUICK_LOADS = (0.10, 0.30, 0.55, 0.85)
MODELS = {
    "sleep": {"builtin": "sleep", "fixed_ms": 20.0, "input_shape": [64]},
    "resnet18": {"arch": "resnet18", "arch_config": {"in_channels": 3, "n_classes": 10}, "input_shape": [3, 32, 32]},
    "widemlp": {"arch": "widemlp", "arch_config": {"in_features": 3072, "n_classes": 10}, "input_shape": [3072]},
}
TARGETS = {"mean_error": "<= 0.03", "p90_error": "<= 0.08", "max_error": "<= 0.12", "best_pick_rate": "1.0",
           "profiling_s": "<= 5", "exhaustive_over_profiling": ">= 1000",
           "exhaustive_stable_over_profiling": ">= 1000 (projected, not run)", "adaptive_over_best_fixed": "<= 1.05 per phase",
           "adaptive_over_best_single_fixed": "<= 0.85",
           "oracle_over_best_single_fixed": "(the best any configurator can do)", "switch_s": "<= 2", "table_ms": "< 10"}


def ensure_models(store: str, names: list[str]) -> None:
    """The experiment's models in ``store`` (built once; weights random, ParM init)."""
    from keel.common.architectures import build
    from keel.common.modelstore import ModelStore

    mstore = ModelStore(store)
    for name in names:
        if "builtin" in MODELS[name] or mstore.has(name):
            continue
        m = MODELS[name]
        net = build(m["arch"], **m["arch_config"]).eval()
        mstore.save(name, net, arch=m["arch"], arch_config=m["arch_config"], input_shape=m["input_shape"],
                    output_size=10, dataset=None)


def cluster(store: str, model: str, serf: str | None = None):
    dispatcher: dict[str, Any] = {"heartbeat_interval_s": 0.25}
    if serf:
        dispatcher.update(serf={model: serf}, serf_hold_s=1.0, serf_hysteresis=0.05)
    return load_spec({
        "cluster": {"name": f"serf-{model}", "base_port": free_port_block(), "store": store,
                    "run_dir": f"runs/serf/{model}"},
        "frontend": {"cache_size": 0},
        "dispatcher": dispatcher,
        "worker": {"torch_threads": CORES},
        "models": {model: _model_table(model)},
    })


def _model_table(model: str) -> dict:
    m = MODELS[model]
    if "builtin" in m:
        return {"builtin": m["builtin"], "fixed_ms": m["fixed_ms"], "input_shape": m["input_shape"], "output_size": 10,
                "max_batch": 1, "deadline_ms": 60_000.0}
    return {"store_name": model, "max_batch": 1, "deadline_ms": 60_000.0}


def inputs_for(model: str) -> np.ndarray:
    return np.random.default_rng(14).standard_normal((32, *MODELS[model]["input_shape"])).astype(np.float32)


def run_load(client: Client, model: str, inputs: np.ndarray, rate: float, seconds: float, count: int, seed: int,
             offsets: np.ndarray | None = None) -> tuple[list, dict]:
    """``count`` Poisson arrivals at ``rate``, cut at ``seconds`` (or the given offsets)."""
    n = len(offsets) if offsets is not None else count
    records = open_loop(client, model, inputs, rate, n, seed=seed, duration_s=seconds if offsets is None else 1e9,
                        timeout_ms=60_000.0, drain_s=30.0, offsets=offsets)
    return records, summarize(records)


def mean_after_warmup(records) -> float:
    lat = [r.latency_ms for r in records[int(WARMUP * len(records)):] if r.latency_ms is not None and not r.error_code]
    return float(np.mean(lat)) if lat else float("nan")


def inrun_prediction(p, config, rate: float, before: dict, after: dict) -> float | None:
    """Eq. 13 (+ path) with mu_i from the service times the worker measured during the run
    (the profile's where no batch started with i running)."""
    c, t = config
    h = p.handoff_ms.get(c, 0.0)
    mu = []
    for i in range(1, c + 1):
        k, mean, _ = service_between(before, after, i)
        mu.append(1000.0 / ((mean if k >= 3 else p.service_ms[(i, t)]) + h))
    if utilisation(mu, rate) >= 1:
        return None
    return latency(mu, rate) * 1000.0 - h + p.path_ms


def sampling_noise(p, config, rate: float, n: int, reps: int = 200) -> dict:
    """What the queue itself gives a run of ``n`` requests, by simulating the same queue
    (the profile's mu, deterministic service, Poisson arrivals, from empty, the first 10%
    dropped): the standard error (ms) of the mean of ``n`` latencies over ``reps`` runs,
    the mean |error| against Eq. 13 that alone makes (relative: the from-empty start's
    bias included), and Eq. 13 against a 20,000-request simulation (Cosmetatos'
    approximation for c > 1; at 85% load that simulation's own noise is +-5%)."""
    mu = p.mu(config)
    runs = np.array([simulate(mu, rate, n=n, seed=1000 + r, warmup=WARMUP) for r in range(reps)]) * 1000.0
    long_run = simulate(mu, rate, n=20_000, seed=7) * 1000.0
    eq13 = latency(mu, rate) * 1000.0
    own = eq13 - p.handoff_ms.get(config[0], 0.0) + p.path_ms  # the predicted latency
    return {"se_ms": round(float(runs.std()), 3),
            "noise_error": round(float(np.mean(np.abs(runs - eq13)) / own), 4),
            "eq13_over_sim": round(eq13 / long_run - 1, 4)}


def stable_requests(se_ms: float, n: int, mean_ms: float) -> int:
    """Requests a run needs for its mean's standard error to be ``STABLE_SE`` of ``mean_ms``,
    from the standard error ``se_ms`` that runs of ``n`` requests give (1/sqrt(n));
    the warm-up (``WARMUP``) added; at least the warm-up and one request."""
    need = n * (se_ms / (STABLE_SE * mean_ms)) ** 2 if mean_ms > 0 else float(n)
    return max(int(math.ceil(need / (1 - WARMUP))), int(WARMUP * n) + 1)


def predicted_vs_measured(client, spec, model, p, inputs, seconds, count, log, loads) -> tuple[list[dict], float]:
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    workers = [s.config.status_endpoint for s in spec.services if s.role == "worker"]
    points, exhaustive_s = [], 0.0  # measuring every (configuration, load) once: the kept takes' time
    for config in p.configurations():
        set_configuration(dispatcher, model, *config)
        cap = p.capacity(config)
        for k, load in enumerate(loads):
            rate = load * cap
            def one_load():
                t, before = time.time(), service_counters(workers)
                records, s = run_load(client, model, inputs, rate, seconds, count, seed=100 + k)
                return before, service_counters(workers), records, s, time.time() - t

            (before, after, records, s, took), stolen, takes = least_starved(
                one_load, log=log, what=f"{config[0]}x{config[1]} at {load:.0%}")
            inrun = inrun_prediction(p, config, rate, before, after)
            exhaustive_s += took
            measured, predicted = mean_after_warmup(records), p.predict_ms(config, rate)
            err = abs(predicted - measured) / measured
            err_inrun = None if inrun is None else abs(inrun - measured) / measured
            noise = sampling_noise(p, config, rate, len(records))
            # the same queue replayed on this run's own arrival times: Eq. 13's sampling
            # noise taken out, what is left is Keel's (service times, path) and Cosmetatos'
            replay = simulate(p.mu(config), rate, arrivals=sorted(r.sent - records[0].sent for r in records)) * 1000.0 \
                - p.handoff_ms.get(config[0], 0.0) + p.path_ms if records else float("nan")
            noise["replay_ms"], noise["replay_error"] = round(replay, 3), round(abs(replay - measured) / measured, 4)
            noise["stable_n"] = stable_requests(noise["se_ms"], len(records), predicted)
            noise["stable_s"] = round(noise["stable_n"] / rate, 1)
            points.append({"config": list(config), "load": load, "rate": round(rate, 3), "n": len(records),
                           "predicted_ms": round(predicted, 3), "measured_ms": round(measured, 3),
                           "error": round(err, 4), "inrun_predicted_ms": None if inrun is None else round(inrun, 3),
                           "inrun_error": None if err_inrun is None else round(err_inrun, 4), "lost": s["lost"],
                           "steal": None if stolen is None else round(stolen, 4), "takes": takes} | noise)
            log(f"   {config[0]}x{config[1]} at {load:4.0%} ({rate:6.1f}/s, {len(records):4d} req): predicted "
                f"{predicted:7.2f} ms, measured {measured:8.2f} ms, error {err:6.1%} (sampling: SE {noise['se_ms']:.2f} ms, "
                f"{noise['noise_error']:.1%}; replayed arrivals {replay:.2f} ms, error {noise['replay_error']:.1%}); in-run service times: "
                + ("unstable" if inrun is None else f"{inrun:8.2f} ms, error {err_inrun:6.1%}") + f"; steal {stolen or 0:.0%}")
    return points, exhaustive_s


def best_pick(client, dispatcher, model, p, inputs, seconds, count, log) -> list[dict]:
    top = max(p.capacity(c) for c in p.configurations())
    rows = []
    for k, frac in enumerate((0.2, 0.5, 0.8)):
        rate = frac * top
        measured, predicted = {}, {}
        for config in p.configurations():
            pred = p.predict_ms(config, rate)
            if pred is None or rate > 0.95 * p.capacity(config):
                continue  # unstable by its profile: a queue that grows for ever is not a candidate
            set_configuration(dispatcher, model, *config)
            records = least_starved(lambda: run_load(client, model, inputs, rate, seconds, count, seed=200 + k)[0],
                                    log=log, what=f"best pick {config[0]}x{config[1]} at {rate:.1f}/s")[0]
            measured["x".join(map(str, config))], predicted["x".join(map(str, config))] = mean_after_warmup(records), pred
        ranked = sorted(measured, key=measured.get)
        pick = min(predicted, key=predicted.get) if predicted else None
        gap = (measured[ranked[1]] / measured[ranked[0]] - 1) if len(ranked) > 1 else None
        rows.append({"rate": round(rate, 2), "measured_ms": {k: round(v, 2) for k, v in measured.items()},
                     "predicted_ms": {k: round(v, 2) for k, v in predicted.items()}, "pick": pick,
                     "measured_best": ranked[0] if ranked else None, "top_two_gap": None if gap is None else round(gap, 4),
                     "counts": gap is not None and gap > 0.05, "right": pick == (ranked[0] if ranked else None)})
        log(f"   {rate:6.1f}/s: measured {rows[-1]['measured_ms']}, Eq. 13 picks {pick}, measured best "
            f"{rows[-1]['measured_best']} (top two {0 if gap is None else gap:.1%} apart)")
    return rows


def step_offsets(low: float, high: float, phase_s: float, seed: int) -> tuple[np.ndarray, list[float]]:
    parts, starts = [], []
    for i, rate in enumerate((low, high, low, high)):
        offs, _ = schedule(rate, None, seed + i, 1, duration_s=phase_s)
        parts.append(offs + i * phase_s)
        starts.append(i * phase_s)
    return np.concatenate(parts), starts


def phase_means(records, starts: list[float], phase_s: float) -> list[float]:
    t0 = records[0].sent - 0.0 if records else 0.0
    out = []
    for s in starts:
        lat = [r.latency_ms for r in records if s <= r.sent - t0 < s + phase_s and r.latency_ms is not None]
        out.append(float(np.mean(lat)) if lat else float("nan"))
    return out


class StatusPoller:
    """The dispatcher's SERF status every ``interval`` s in a thread: (t, configuration,
    arrival rate per worker it reads)."""

    def __init__(self, endpoint: str, model: str, interval: float = 0.1):
        self.endpoint, self.model, self.interval = endpoint, model, interval
        self.seen: list[tuple[float, str | None, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            info = request_status(self.endpoint, 1.0) or {}
            mine = (info.get("serf") or {}).get(self.model, {})
            self.seen.append((time.time(), mine.get("configuration"), mine.get("arrival_rate")))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5.0)


def switch_times(seen, t0: float, starts: list[float]) -> list[float | None]:
    """Per step (after the first phase): seconds from the step to the first status showing
    another configuration than the one held at the step; None when it did not change."""
    out = []
    for s in starts[1:]:
        step = t0 + s
        before = [c for t, c, _ in seen if t <= step]
        held = before[-1] if before else None
        change = next((t for t, c, _ in seen if t > step and c != held and c is not None), None)
        out.append(None if change is None or change > step + (starts[1] - starts[0]) else round(change - step, 3))
    return out


def warm(client, dispatcher, model, p, inputs) -> None:
    """The same warm-up for the fixed runs' cluster and the adaptive one: every
    configuration 1 s at 10 req/s (executors grown, each thread's torch threads set), then
    the workers' start configuration, one request with all cores."""
    for config in p.configurations():
        set_configuration(dispatcher, model, *config)
        run_load(client, model, inputs, 10.0, 1.0, 10, seed=1)
    set_configuration(dispatcher, model, 1, CORES)


def run_fixed(store, model, p, inputs, offsets, starts, phase_s, configs, log, where: Path) -> dict[str, dict]:
    """The step load on a cluster without SERF, once per fixed configuration in ``configs``."""
    fixed: dict[str, dict] = {}
    spec = cluster(store, model)
    with Launcher(where) as launcher:
        launcher.start_spec(spec, timeout_s=180.0)
        dispatcher = spec.service("dispatcher").config.worker_endpoint
        with Client(spec.client_endpoints, timeout_ms=60_000.0) as client:
            warm(client, dispatcher, model, p, inputs)
            for config in configs:
                set_configuration(dispatcher, model, *config)
                mean_rate = len(offsets) / (len(starts) * phase_s)  # the arrivals are the offsets
                # polled as the adaptive run is (ten status requests a second to the
                # dispatcher on the request path): the same observer's cost in both
                def one_run():
                    with StatusPoller(dispatcher, model):
                        return run_load(client, model, inputs, mean_rate, 0, 0, seed=301, offsets=offsets)

                name = "x".join(map(str, config))
                (records, s), stolen, takes = least_starved(one_run, log=log, what=f"fixed {name}")
                fixed[name] = {"phases_ms": phase_means(records, starts, phase_s), "mean_ms": mean_after_warmup(records),
                               "lost": s["lost"], "series": _series(records), "steal": stolen, "takes": takes}
                log(f"   fixed {name}: phases " + ", ".join(f"{v:.1f}" for v in fixed[name]["phases_ms"])
                    + f" ms; overall {fixed[name]['mean_ms']:.1f} ms")
    return fixed


def step_load(store, model, p, inputs, phase_s, profile_path, log, launcher_dir) -> dict:
    top = max(p.capacity(c) for c in p.configurations())
    low, high = 0.15 * top, 0.70 * top
    offsets, starts = step_offsets(low, high, phase_s, seed=300)
    fixed = run_fixed(store, model, p, inputs, offsets, starts, phase_s, p.configurations(), log, launcher_dir / "fixed")
    spec = cluster(store, model, serf=str(profile_path))
    with Launcher(launcher_dir / "adaptive") as launcher:
        launcher.start_spec(spec, timeout_s=180.0)
        dispatcher = spec.service("dispatcher").config.worker_endpoint
        with Client(spec.client_endpoints, timeout_ms=60_000.0) as client:
            def one_run():
                warm(client, dispatcher, model, p, inputs)
                # the warm-up ends on (1, CORES): the configurator's pick for its light load
                # (after the hold time), as each fixed run starts in its configuration
                run_load(client, model, inputs, low, 1.5, 1000, seed=2)
                with StatusPoller(dispatcher, model) as poller:
                    t0 = time.time()
                    records, s = run_load(client, model, inputs, high, 0, 0, seed=301, offsets=offsets)
                return records, s, poller, t0, request_status(dispatcher, 2.0) or {}

            (records, s, poller, t0, status), stolen, takes = least_starved(one_run, log=log, what="adaptive")
    origin = records[0].sent if records else t0
    serf_status = (status.get("serf") or {}).get(model) or {}
    adaptive = {"phases_ms": phase_means(records, starts, phase_s), "mean_ms": mean_after_warmup(records),
                "lost": s["lost"], "series": _series(records),
                "switch_s": switch_times(poller.seen, origin, starts),
                # the configurator's decisions (time from the run's first request), and what
                # the status showed every 0.1 s: configuration and the arrival rate it read
                "decisions": [{"t": round(d["wall"] - origin, 3), "from": d["from"], "to": d["to"], "rate": d["rate"]}
                              for d in serf_status.get("switch_log", [])],
                "configurations": [(round(t - origin, 2), c, r) for t, c, r in poller.seen],
                "serf_status": serf_status, "steal": stolen, "takes": takes}
    log("   adaptive: phases " + ", ".join(f"{v:.1f}" for v in adaptive["phases_ms"])
        + f" ms; overall {adaptive['mean_ms']:.1f} ms; switches after steps {adaptive['switch_s']} s; decisions "
        + ", ".join(f"{d['t']:.2f} s {d['from']}->{d['to']} at {d['rate']}/s" for d in adaptive["decisions"]))
    oracle, oracle_picks = oracle_mean(fixed, starts, phase_s)
    best_phase = [fixed[name]["phases_ms"][i] for i, name in enumerate(oracle_picks)]
    best_single = min(f["mean_ms"] for f in fixed.values())
    log(f"   oracle (each phase's best fixed: {', '.join(oracle_picks)}): {oracle:.1f} ms, "
        f"{oracle / best_single:.3f} x the best single fixed")
    # the machine moves from minute to minute (shared): the best single fixed
    # configuration once more, after the adaptive run, says how much the same
    # configuration's figures move between runs (fixed, adaptive, fixed)
    name = min(fixed, key=lambda k: fixed[k]["mean_ms"])
    again = run_fixed(store, model, p, inputs, offsets, starts, phase_s, [tuple(map(int, name.split("x")))], log,
                      launcher_dir / "fixed-again")[name]
    return {"low_rate": round(low, 2), "high_rate": round(high, 2), "phase_s": phase_s, "fixed": fixed,
            "adaptive": adaptive, "best_fixed_per_phase_ms": best_phase,
            "adaptive_over_best_fixed": [round(a / b, 4) for a, b in zip(adaptive["phases_ms"], best_phase)],
            "adaptive_over_best_single_fixed": round(adaptive["mean_ms"] / best_single, 4),
            "oracle_ms": round(oracle, 3), "oracle_picks": oracle_picks,
            "oracle_over_best_single_fixed": round(oracle / best_single, 4),
            "best_single_fixed": name, "best_single_fixed_again": again,
            "fixed_again_over_first": [round(a / b, 4) for a, b in zip(again["phases_ms"], fixed[name]["phases_ms"])]}


def oracle_mean(fixed: dict[str, dict], starts: list[float], phase_s: float) -> tuple[float, list[str]]:
    """The bound on any configurator under the step load: each phase's requests as the fixed
    configuration measured best in that phase served them (the runs share their arrivals),
    their mean after the first ``WARMUP`` (as ``mean_after_warmup``); and the configuration per phase."""
    picks, lat = [], []
    for i, s in enumerate(starts):
        name = min(fixed, key=lambda k: fixed[k]["phases_ms"][i])
        picks.append(name)
        lat += [ms for t, ms in fixed[name]["series"] if s <= t < s + phase_s]
    return (float(np.mean(lat[int(WARMUP * len(lat)):])) if lat else float("nan")), picks


def _series(records) -> list[list[float]]:
    t0 = records[0].sent if records else 0.0
    return [[round(r.sent - t0, 3), round(r.latency_ms, 2)] for r in records if r.latency_ms is not None]


def run_model(store: str, model: str, quick: bool, log) -> dict:
    # each load: ``count`` requests, cut at ``seconds`` (the lightest loads of slow models)
    seconds, count, loads = (5.0, 25, QUICK_LOADS) if quick else (15.0, 80, LOADS)
    launcher_dir = Path(f"runs/serf/{model}")
    inputs = inputs_for(model)
    spec = cluster(store, model)
    with Launcher(launcher_dir / "profile") as launcher:
        t = time.time()
        launcher.start_spec(spec, timeout_s=180.0)
        log(f"-- {model}: cluster up ({time.time() - t:.1f} s); profiling")
        dispatcher = spec.service("dispatcher").config.worker_endpoint
        version = next(s.config.version for s in spec.services if s.role == "worker")
        p, profile_steal, profile_takes = least_starved(
            lambda: profile_model(spec, model, CORES, inputs=inputs, version=version, log=log), log=log, what="profile")
        path = serf_profile.save(p, serf_profile.where(model, p.version, store))
        log(f"   profiled in {p.profiling_s:.2f} s (path {p.path_ms:.2f} ms, hand-off {p.handoff_ms} ms, steal "
            f"{profile_steal or 0:.0%}); saved {path}")
        from keel.services.serf.configurator import ModelPlan

        table_ms = ModelPlan(p).table_ms
        with Client(spec.client_endpoints, timeout_ms=60_000.0) as client:
            points, exhaustive_s = predicted_vs_measured(client, spec, model, p, inputs, seconds, count, log, loads)
            picks = best_pick(client, dispatcher, model, p, inputs, seconds, count, log)
    step = step_load(store, model, p, inputs, 2.5 if quick else 8.0, path, log, launcher_dir)
    errors = np.array([pt["error"] for pt in points])
    inrun = np.array([pt["inrun_error"] for pt in points if pt["inrun_error"] is not None])
    counted = [r for r in picks if r["counts"]]
    stable_s = sum(pt["stable_s"] for pt in points)
    return {
        "profile": p.to_json(), "profiling_s": round(p.profiling_s, 3),
        "profiling_steal": profile_steal, "profiling_takes": profile_takes, "table_ms": round(table_ms, 3),
        "points": points, "mean_error": round(float(errors.mean()), 4),
        "p90_error": round(float(np.percentile(errors, 90)), 4), "max_error": round(float(errors.max()), 4),
        "inrun_mean_error": round(float(inrun.mean()), 4) if len(inrun) else None,
        "inrun_p90_error": round(float(np.percentile(inrun, 90)), 4) if len(inrun) else None,
        "noise_mean_error": round(float(np.mean([pt["noise_error"] for pt in points])), 4),
        "replay_mean_error": round(float(np.mean([pt["replay_error"] for pt in points])), 4),
        "eq13_over_sim_max": round(float(max(abs(pt["eq13_over_sim"]) for pt in points)), 4),
        "best_pick": picks, "best_pick_rate": round(sum(r["right"] for r in counted) / len(counted), 4) if counted else None,
        "exhaustive_s": round(exhaustive_s, 1), "exhaustive_over_profiling": round(exhaustive_s / p.profiling_s, 1),
        "exhaustive_stable_s": round(stable_s, 1), "exhaustive_stable_over_profiling": round(stable_s / p.profiling_s, 1),
        "step": step,
    }


def run(json_path: str | None, quick: bool, store: str = "runs/serf/store", log=print,
        models: list[str] | None = None) -> dict:
    models = models or (["sleep", "resnet18"] if quick else list(MODELS))
    t0 = time.time()
    load_before, meter = os.getloadavg(), StealMeter()
    ensure_models(store, models)
    out: dict[str, Any] = {"quick": quick, "cores": CORES, "models": {}}
    for model in models:
        out["models"][model] = run_model(store, model, quick, log)
    ms = out["models"].values()
    errors = [pt["error"] for m in ms for pt in m["points"]]
    picks = [r for m in ms for r in m["best_pick"] if r["counts"]]
    switches = [s for m in ms for s in m["step"]["adaptive"]["switch_s"] if s is not None]
    out.update({
        "mean_error": round(float(np.mean(errors)), 4), "p90_error": round(float(np.percentile(errors, 90)), 4),
        "max_error": round(float(np.max(errors)), 4),
        "best_pick_rate": round(sum(r["right"] for r in picks) / len(picks), 4) if picks else None,
        "profiling_s": max(m["profiling_s"] for m in ms),
        "exhaustive_over_profiling": min(m["exhaustive_over_profiling"] for m in ms),
        "exhaustive_stable_over_profiling": min(m["exhaustive_stable_over_profiling"] for m in ms),
        "adaptive_over_best_fixed": max(max(m["step"]["adaptive_over_best_fixed"]) for m in ms),
        "adaptive_over_best_single_fixed": max(m["step"]["adaptive_over_best_single_fixed"] for m in ms),
        "oracle_over_best_single_fixed": max(m["step"]["oracle_over_best_single_fixed"] for m in ms),
        "switch_s": max(switches) if switches else None,
        "steps_without_switch": sum(s is None for m in ms for s in m["step"]["adaptive"]["switch_s"]),
        "table_ms": max(m["table_ms"] for m in ms),
        "per_model": {name: {k: m[k] for k in ("mean_error", "p90_error", "max_error", "inrun_mean_error", "inrun_p90_error",
                                               "noise_mean_error", "replay_mean_error", "eq13_over_sim_max", "best_pick_rate", "profiling_s", "exhaustive_over_profiling",
                                               "exhaustive_stable_s", "exhaustive_stable_over_profiling")}
                      | {"adaptive_over_best_fixed": m["step"]["adaptive_over_best_fixed"],
                         "fixed_again_over_first": m["step"]["fixed_again_over_first"],
                         "adaptive_over_best_single_fixed": m["step"]["adaptive_over_best_single_fixed"],
                         "oracle_over_best_single_fixed": m["step"]["oracle_over_best_single_fixed"],
                         "switch_s": m["step"]["adaptive"]["switch_s"]}
                      for name, m in out["models"].items()},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        # CPU time the hypervisor took (common.steal): over the run, and at its worst load point
        "steal": meter.fraction(), "steal_max_point": max((pt["steal"] or 0.0 for m in ms for pt in m["points"]), default=None),
        "elapsed_s": round(time.time() - t0, 1),
    })
    keys = ["mean_error", "p90_error", "max_error", "best_pick_rate", "profiling_s", "exhaustive_over_profiling",
            "exhaustive_stable_over_profiling", "adaptive_over_best_fixed", "adaptive_over_best_single_fixed",
            "oracle_over_best_single_fixed", "switch_s", "table_ms"]
    for name, figures in out["per_model"].items():
        log(f"-- {name}")
        for line in figures_table(figures, [k for k in keys if k in figures] + [
                "fixed_again_over_first", "inrun_mean_error", "inrun_p90_error", "noise_mean_error", "replay_mean_error", "eq13_over_sim_max"], TARGETS):
            log(line)
    log("-- all models")
    for line in figures_table(out, keys, TARGETS):
        log(line)
    log(f"(2-core machine shared with other work: load average {out['load_average']}; steal {out['steal'] or 0:.0%} over "
        f"the run, {out['steal_max_point'] or 0:.0%} at its worst load point; {out['elapsed_s']} s)")
    if json_path:
        png = write_json_and_plot(json_path, out, plot)
        log(f"wrote {json_path} and {png}")
    return out


def plot(out: dict, path: Path) -> None:
    """Left: predicted (lines) against measured (points) mean latency per configuration;
    right: the step-load run, latency over time, adaptive and each fixed configuration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(out["models"])
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4 * len(models)), squeeze=False)
    for row, name in zip(axes, models):
        m = out["models"][name]
        for config in {tuple(pt["config"]) for pt in m["points"]}:
            pts = [pt for pt in m["points"] if tuple(pt["config"]) == config]
            label = "x".join(map(str, config))
            line, = row[0].plot([pt["rate"] for pt in pts], [pt["predicted_ms"] for pt in pts], "-", label=f"{label} Eq. 13")
            row[0].plot([pt["rate"] for pt in pts], [pt["measured_ms"] for pt in pts], "o", color=line.get_color(),
                        label=f"{label} measured")
        row[0].set(title=f"{name}: predicted vs measured (mean error {m['mean_error']:.1%})",
                   xlabel="arrival rate (req/s)", ylabel="mean latency (ms)")
        row[0].legend(fontsize=7)
        step = m["step"]
        for label, run in [*step["fixed"].items(), ("adaptive", step["adaptive"])]:
            series = np.array(run["series"]) if run["series"] else np.zeros((0, 2))
            if len(series):
                k = max(1, len(series) // 80)
                smooth = np.convolve(series[:, 1], np.ones(k) / k, mode="same")
                row[1].plot(series[:, 0], smooth, lw=2 if label == "adaptive" else 1, label=label)
        for i in range(1, 4):
            row[1].axvline(i * step["phase_s"], color="grey", ls=":", lw=1)
        row[1].set(title=f"{name}: step load {step['low_rate']}/{step['high_rate']} req/s", xlabel="time (s)",
                   ylabel="latency (ms, moving mean)", yscale="log")
        row[1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd(args: argparse.Namespace) -> int:
    run(args.json, args.quick, models=args.models)
    return 0


def add_parser(which: Any) -> None:
    """Add ``serf`` to ``keel experiment``'s subparsers."""
    e = which.add_parser("serf", help="SERF: profile, predicted vs measured latency, best pick, step load")
    e.add_argument("--json", help="write the figures here (the plot beside it, .png)")
    e.add_argument("--quick", action="store_true", help="sleep and resnet18, shorter runs (under 5 minutes)")
    e.add_argument("--models", nargs="+", choices=list(MODELS), help="these models only")
    e.set_defaults(func=cmd)
