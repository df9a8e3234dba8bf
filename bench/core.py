"""``keel bench core``: overhead, throughput and adaptive-batching figures of the request path,
against its floor measured in the same run.

Measures, through real processes on loopback (client -> frontend -> dispatcher -> worker
-> frontend -> client):

- ``noop_p50_us`` / ``noop_p99_us``: one request outstanding, no-op model;
- ``noop_throughput_rps``: the highest open-loop Poisson rate whose p99 stays <= 20 ms
  with nothing lost (no-op model, AIMD batching);
- ``async_p50_us``: ``noop_p50_us`` through the asyncio client (``AsyncClient``);
- ``noop_throughput_two_frontends_rps``: ``noop_throughput_rps`` with two frontends, one
  client spreading its calls over both (the client is one process: on a machine of few
  cores it is itself a share of what is measured);
- ``floor_p50_us`` / ``floor_throughput_rps``: the same two through the bare chain of
  Keel's hops (``bench.floor``: the same processes, socket kinds and message sizes, doing
  nothing but forwarding), run beside Keel's cluster and measured in turn with it;
- ``floor_throughput_two_frontends_rps``: the floor's with two frontends (the same client
  spreading its queries over both), searched in turn with Keel's two frontends: what this
  machine lets any chain of that shape carry;
- ``batching_speedup``: the SLO-bounded rate on a model with a fixed per-batch cost (the
  builtin ``sleep`` model: ``fixed_ms`` per batch + ``per_query_ms`` per query, like an
  accelerator), with AIMD batching divided by batch size fixed at 1;
- ``aimd_batch_size``: the batch size AIMD settled on in that run.

Every figure is the median of ``REPEATS`` repetitions in the run, alternating Keel and
the floor, with its range (``FIGURE_range``) and every repetition (``FIGURE_runs``); the
three latencies (Keel's blocking and asyncio clients, the floor's) are taken in turn, 50
requests at a time (``rates.in_turn``); rates come from a bisection to within 5%
(``bench.rates``). Per-request log lines are off.

``--breakdown`` prints instead where one request's time goes, hop by hop
(``bench.breakdown``); ``--cold`` what each step of a message's handling costs warm and in
a process woken cold (``bench.cold``).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from keel.bench import rates
from keel.bench.floor import Floor, FloorClient
from keel.common.client import Client
from keel.common.transport import request_status
from keel.deploy.local import Launcher, free_port_block

SLO_P99_MS, SHAPE, REPEATS = rates.SLO_P99_MS, rates.SHAPE, rates.REPEATS

#: the printed table and its targets (keel bench)
FIGURES = ("noop_p50_us", "floor_p50_us", "noop_p50_vs_floor", "noop_p99_us", "async_p50_us", "async_p50_vs_blocking",
           "noop_throughput_rps", "floor_throughput_rps", "noop_throughput_vs_floor", "noop_throughput_two_frontends_rps",
           "floor_throughput_two_frontends_rps", "batching_speedup", "aimd_batch_size")
TARGETS = {"noop_p50_us": "<= 450", "noop_p50_vs_floor": "<= 1.5", "async_p50_vs_blocking": "<= 1.0",
           "noop_throughput_vs_floor": ">= 0.6", "noop_throughput_two_frontends_rps": ">= 15000",
           "batching_speedup": ">= 10"}


def options(parser) -> None:
    parser.add_argument("--breakdown", action="store_true",
                        help="where one request's time goes, per hop: one outstanding and at 80%% of the throughput")
    parser.add_argument("--cold", action="store_true",
                        help="what decoding, encoding and other per-message steps cost warm and in a process woken cold")
    parser.add_argument("--rate", type=float, default=None,
                        help="with --breakdown: the throughput to take 80%% of (default: searched first)")


def report_name(args) -> str:
    if getattr(args, "cold", False):
        return "core-cold"
    return "core-breakdown" if getattr(args, "breakdown", False) else "core"


def _searches(plans: dict, xs: np.ndarray, seconds: float, log) -> dict:
    """``REPEATS`` throughput searches of each client in ``plans`` (name -> (client, start,
    limit)), in turn; a client's first from ``start``, its later ones from its previous
    figure in finer steps. Name -> (spread of the figures, the probes of each search)."""
    found: dict[str, list[float]] = {name: [] for name in plans}
    probes: dict[str, list] = {name: [] for name in plans}
    for rep in range(REPEATS):
        for name, (client, start, limit) in plans.items():
            log(f"  {name} throughput, repetition {rep + 1} of {REPEATS} ...")
            begin = found[name][-1] if found[name] and found[name][-1] > 0 else start
            rate, rows = rates.max_rate(lambda r: rates.probe(client, "m", xs, r, seconds), begin, limit, log,
                                        step=1.25 if found[name] else 2.0)
            found[name].append(rate)
            probes[name].append(rows)
    return {name: (rates.spread(found[name]), probes[name]) for name in plans}


def run(args, log=print) -> dict:
    if getattr(args, "cold", False):
        from keel.bench.cold import run_cold

        return run_cold(args, log)
    if getattr(args, "breakdown", False):
        from keel.bench.breakdown import run_breakdown

        return run_breakdown(args, log)
    quick = args.quick
    t0 = time.time()
    seconds = 1.0 if quick else 3.0
    n_latency = 1200 if quick else 5000
    out: dict = {"quick": quick, "slo_p99_ms": SLO_P99_MS, "repeats": REPEATS}
    run_dir = Path("runs/bench-core")
    rng = np.random.default_rng(0)
    lat_xs = rng.random((n_latency, *SHAPE), dtype=np.float32)
    xs = np.random.default_rng(1).random((4096, *SHAPE), dtype=np.float32)
    with Launcher(run_dir / "noop") as launcher, Floor(free_port_block(8), workers=2, shape=SHAPE) as floor:
        cluster = rates.model_cluster(launcher, 2, batch_budget_ms=SLO_P99_MS, max_batch=128, builtin="noop")
        with Client([cluster.local_client_endpoints[0]], timeout_ms=5000) as keel, FloorClient(floor.client_endpoint) as bare:
            clients = {"noop": keel, "floor": bare}
            with rates.async_predicting(cluster.local_client_endpoints[0]) as async_call:
                calls = {"noop": rates.predicting(keel), "floor": rates.predicting(bare), "async": async_call}
                lat: dict[str, list[dict]] = {name: [] for name in calls}
                for rep in range(REPEATS):
                    log(f"latency one request outstanding, Keel's blocking client, the floor's and Keel's asyncio "
                        f"client in turn, repetition {rep + 1} of {REPEATS} ...")
                    for name, figures in rates.in_turn(calls, lat_xs).items():
                        lat[name].append(figures)
            for name in lat:
                rates.put(out, f"{name}_p50_us", rates.spread([r["p50_us"] for r in lat[name]]))
                rates.put(out, f"{name}_p99_us", rates.spread([r["p99_us"] for r in lat[name]]))
            log("throughput (open-loop Poisson, p99 <= 20 ms, none lost) ...")
            plans = {name: (client, 2000, 60000) for name, client in clients.items()}
            for name, (figure, probes) in _searches(plans, xs, seconds, log).items():
                rates.put(out, f"{name}_throughput_rps", figure)
                out[f"{name}_probes"] = probes
    with Launcher(run_dir / "two-frontends") as launcher, \
            Floor(free_port_block(8), workers=2, shape=SHAPE, frontends=2) as floor:
        two = rates.model_cluster(launcher, 2, frontends=2, batch_budget_ms=SLO_P99_MS, max_batch=128, builtin="noop")
        log("throughput with two frontends (one client spreading its calls over both), Keel's and the floor's ...")
        with Client(two.local_client_endpoints, timeout_ms=5000) as client, FloorClient(floor.client_endpoints) as bare:
            found = _searches({"two": (client, 2000, 60000), "floor_two": (bare, 2000, 60000)}, xs, seconds, log)
        for name, key in (("two", "noop_throughput_two_frontends_rps"), ("floor_two", "floor_throughput_two_frontends_rps")):
            rates.put(out, key, found[name][0])
            out[f"{name}_frontends_probes"] = found[name][1]
    out["noop_p50_vs_floor"] = out["noop_p50_us"] / out["floor_p50_us"]
    out["async_p50_vs_blocking"] = out["async_p50_us"] / out["noop_p50_us"]
    out["noop_throughput_vs_floor"] = (out["noop_throughput_rps"] / out["floor_throughput_rps"]
                                       if out["floor_throughput_rps"] else None)

    sleep = dict(builtin="sleep", fixed_ms=4.0, per_query_ms=0.02)
    out["batching_model"] = {**sleep, "workers": 1}
    with Launcher(run_dir / "batch1") as l1, Launcher(run_dir / "aimd") as l2:
        batch1 = rates.model_cluster(l1, 1, batch_budget_ms=SLO_P99_MS, max_batch=128, fixed_batch=1, **sleep)
        aimd = rates.model_cluster(l2, 1, batch_budget_ms=SLO_P99_MS / 2, max_batch=256, **sleep)
        log("fixed-cost model: batch size fixed at 1, and AIMD batching ...")
        with Client([batch1.local_client_endpoints[0]], timeout_ms=5000) as c1, \
                Client([aimd.local_client_endpoints[0]], timeout_ms=5000) as c2:
            found = _searches({"batch1": (c1, 50, 5000), "aimd": (c2, 1000, 60000)}, xs, seconds, log)
            one, many = found["batch1"], found["aimd"]
        info = request_status(aimd.service("dispatcher").config.worker_endpoint, 2.0) or {"workers": {}}
        sizes = [w["batch_size"] for w in info["workers"].values()]
        out["aimd_batch_size"] = int(np.median(sizes)) if sizes else None
    rates.put(out, "batch1_throughput_rps", one[0])
    rates.put(out, "aimd_throughput_rps", many[0])
    out["batch1_probes"], out["aimd_probes"] = one[1], many[1]
    speedups = [a / b for a, b in zip(many[0]["runs"], one[0]["runs"]) if b]
    if speedups:
        rates.put(out, "batching_speedup", rates.spread(speedups))
    out["elapsed_s"] = time.time() - t0
    return out
