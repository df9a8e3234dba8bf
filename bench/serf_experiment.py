"""``keel experiment serf --json PATH [--quick]``: SERF on live Keel clusters.

Models: ``host-small`` and ``host-large``, the emulated 8-core SERF host
(``common.serf_host``: a request's time follows SERF Fig. 3's speed-up by threads and Fig.
6's interference by requests at once, served by sleeping), a small model that does not
interfere and a large one that does: where SERF's choice matters. With ``--models``, as
before, Keel's own 2-core models: ``sleep`` (holds each request 20 ms, CPU idle),
``resnet18`` (3x32x32) and ``widemlp`` (8 x 4096^2 float32 layers, 512 MB); their service
times drift 7-17% from one quarter-minute to the next on this machine
(``keel experiment serf-drift``).

Per model, on a cluster of one frontend, one dispatcher and one worker (``max_batch`` 1:
SERF does not batch), every part through the real path:

1. Profile (§IV-B, ``services.serf.profiler``): the (i, t) with i x t <= cores (20 on 8
   cores, 12-18 of them measured, the smooth stretches of the curves interpolated); the
   mu table and the profiling time; the reference table's build time.
2. Predicted (Eq. 13 + the profiled path) against measured mean latency at the client,
   Poisson arrivals, for each candidate configuration (on 8 cores: the table's best at some
   load, and the extremes 1x8 and 8x1; on 2 cores all three) at loads that are fractions of
   its own capacity (``bench.serf_points``). Each point's mean is estimated against the
   profile's own queue replayed on the same arrivals (a control variate: the arrivals'
   bursts, most of a loaded queue's noise, are the replay's too), and each point runs
   until that mean's standard error (batch means: a queue's latencies are correlated) is at most ``POINT_SE`` of the
   mean, its warm-up left out; the full run spends the model's time for points where the
   standard errors need it, ``--quick`` takes one 2 s run. Each point reports that standard
   error beside its prediction error (``stderr``; ``max_point_stderr`` over the run).
   Beside it, Eq. 13 fed the service times the worker measured during that very point
   (``inrun``).
3. Best pick: every candidate at common loads (20%, 50%, 80% of the largest capacity);
   where the measured best two differ by > 5%, is Eq. 13's pick the measured best?
4. Step load (``bench.serf_step``): low, high, low, high, the rates and phase lengths
   designed from the profile (the bound its replay predicts, ``step_bound``, and Eq. 13's
   steady-state one, ``eq13_bound``), on each candidate fixed (``--quick``: the
   configurations the design names), then the adaptive configurator on the same arrivals;
   the oracle bound (each phase's best fixed).

The exhaustive alternative's cost: ``exhaustive_s`` is what step 2 took (every candidate
at every load); ``exhaustive_stable_s`` projects, from each point's measured standard
error, the requests for it to be ``STABLE_SE`` of the mean over its rate (SERF §V-D's
"T"), for every configuration of the table at every load (the candidates' mean per point
times the number of points).

Measured on a 2-core machine shared with other work (the load average and the
hypervisor's steal are recorded): the emulated host sleeps, so its service time does not
move with that load, but Keel's own path (client, frontend, dispatcher, worker) does.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from keel.bench.serf_points import (PILOT_S, POINT_BUDGET_S, WARM_RELAX, merge, predicted_vs_measured, queue_of,
                                    relaxation_s, run_point, steady)
from keel.bench.serf_accuracy import within
from keel.bench.serf_design import LOW_FACTORS, QUICK_LOW_FACTORS
from keel.bench.serf_step import step_load
from keel.common.client import Client
from keel.common.loadgen import figures_table
from keel.common.spec import load_spec
from keel.common.steal import StealMeter, least_starved
from keel.deploy.local import Launcher, free_port_block
from keel.services.serf import profile as serf_profile
from keel.services.serf.profiler import profile_model, set_configuration

#: this machine's cores, given to a real model's worker
CORES = 2
#: the full run's loads: a point at 75-85% load needs minutes to reach 1% (its queue's slow
#: swings), 60% about a minute on the slowest configuration
LOADS = (0.15, 0.30, 0.45, 0.60)
#: --quick: three of them, one 2 s run a point (a point at 75% load read 26-35% under Eq. 13
#: in 2 s from an empty queue)
QUICK_LOADS = (0.15, 0.45, 0.60)
MODELS = {
    "host-small": {"builtin": "serf_host", "serf_host": "small", "input_shape": [64]},
    "host-large": {"builtin": "serf_host", "serf_host": "large", "input_shape": [64]},
    "sleep": {"builtin": "sleep", "fixed_ms": 20.0, "input_shape": [64]},
    "resnet18": {"arch": "resnet18", "arch_config": {"in_channels": 3, "n_classes": 10}, "input_shape": [3, 32, 32]},
    "widemlp": {"arch": "widemlp", "arch_config": {"in_features": 3072, "n_classes": 10}, "input_shape": [3072]},
}
EMULATED = ["host-small", "host-large"]
TARGETS = {"mean_error": "<= 0.03", "p90_error": "<= 0.08", "max_error": "<= 0.12", "max_point_stderr": "<= 0.01",
           "best_pick_rate": ">= 0.95", "profiling_s": "<= 5", "exhaustive_over_profiling": ">= 1000",
           "exhaustive_stable_over_profiling": ">= 1000 (projected, not run)", "adaptive_over_best_fixed": "<= 1.05 per phase",
           "adaptive_over_best_single_fixed": "<= 0.85", "oracle_over_best_single_fixed": "<= 0.80",
           "step_bound": "<= 0.80 (the step's aim, replayed)", "eq13_bound": "(Eq. 13's steady state, same step)",
           "switch_s": "<= 2", "table_ms": "< 10", "error_over_drift": "<= 1.5 (real models)"}


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


def cores_of(model: str) -> int:
    """The cores a model's worker is given: the emulated host's 8, or this machine's 2."""
    return 8 if MODELS[model].get("builtin") == "serf_host" else CORES


