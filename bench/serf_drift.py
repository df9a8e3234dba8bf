"""``keel experiment serf-drift --json PATH [--model M] [--windows N] [--pause S]``: how
steady a model's service time is on this machine, and what that alone does to SERF's
predictions.

Two measurements, ``windows`` times each, ``pause`` seconds apart, nothing else Keel's:

1. Outside Keel: the model's forward on one input, one torch thread, 30 times back to back
   (after a warm-up), in this process: the machine's own steadiness, no path, no queue.
2. Through Keel: SERF's profile (``services.serf.profiler``) of the model, again and again
   on one cluster (one frontend, dispatcher and worker on the two cores).

Then the swing: for each pair of consecutive profiles (a, b) and each configuration, Eq. 13
(+ path) at 55% and 85% of a's capacity by a, and by b; |b - a| / a is how far the same
prediction moves when only the minute of profiling changes (b unstable at that rate counts
as a swing of 100%). A prediction cannot be trusted to closer than that, however good the
queueing model. The hypervisor's steal is recorded per window (``common.steal``).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from keel.common.loadgen import figures_table
from keel.common.steal import StealMeter

LOADS = (0.55, 0.85)


def outside_keel(model: str, windows: int, pause: float, log, per_window: int = 30) -> list[dict]:
    """The forward's time (ms) per window: mean, median, and the window's steal."""
    import torch

    from keel.bench.serf_experiment import MODELS
    from keel.common.architectures import build

    m = MODELS[model]
    torch.set_num_threads(1)
    net = build(m["arch"], **m["arch_config"]).eval()
    x = torch.randn(1, *m["input_shape"])
    out = []
    with torch.inference_mode():
        for _ in range(10):
            net(x)
        for w in range(windows):
            meter, times = StealMeter(), []
            for _ in range(per_window):
                t = time.perf_counter()
                net(x)
                times.append((time.perf_counter() - t) * 1000.0)
            out.append({"t": round(time.time(), 2), "mean_ms": round(float(np.mean(times)), 3),
                        "median_ms": round(float(np.median(times)), 3), "steal": meter.fraction()})
            log(f"   outside Keel {w + 1}/{windows}: forward mean {out[-1]['mean_ms']:.2f} ms, median "
                f"{out[-1]['median_ms']:.2f} ms (steal {out[-1]['steal'] or 0:.0%})")
            if w + 1 < windows:
                time.sleep(pause)
    return out


def profiles(store: str, model: str, windows: int, pause: float, log) -> list:
    """SERF profiles of ``model`` taken ``windows`` times on one cluster."""
    from keel.bench.serf_experiment import cluster, ensure_models, inputs_for
    from keel.deploy.local import Launcher
    from keel.services.serf.profiler import profile_model

    ensure_models(store, [model])
    spec, inputs, out = cluster(store, model), inputs_for(model), []
    with Launcher(Path(f"runs/serf/drift-{model}")) as launcher:
        launcher.start_spec(spec, timeout_s=180.0)
        for w in range(windows):
            meter = StealMeter()
            p = profile_model(spec, model, 2, inputs=inputs)
            out.append((time.time(), p, meter.fraction()))
            log(f"   profile {w + 1}/{windows}: " + ", ".join(f"{i}x{t} {ms:.2f}" for (i, t), ms in sorted(p.service_ms.items()))
                + f" ms service; hand-off {', '.join(f'{h:.2f}' for h in p.handoff_ms.values())} ms; path {p.path_ms:.2f} ms "
                f"({p.profiling_s:.1f} s, steal {out[-1][2] or 0:.0%})")
            if w + 1 < windows:
                time.sleep(pause)
    return out


def swings(taken: list) -> dict[str, list[float]]:
    """Per load: |Eq. 13 by profile b - by profile a| / by a, for consecutive profiles and
    every configuration, at that fraction of a's capacity by a (1.0 where b is unstable)."""
    out: dict[str, list[float]] = {f"{load:.0%}": [] for load in LOADS}
    for (_, a, _), (_, b, _) in zip(taken, taken[1:]):
        for config in a.configurations():
            for load in LOADS:
                rate = load * a.capacity(config)
                pa, pb = a.predict_ms(config, rate), b.predict_ms(config, rate)
                out[f"{load:.0%}"].append(1.0 if pb is None else abs(pb - pa) / pa)
    return out


