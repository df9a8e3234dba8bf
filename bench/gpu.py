"""``keel bench gpu``: Keel's worker data path on a GPU, and the papers' measurements there.

Three parts, each a table in the report:

1. ``datapath``: a conv net (ResNet-18, 3x32x32) and the MLP (784-200-100-10) run through
   the worker's ``DataPath`` (pinned buffers, a CUDA stream per slot) in this process:
   throughput (queries/s) and per-batch p50/p99 against batch size and concurrency (slots
   = executor threads, each with its own stream, as a worker runs them), and the share of
   device time in host<->device copies (CUDA events). The same grid on the CPU (one torch
   thread per slot, as a worker's executors), time-bounded per cell.
2. ``serf``: SERF's profile on the GPU, from part 1 at batch 1: the per-batch service rate
   mu_i with i batches at once, and Eq. 13's predicted latency at a ladder of loads for
   each concurrency; the concurrency SERF chooses at each load (``common.queueing``).
   Offline from the profile: the live SERF configurator is ``keel experiment serf``.
3. ``parm_tail``: ParM §6 on the GPU (``bench.gpu_tail``): a live cluster, m = 4 workers of
   the conv net and k = 2 (2 parity workers) against Equal-Resources (6 workers), every
   worker placed on the GPUs present, open-loop Poisson queries, and a straggler made by
   a background GPU load (a matmul loop in its own process) on worker-0's GPU: p50, p99,
   p99.9 and reconstructions per mode.

Without a CUDA device it prints ``skipped: no CUDA device`` and writes JSON saying so;
``--device cpu`` runs parts 1 and 2 on the CPU alone (a check of the bench itself).
Timings only; tests never assert on them.

Example
-------
$ keel bench gpu --quick --json docs/results/gpu-quick.json
"""
from __future__ import annotations

import platform
import threading
import time
from typing import Any

import numpy as np

#: the printed table (keel bench)
FIGURES = ("device", "conv_best_qps", "mlp_best_qps", "conv_copy_share_b1", "serf_choice", "parm_p99_ratio")
TARGETS: dict[str, str] = {}
MODELS = {"conv": ("resnet18", [3, 32, 32]), "mlp": ("mlp", [784])}
GRID = {"quick": {"batches": (1, 16, 128), "slots": (1, 2, 4), "per_cell": 40, "cell_s": 2.0},
        "full": {"batches": (1, 8, 32, 128, 512), "slots": (1, 2, 4, 8), "per_cell": 200, "cell_s": 6.0}}


def options(parser: Any) -> None:
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default; skipped without one) or cpu: parts 1 and 2 on the CPU only")
    parser.add_argument("--no-tail", action="store_true", help="leave out part 3 (the live ParM cluster)")