def cluster(store: str, model: str, serf: str | None = None):
    dispatcher: dict[str, Any] = {"heartbeat_interval_s": 0.25}
    if serf:
        dispatcher.update(serf={model: serf}, serf_hold_s=1.0, serf_hysteresis=0.05)
    return load_spec({
        "cluster": {"name": f"serf-{model}", "base_port": free_port_block(), "store": store,
                    "run_dir": f"runs/serf/{model}"},
        "frontend": {"cache_size": 0},
        "dispatcher": dispatcher,
        "worker": {"torch_threads": cores_of(model)},
        "models": {model: _model_table(model)},
    })


def _model_table(model: str) -> dict:
    m = MODELS[model]
    common = {"input_shape": m["input_shape"], "output_size": 10, "max_batch": 1, "deadline_ms": 60_000.0}
    if m.get("builtin") == "serf_host":
        return {"builtin": "serf_host", "serf_host": m["serf_host"], **common}
    if "builtin" in m:
        return {"builtin": m["builtin"], "fixed_ms": m["fixed_ms"], **common}
    return {"store_name": model, "max_batch": 1, "deadline_ms": 60_000.0}


def inputs_for(model: str) -> np.ndarray:
    return np.random.default_rng(14).standard_normal((32, *MODELS[model]["input_shape"])).astype(np.float32)


def candidates(p) -> list[tuple[int, int]]:
    """The configurations measured: all of them on 2 cores; on more, the reference table's
    best at some load (0-95% of the largest capacity) and the extremes (1 x cores, cores x 1)."""
    configs = p.configurations()
    if len(configs) <= 4:
        return configs
    top = max(p.capacity(c) for c in configs)
    picks = {row["best"] for row in p.table([top * f / 40 for f in range(1, 39)]) if row["best"]}
    return sorted(picks | {(1, p.cores), (p.cores, 1)})