def spread(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    return {"min": round(float(v.min()), 3), "median": round(float(np.median(v)), 3), "max": round(float(v.max()), 3),
            "cv": round(float(v.std() / v.mean()), 4)}


def drift(model: str = "resnet18", windows: int = 8, pause: float = 15.0, store: str = "runs/serf/store",
          log=print) -> dict:
    """The model's service time window after window, outside Keel and profiled; -> the report."""
    t0, meter = time.time(), StealMeter()
    log(f"-- {model} outside Keel: {windows} windows of 30 forwards, one thread, {pause:g} s apart")
    outside = outside_keel(model, windows, pause, log)
    log(f"-- {model} profiled through Keel {windows} times, {pause:g} s apart")
    taken = profiles(store, model, windows, pause, log)
    service = {f"{i}x{t}": spread([p.service_ms[(i, t)] for _, p, _ in taken]) for i, t in taken[0][1].service_ms}
    swing = swings(taken)
    out: dict[str, Any] = {
        "model": model, "windows": windows, "pause_s": pause,
        "outside_keel": outside, "outside_keel_median_ms": spread([w["median_ms"] for w in outside]),
        "profiles": [{"t": round(t, 2), "steal": s} | p.to_json() for t, p, s in taken],
        "service_ms": service,
        "handoff_ms": {str(c): spread([p.handoff_ms[c] for _, p, _ in taken]) for c in taken[0][1].handoff_ms},
        "path_ms": spread([p.path_ms for _, p, _ in taken]),
        "swing": {load: {"mean": round(float(np.mean(v)), 4), "max": round(float(np.max(v)), 4)} for load, v in swing.items()},
        "steal": meter.fraction(), "steal_max_window": max([w["steal"] or 0.0 for w in outside] + [s or 0.0 for _, _, s in taken]),
        "elapsed_s": round(time.time() - t0, 1),
    }
    rows = {"forward outside Keel (median of 30)": out["outside_keel_median_ms"]} | {
        f"profiled service {k}": v for k, v in service.items()} | {
        f"profiled hand-off, {c} slot(s)": v for c, v in out["handoff_ms"].items()} | {"profiled path": out["path_ms"]}
    width = max(map(len, rows)) + 2
    log(f"{'ms, over ' + str(windows) + ' windows':<{width}}{'min':>8}{'median':>8}{'max':>8}{'CV':>8}")
    for name, s in rows.items():
        log(f"{name:<{width}}{s['min']:>8.2f}{s['median']:>8.2f}{s['max']:>8.2f}{s['cv']:>8.1%}")
    for line in figures_table({f"swing_{k}_{m}": v[m] for k, v in out["swing"].items() for m in ("mean", "max")},
                              [f"swing_{k}_{m}" for k in out["swing"] for m in ("mean", "max")]):
        log(line)
    log(f"(Eq. 13 at 55% / 85% of capacity, one profile against the next: the prediction's move when only the "
        f"minute of profiling changes; steal {out['steal'] or 0:.0%} over the run, {out['steal_max_window']:.0%} at most "
        f"in a window; {out['elapsed_s']} s)")
    return out


def plot(out: dict, path: Path) -> None:
    """Service times per window: the forward outside Keel and each profiled tuple."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(range(1, len(out["outside_keel"]) + 1), [w["median_ms"] for w in out["outside_keel"]], "k-o",
            label="forward outside Keel, 1 thread (median)")
    for key in out["service_ms"]:
        ax.plot(range(1, len(out["profiles"]) + 1), [p["service_ms"][key] for p in out["profiles"]], "-o",
                label=f"profiled {key}")
    ax.set(title=f"{out['model']}: service time from one window to the next ({out['pause_s']:g} s apart)",
           xlabel="window", ylabel="ms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: the printed table (keel experiment); the swings are logged as they come
FIGURES = ("steal", "steal_max_window", "elapsed_s")


def run(args: argparse.Namespace, log=print) -> dict:
    return drift(args.model, args.windows, args.pause, log=log)


def passed(report: dict) -> bool:
    return True  # a measurement of the machine: no verdict


def options(e: argparse.ArgumentParser) -> None:
    """``keel experiment serf-drift``'s own options."""
    e.add_argument("--model", default="resnet18", choices=["resnet18", "widemlp"])
    e.add_argument("--windows", type=int, default=8, help="measurements of each kind (default 8)")
    e.add_argument("--pause", type=float, default=15.0, help="seconds between them (default 15)")