def cuda_device() -> str | None:
    """The GPU's name, or None when torch sees none."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def build_model(name: str) -> tuple[Any, list[int]]:
    from keel.common.architectures import build, config_for

    arch, shape = MODELS[name]
    config = config_for(arch, [1, 28, 28] if arch == "mlp" else shape, 10)
    return build(arch, **config).eval(), shape


def measure(module: Any, device: str, shape: list[int], batch: int, slots: int, per_slot: int, cell_s: float,
            autocast: str = "") -> dict[str, Any]:
    """``slots`` threads, each running ``batch``-query batches through one ``DataPath`` on its
    own stream until ``per_slot`` batches or ``cell_s`` seconds: qps, p50/p99 of a batch, copy share."""
    import torch

    from keel.common.datapath import DataPath

    path = DataPath(torch, device, autocast)
    x = np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)
    gate = threading.Barrier(slots + 1)
    latencies: list[list[float]] = [[] for _ in range(slots)]
    failed: list[str] = []

    def slot(i: int) -> None:
        if device == "cpu":
            torch.set_num_threads(1)  # one torch thread per slot, as a worker's executors
        try:
            with torch.inference_mode():
                path.run(module, x)  # this slot's stream and buffers, cuDNN's plans: not timed
                gate.wait()
                gate.wait()  # the stats were read: go
                end = time.perf_counter() + cell_s
                while len(latencies[i]) < per_slot and time.perf_counter() < end:
                    t0 = time.perf_counter()
                    path.run(module, x)
                    latencies[i].append((time.perf_counter() - t0) * 1000.0)
        except Exception as exc:  # an out-of-memory cell is reported, not fatal
            failed.append(f"{type(exc).__name__}: {str(exc)[:120]}")
            gate.abort()

    threads = [threading.Thread(target=slot, args=(i,), daemon=True) for i in range(slots)]
    for t in threads:
        t.start()
    try:
        gate.wait()
        before = path.stats()
        start = time.perf_counter()
        gate.wait()
    except threading.BrokenBarrierError:
        start, before = time.perf_counter(), path.stats()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = path.stats()
    lat = np.array([v for slot_lat in latencies for v in slot_lat])
    copy, compute = after["copy_ms"] - before["copy_ms"], after["compute_ms"] - before["compute_ms"]
    return {"batch": batch, "slots": slots, "batches": int(lat.size), "error": failed[0] if failed else None,
            "qps": float(lat.size * batch / wall) if lat.size else None,
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            "mean_ms": float(lat.mean()) if lat.size else None,
            "copy_share": copy / (copy + compute) if copy + compute > 0 else 0.0}


def datapath(device: str, grid: dict[str, Any], log) -> dict[str, list[dict]]:
    """Part 1 on ``device``: every (model, batch, slots) cell."""
    import torch

    out = {}
    for name in MODELS:
        module, shape = build_model(name)
        module = module.to(device)
        rows = []
        for batch in grid["batches"]:
            for slots in grid["slots"]:
                row = measure(module, device, shape, batch, slots, grid["per_cell"], grid["cell_s"])
                rows.append(row)
                log(f"  {device:4s} {name:4s} batch {batch:4d} x {slots} slots: "
                    + (f"{row['qps']:9.0f} q/s  p50 {row['p50_ms']:8.3f} ms  p99 {row['p99_ms']:8.3f} ms  "
                       f"copies {row['copy_share']:.0%}" if row["qps"] else f"failed: {row['error']}"))
        out[name] = rows
        del module
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def serf(rows: list[dict], loads: int = 8) -> dict[str, Any]:
    """Part 2: SERF's profile (batch 1) and Eq. 13's choice of concurrency at a ladder of loads."""
    from keel.common.queueing import latencies

    profile = {r["slots"]: r["mean_ms"] for r in rows if r["batch"] == 1 and r["mean_ms"]}
    if not profile:
        return {"error": "no batch-1 cells measured"}
    cs = sorted(profile)
    mu = [1000.0 / profile[c] for c in cs]  # per batch, with c at once (cs are 1, 2, 4...: filled between)
    full = [mu[max(j for j, c in enumerate(cs) if c <= i)] for i in range(1, cs[-1] + 1)]
    capacity = max(c * full[c - 1] for c in cs)
    rates = [capacity * f for f in np.linspace(0.1, 0.95, loads)]
    predicted = {c: [None if np.isnan(v) else float(v * 1000.0) for v in latencies(full[:c], rates)] for c in cs}
    choice = []
    for j, rate in enumerate(rates):
        options_ = {c: predicted[c][j] for c in cs if predicted[c][j] is not None}
        best = min(options_, key=options_.get) if options_ else None
        choice.append({"rate": float(rate), "slots": best, "predicted_ms": options_.get(best) if best else None})
    return {"mu_per_s": dict(zip(map(str, cs), mu)), "capacity_per_s": float(capacity),
            "predicted_ms": {str(c): v for c, v in predicted.items()}, "choice": choice}


def _best(rows: list[dict]) -> float | None:
    qps = [r["qps"] for r in rows if r["qps"]]
    return max(qps) if qps else None


def run(args: Any = None, log=print) -> dict:
    quick = bool(getattr(args, "quick", False))
    device = getattr(args, "device", "cuda")
    grid = GRID["quick" if quick else "full"]
    report: dict[str, Any] = {"command": f"keel bench gpu{' --quick' if quick else ''}", "date": time.strftime("%Y-%m-%d"),
                              "machine": platform.platform(), "quick": quick}
    import torch

    report["torch"] = torch.__version__
    name = cuda_device() if device == "cuda" else "cpu"
    if name is None:
        log("skipped: no CUDA device (torch sees no GPU on this host); run it on a GPU host, "
            "or `keel bench gpu --device cpu` for the CPU part alone")
        return {**report, "skipped": "no CUDA device", "device": None}
    report["device"] = name
    log(f"device: {name}")
    parts = {"cuda": datapath("cuda", grid, log)} if device == "cuda" else {}
    # the CPU beside it: batches to 32 (a ResNet-18 batch of 128 takes seconds on one thread)
    parts["cpu"] = datapath("cpu", {**grid, "batches": tuple(b for b in grid["batches"] if b <= 32),
                                    "per_cell": max(3, grid["per_cell"] // 4), "cell_s": grid["cell_s"] / 2}, log)
    report["datapath"] = parts
    main = parts[device]
    report["serf"] = {m: serf(rows) for m, rows in main.items()}
    report["conv_best_qps"], report["mlp_best_qps"] = _best(main["conv"]), _best(main["mlp"])
    report["conv_copy_share_b1"] = next((r["copy_share"] for r in main["conv"] if r["batch"] == 1 and r["slots"] == 1), None)
    report["serf_choice"] = [c["slots"] for c in report["serf"]["conv"].get("choice", [])]
    if device == "cuda" and not getattr(args, "no_tail", False):
        from keel.bench.gpu_tail import parm_tail

        report["parm_tail"] = parm_tail(quick, log)
        modes = report["parm_tail"].get("modes", {})
        p99 = {m: (s.get("latency_ms") or {}).get("p99") for m, s in modes.items()}
        if p99.get("equal") and p99.get("parm"):
            report["parm_p99_ratio"] = p99["equal"] / p99["parm"]
    return report


def passed(report: dict) -> bool:
    """A skip (no CUDA device) passes: the bench did what it could; a ParM mode that lost
    queries or could not run does not."""
    tail = report.get("parm_tail", {})
    return "error" not in tail and not any(s.get("lost") or s.get("error") for s in tail.get("modes", {}).values())