def best_pick(client, dispatcher, model, p, configs, inputs, run_s, log) -> list[dict]:
    """Every candidate at 20, 50 and 80% of the largest capacity, one run of ``run_s`` each: a
    ranking, not a prediction to judge within 3%. A load counts (``counts``) where the
    measured top two differ by more than 5% and by more than ``WITHIN_SE`` standard errors
    of their difference (each mean's by batch means): near a configuration's capacity a
    run's mean moves by tens of percent from run to run (4x2 at 151/s, 20 s runs:
    45.6-52.5 ms, each +-5.5 ms), and a gap that its own measurement cannot tell from
    noise says nothing of the pick."""
    top = max(p.capacity(c) for c in p.configurations())
    rows = []
    for k, frac in enumerate((0.2, 0.5, 0.8)):
        rate = frac * top
        measured, se, predicted = {}, {}, {}
        for config in configs:
            pred = p.predict_ms(config, rate)
            if pred is None or rate > 0.95 * p.capacity(config):
                continue  # unstable by its profile: a queue that grows for ever is not a candidate
            set_configuration(dispatcher, model, *config)
            warm = min(WARM_RELAX * relaxation_s(p, config, rate), 0.5 * run_s)
            queue = queue_of(p, config)
            m = merge([least_starved(lambda: run_point(client, model, inputs, rate, run_s, warm, seed=200 + k, queue=queue),
                                     log=log, what=f"best pick {config[0]}x{config[1]} at {rate:.1f}/s")[0]],
                      steady(queue, rate, seed=k))
            name = "x".join(map(str, config))
            measured[name], se[name], predicted[name] = m["mean_ms"], m["se_ms"], pred
        ranked = sorted(measured, key=measured.get)
        pick = min(predicted, key=predicted.get) if predicted else None
        gap = (measured[ranked[1]] / measured[ranked[0]] - 1) if len(ranked) > 1 else None
        in_noise = len(ranked) > 1 and within_noise(measured[ranked[1]] - measured[ranked[0]], se[ranked[0]], se[ranked[1]])
        rows.append({"rate": round(rate, 2), "measured_ms": {k: round(v, 2) for k, v in measured.items()},
                     "se_ms": {k: round(v, 2) if math.isfinite(v) else None for k, v in se.items()},
                     "predicted_ms": {k: round(v, 2) for k, v in predicted.items()}, "pick": pick,
                     "measured_best": ranked[0] if ranked else None, "top_two_gap": None if gap is None else round(gap, 4),
                     "gap_within_noise": in_noise if len(ranked) > 1 else None,
                     "counts": gap is not None and gap > 0.05 and not in_noise,
                     "right": pick == (ranked[0] if ranked else None)})
        log(f"   {rate:6.1f}/s: measured {rows[-1]['measured_ms']} (SE {rows[-1]['se_ms']}), Eq. 13 picks {pick}, "
            f"measured best {rows[-1]['measured_best']} (top two {0 if gap is None else gap:.1%} apart"
            f"{', within their noise' if in_noise else ''})")
    return rows


def within_noise(diff_ms: float, se_a: float, se_b: float) -> bool:
    """Is a difference of two measured means (ms) noise: ``within`` its standard error (the
    two means' combined)? An unknown standard error (too few requests) is noise too."""
    if not (math.isfinite(se_a) and math.isfinite(se_b)):
        return True
    return within(diff_ms, math.hypot(se_a, se_b))


def drift_error(points: list[dict], a, b) -> float:
    """How far the machine's drift alone moves Eq. 13 at the measured points: the mean of
    |prediction by profile ``b`` - by ``a``| / by ``a`` over the points' configurations and
    rates (1.0 where ``b`` finds the point unstable): the same profile taken twice in one
    run, before and after the points were measured."""
    moves = []
    for pt in points:
        config = tuple(pt["config"])
        pa, pb = a.predict_ms(config, pt["rate"]), b.predict_ms(config, pt["rate"])
        moves.append(1.0 if pa is None or pb is None else abs(pb - pa) / pa)
    return float(np.mean(moves)) if moves else float("nan")


