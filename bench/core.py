"""``keel bench core``: overhead, throughput and adaptive-batching figures of the request path.

Measures, through real processes on loopback (client -> frontend -> dispatcher -> worker
-> frontend -> client):

- ``noop_p50_us`` / ``noop_p99_us``: one request outstanding, no-op model;
- ``noop_throughput_rps``: the highest open-loop Poisson rate whose p99 stays <= 20 ms
  with nothing lost (no-op model, AIMD batching);
- ``batching_speedup``: that same SLO-bounded rate on a model with a fixed per-batch cost
  (the builtin ``sleep`` model: ``fixed_ms`` per batch + ``per_query_ms`` per query, like
  an accelerator), with AIMD batching divided by batch size fixed at 1;
- ``aimd_batch_size``: the batch size AIMD settled on in that run.

Per-request log lines are off during the benchmark (they go to a file otherwise).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from keel.common.client import Client
from keel.common.loadgen import open_loop, summarize
from keel.common.spec import ClusterSpec, load_spec
from keel.common.transport import request_status
from keel.deploy.local import Launcher, free_port_block

SLO_P99_MS = 20.0
SHAPE = [64]

#: the printed table and its targets (keel bench)
FIGURES = ("noop_p50_us", "noop_p99_us", "noop_throughput_rps", "batching_speedup", "aimd_batch_size")
TARGETS = {"noop_p50_us": "<= 600", "noop_throughput_rps": ">= 10000", "batching_speedup": ">= 10"}


def _cluster(launcher: Launcher, workers: int, **model) -> ClusterSpec:
    """Model "m" (a builtin, ``model`` its spec options) on ``workers`` workers, started."""
    spec = load_spec({
        "cluster": {"name": "bench-core", "base_port": free_port_block(), "run_dir": str(launcher.log_dir)},
        "frontend": {"log_requests": False, "cache_size": 0},
        "models": {"m": {"input_shape": SHAPE, "output_size": 10, "deadline_ms": 1000.0, "workers": workers, **model}},
    })
    return launcher.start_spec(spec)


def _latency(endpoint: str, n: int) -> dict:
    rng = np.random.default_rng(0)
    xs = rng.random((n, *SHAPE), dtype=np.float32)
    with Client([endpoint]) as client:
        for x in xs[:200]:  # warm-up
            client.predict("m", x)
        lat = np.array([client.predict("m", x).latency_ms for x in xs[200:]])
    return {"p50_us": float(np.percentile(lat, 50) * 1000), "p99_us": float(np.percentile(lat, 99) * 1000)}


def _max_rate(endpoint: str, start: float, step: float, limit: float, seconds: float, log) -> tuple[float, list[dict]]:
    """Highest offered rate (ramping ``x step``) whose p99 <= SLO with nothing lost.

    The ramp stops after two consecutive failing rates: on this shared VM one stall can
    put a single step over the SLO, while saturation fails every step after it."""
    xs = np.random.default_rng(1).random((4096, *SHAPE), dtype=np.float32)
    best, rows, rate, failures = 0.0, [], start, 0
    with Client([endpoint], timeout_ms=5000) as client:
        open_loop(client, "m", xs, rate=start, count=int(start * 0.5) + 1, seed=99)  # warm-up
        while rate <= limit:
            count = int(rate * seconds)
            stats = summarize(open_loop(client, "m", xs, rate=rate, count=count, seed=int(rate), duration_s=seconds * 3))
            p50, p99 = stats["latency_ms"]["p50"], stats["latency_ms"]["p99"]
            ok = stats["lost"] == 0 and (p99 if p99 is not None else 1e9) <= SLO_P99_MS and stats["sources"].get("model", 0) == count
            rows.append({"rate": rate, "p50_ms": p50, "p99_ms": p99, "lost": stats["lost"], "ok": ok})
            log(f"    offered {rate:8.0f}/s  p50 {p50 or 0:7.2f} ms  p99 {p99 or 0:7.2f} ms  "
                f"lost {stats['lost']}  {'ok' if ok else 'over SLO'}")
            failures = 0 if ok else failures + 1
            if failures >= 2:
                break
            if ok:
                best = rate
            rate *= step
    return best, rows


def run(args, log=print) -> dict:
    quick = args.quick
    t0 = time.time()
    seconds = 1.5 if quick else 4.0
    n_latency = 2000 if quick else 10000
    out: dict = {"quick": quick, "slo_p99_ms": SLO_P99_MS}
    run_dir = Path("runs/bench-core")
    with Launcher(run_dir / "noop") as launcher:
        cluster = _cluster(launcher, 2, batch_budget_ms=SLO_P99_MS, max_batch=128, builtin="noop")
        endpoint = cluster.client_endpoints[0]
        log("noop latency, one request outstanding ...")
        lat = _latency(endpoint, n_latency)
        out["noop_p50_us"], out["noop_p99_us"] = lat["p50_us"], lat["p99_us"]
        log("noop throughput (open-loop Poisson, p99 <= 20 ms) ...")
        out["noop_throughput_rps"], out["noop_ramp"] = _max_rate(endpoint, 250, 1.25, 40000, seconds, log)

    sleep = dict(builtin="sleep", fixed_ms=4.0, per_query_ms=0.02)
    out["batching_model"] = {**sleep, "workers": 1}
    with Launcher(run_dir / "batch1") as launcher:
        cluster = _cluster(launcher, 1, batch_budget_ms=SLO_P99_MS, max_batch=128, fixed_batch=1, **sleep)
        log("fixed-cost model, batch size fixed at 1 ...")
        fixed_rps, out["batch1_ramp"] = _max_rate(cluster.client_endpoints[0], 50, 1.25, 5000, seconds, log)
    with Launcher(run_dir / "aimd") as launcher:
        cluster = _cluster(launcher, 1, batch_budget_ms=SLO_P99_MS / 2, max_batch=256, **sleep)
        log("fixed-cost model, AIMD batching ...")
        aimd_rps, out["aimd_ramp"] = _max_rate(cluster.client_endpoints[0], 1000, 1.25, 40000, seconds, log)
        info = request_status(cluster.service("dispatcher").config.worker_endpoint, 2.0) or {"workers": {}}
        sizes = [w["batch_size"] for w in info["workers"].values()]
        out["aimd_batch_size"] = int(np.median(sizes)) if sizes else None
    out["batch1_throughput_rps"], out["aimd_throughput_rps"] = fixed_rps, aimd_rps
    out["batching_speedup"] = aimd_rps / fixed_rps if fixed_rps else None
    out["elapsed_s"] = time.time() - t0
    return out