def run_model(store: str, model: str, quick: bool, log) -> dict:
    # each point a pilot run of ``pilot_s``, then the model's ``budget_s`` for points spent where
    # their standard errors need it (--quick: the pilot alone, 2 s)
    pilot_s, loads, pick_s, phase_s = (2.0, QUICK_LOADS, 2.0, 1.5) if quick else (PILOT_S, LOADS, 10.0, 4.0)
    cores = cores_of(model)
    launcher_dir = Path(f"runs/serf/{model}")
    inputs = inputs_for(model)
    spec = cluster(store, model)
    with Launcher(launcher_dir / "profile") as launcher:
        t = time.time()
        launcher.start_spec(spec, timeout_s=180.0)
        log(f"-- {model}: cluster up ({time.time() - t:.1f} s); profiling {cores} cores")
        dispatcher = spec.service("dispatcher").config.worker_endpoint
        version = next(s.config.version for s in spec.services if s.role == "worker")
        # SERF §V-D samples 10 requests a tuple
        p, profile_steal, profile_takes = least_starved(
            lambda: profile_model(spec, model, cores, inputs=inputs, warmup=2, samples=10, version=version, log=log),
            log=log, what="profile")
        path = serf_profile.save(p, serf_profile.where(model, p.version, store))
        configs = candidates(p)
        log(f"   profiled in {p.profiling_s:.2f} s (path {p.path_ms:.2f} ms spaced, by rate "
            f"{[(round(r), round(ms, 2)) for r, ms in serf_profile.path_bands(p.path_points)]}, hand-off {p.handoff_ms} ms, steal "
            f"{profile_steal or 0:.0%}); saved {path}; candidates {['x'.join(map(str, c)) for c in configs]}")
        from keel.services.serf.configurator import ModelPlan

        # the build's own time: the least of five (one build on a loaded machine reads what
        # the other work took from it)
        table_ms = min(ModelPlan(p).table_ms for _ in range(5))
        with Client(spec.client_endpoints, timeout_ms=60_000.0) as client:
            budget_s = 0.0 if quick else POINT_BUDGET_S * len(configs) * len(loads)
            points, exhaustive_s = predicted_vs_measured(client, spec, model, p, configs, inputs, pilot_s, budget_s, log, loads)
            picks = best_pick(client, dispatcher, model, p, configs, inputs, pick_s, log)
        drift = None
        if cores_of(model) == CORES:
            # a real model: its error is judged against how far its own profile moves in
            # the same run (the service times drift 7-17% from one quarter-minute to the next)
            again = profile_model(spec, model, cores, inputs=inputs, warmup=2, samples=10, version=version)
            drift = drift_error(points, p, again)
            log(f"   the profile again after the points: Eq. 13 moved {drift:.1%} at the points (drift)")
    step = step_load(lambda serf: cluster(store, model, serf=serf), model, p, inputs, phase_s, path, configs, log,
                     launcher_dir, again=not quick, only_designed=quick,
                     factors=QUICK_LOW_FACTORS if quick else LOW_FACTORS)
    errors = np.array([pt["error"] for pt in points])
    inrun = np.array([pt["inrun_error"] for pt in points if pt["inrun_error"] is not None])
    counted = [r for r in picks if r["counts"]]
    stable = [pt["stable_s"] for pt in points if pt["stable_s"] is not None]
    # every configuration of the table at every load, each as long as the candidates' mean point
    stable_s = float(np.mean(stable)) * len(p.configurations()) * len(loads) if stable else float("nan")
    stderrs = [pt["stderr"] for pt in points]
    return {
        "profile": p.to_json(), "profiling_s": round(p.profiling_s, 3), "candidates": ["x".join(map(str, c)) for c in configs],
        "profiling_steal": profile_steal, "profiling_takes": profile_takes, "table_ms": round(table_ms, 3),
        "points": points, "mean_error": round(float(errors.mean()), 4),
        "mean_error_const": round(float(np.mean([pt["error_const"] for pt in points])), 4),
        "within_2se": sum(pt["within_2se"] for pt in points), "within_2se_const": sum(pt["within_2se_const"] for pt in points),
        "p90_error": round(float(np.percentile(errors, 90)), 4), "max_error": round(float(errors.max()), 4),
        "max_point_stderr": None if any(s is None for s in stderrs) else round(max(stderrs), 4),
        "points_capped": sum(pt["capped"] for pt in points),
        "inrun_mean_error": round(float(inrun.mean()), 4) if len(inrun) else None,
        "inrun_p90_error": round(float(np.percentile(inrun, 90)), 4) if len(inrun) else None,
        "best_pick": picks, "best_pick_rate": round(sum(r["right"] for r in counted) / len(counted), 4) if counted else None,
        "exhaustive_s": round(exhaustive_s, 1), "exhaustive_over_profiling": round(exhaustive_s / p.profiling_s, 1),
        "exhaustive_stable_s": round(stable_s, 1), "exhaustive_stable_over_profiling": round(stable_s / p.profiling_s, 1),
        "step": step, "drift_error": None if drift is None else round(drift, 4),
        "error_over_drift": None if not drift else round(float(errors.mean()) / drift, 4),
    }


def experiment(quick: bool, store: str = "runs/serf/store", log=print, models: list[str] | None = None) -> dict:
    """Every model's points, best picks and step load; -> the report (the per-model tables logged)."""
    models = models or list(EMULATED)
    t0 = time.time()
    load_before, meter = os.getloadavg(), StealMeter()
    ensure_models(store, models)
    out: dict[str, Any] = {"quick": quick, "cores": {m: cores_of(m) for m in models}, "models": {}}
    for model in models:
        out["models"][model] = run_model(store, model, quick, log)
    # the targets are the emulated host's; a real model is judged against its own drift
    real = {name: m for name, m in out["models"].items() if out["cores"][name] == CORES}
    out["real"] = {name: {"mean_error": m["mean_error"], "drift_error": m["drift_error"],
                          "error_over_drift": m["error_over_drift"]} for name, m in real.items()} or None
    ms = [m for name, m in out["models"].items() if name not in real] or list(out["models"].values())
    errors = [pt["error"] for m in ms for pt in m["points"]]
    picks = [r for m in ms for r in m["best_pick"] if r["counts"]]
    switches = [s for m in ms for s in m["step"]["adaptive"]["switch_s"] if s is not None]
    stderrs = [m["max_point_stderr"] for m in ms]
    out.update({
        "mean_error": round(float(np.mean(errors)), 4), "p90_error": round(float(np.percentile(errors, 90)), 4),
        "max_error": round(float(np.max(errors)), 4),
        # the same with one path at every rate; the points within two of their standard errors
        "mean_error_const": round(float(np.mean([pt["error_const"] for m in ms for pt in m["points"]])), 4),
        "within_2se": sum(m["within_2se"] for m in ms), "within_2se_const": sum(m["within_2se_const"] for m in ms),
        "points": sum(len(m["points"]) for m in ms),
        "max_point_stderr": None if any(s is None for s in stderrs) else max(stderrs),
        "points_capped": sum(m["points_capped"] for m in ms),
        "best_pick_rate": round(sum(r["right"] for r in picks) / len(picks), 4) if picks else None,
        "profiling_s": max(m["profiling_s"] for m in ms),
        "exhaustive_over_profiling": min(m["exhaustive_over_profiling"] for m in ms),
        "exhaustive_stable_over_profiling": min(m["exhaustive_stable_over_profiling"] for m in ms),
        "adaptive_over_best_fixed": max(max(m["step"]["adaptive_over_best_fixed"]) for m in ms),
        "adaptive_over_best_single_fixed": max(m["step"]["adaptive_over_best_single_fixed"] for m in ms),
        "oracle_over_best_single_fixed": max(m["step"]["oracle_over_best_single_fixed"] for m in ms),
        # the bound the design replayed on each profile, when the step was chosen
        # (bench.serf_step.design), and Eq. 13's steady-state bound of the same step
        "step_bound": max(m["step"]["design"]["bound"] for m in ms),
        "eq13_bound": max(m["step"]["design"]["eq13_bound"] for m in ms),
        "switch_s": max(switches) if switches else None,
        "steps_without_switch": sum(s is None for m in ms for s in m["step"]["adaptive"]["switch_s"]),
        "table_ms": max(m["table_ms"] for m in ms),
        "per_model": {name: {k: m[k] for k in ("mean_error", "mean_error_const", "within_2se", "within_2se_const", "p90_error", "max_error", "max_point_stderr", "points_capped",
                                               "inrun_mean_error", "inrun_p90_error", "best_pick_rate", "profiling_s",
                                               "exhaustive_over_profiling", "exhaustive_stable_s",
                                               "exhaustive_stable_over_profiling", "table_ms", "drift_error",
                                               "error_over_drift")}
                      | {"adaptive_over_best_fixed": m["step"]["adaptive_over_best_fixed"],
                         "fixed_again_over_first": m["step"].get("fixed_again_over_first"),
                         "adaptive_over_best_single_fixed": m["step"]["adaptive_over_best_single_fixed"],
                         "oracle_over_best_single_fixed": m["step"]["oracle_over_best_single_fixed"],
                         "step_bound": m["step"]["design"]["bound"], "eq13_bound": m["step"]["design"]["eq13_bound"],
                         "adaptive_replayed": m["step"]["design"]["adaptive_replayed"],
                         "switch_s": m["step"]["adaptive"]["switch_s"]}
                      for name, m in out["models"].items()},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        # CPU time the hypervisor took (common.steal): over the run, and at its worst load point
        "steal": meter.fraction(), "steal_max_point": max((pt["steal"] or 0.0 for m in ms for pt in m["points"]), default=None),
        "elapsed_s": round(time.time() - t0, 1),
    })
    for name, figures in out["per_model"].items():
        log(f"-- {name}")
        for line in figures_table(figures, [k for k in FIGURES if k in figures] + [
                "fixed_again_over_first", "adaptive_replayed", "mean_error_const", "within_2se", "within_2se_const", "inrun_mean_error", "inrun_p90_error", "drift_error",
                "error_over_drift"], TARGETS):
            log(line)
    for name, figures in (out["real"] or {}).items():
        log(f"-- {name} (real, 2 cores): mean error {figures['mean_error']:.1%}, drift in the same run "
            f"{figures['drift_error']:.1%}: {figures['error_over_drift']:.2f} x the drift (target <= 1.5)")
    log(f"(load average {out['load_average']}; steal {out['steal'] or 0:.0%} over the run, "
        f"{out['steal_max_point'] or 0:.0%} at its worst load point; {out['elapsed_s']} s)")
    log("-- all emulated models" if len(ms) < len(out["models"]) else "-- all models")
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
            row[0].errorbar([pt["rate"] for pt in pts], [pt["measured_ms"] for pt in pts],
                            yerr=[2 * (pt["se_ms"] or 0.0) for pt in pts], fmt="o", color=line.get_color(),
                            capsize=3, label=f"{label} measured (+-2 SE)")
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
        for edge in np.cumsum(step["phase_s"])[:-1]:
            row[1].axvline(edge, color="grey", ls=":", lw=1)
        row[1].set(title=f"{name}: step load {step['low_rate']}/{step['high_rate']} req/s", xlabel="time (s)",
                   ylabel="latency (ms, moving mean)", yscale="log")
        row[1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: the printed table (keel experiment): every model's figures; the targets are the emulated host's
FIGURES = ("mean_error", "p90_error", "max_error", "max_point_stderr", "points_capped", "best_pick_rate", "profiling_s",
           "exhaustive_over_profiling", "exhaustive_stable_over_profiling", "adaptive_over_best_fixed",
           "adaptive_over_best_single_fixed", "oracle_over_best_single_fixed", "step_bound", "eq13_bound", "switch_s",
           "table_ms")


def run(args: argparse.Namespace, log=print) -> dict:
    return experiment(args.quick, log=log, models=args.models)


def passed(report: dict) -> bool:
    return True  # figures against targets, met or missed; nothing here is lost


def options(e: argparse.ArgumentParser) -> None:
    """``keel experiment serf``'s own options."""
    e.add_argument("--models", nargs="+", choices=list(MODELS),
                   help=f"these models (default: the emulated 8-core host's {', '.join(EMULATED)})")
