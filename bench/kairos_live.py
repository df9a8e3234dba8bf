"""``keel experiment kairos --live``: the Kairos policy (§5.1) driving a real cluster.

The planned pool (``plan_pools(...).pick``, as in the simulation) runs as real worker
processes of the emulated ``kairos`` builtin (each sleeps its instance type's measured
service time x ``scale``; the CPU idles), behind the real frontend and dispatcher, the
dispatcher running ``policy = "kairos"`` with the model's profile: the same
``KairosPolicy`` class the simulator drives. Queries carry their batch size (the paper's
mix, ``sample_batch_sizes``) in their one feature; the model's deadline is the QoS target
x ``scale``, sent as each query's timeout (what Eq. 5 reads as QoS_i).

Allowable throughput (§4) live: Poisson arrivals (``common.loadgen.open_loop``) at a
rate, ``n`` queries a trial; a trial meets the target when at most 1% of the queries after
the first 10% (the sim leaves the same warm-up out) are over QoS x ``scale``, counting a
query answered by an error (e.g. its deadline passed in the queue) as over. Bisection
(``bench.kairos_sim.bisect_rate``) inside a bracket around the simulation's figure (0.7x
and 1.2x of it; widened once each way if the bracket does not hold), so the number of
trials is bounded. Rates are reported in the profile's time (live rate x ``scale``), to
compare with the simulation, which runs on the same queries (``same_sequence``: the same
Poisson arrivals and batch sizes). That matters: the 1% line is ~20 queries of 2000 and
the queries only the base type serves within QoS (rm2: >= ~860 items, 1.6% of the mix)
are about as many, so one draw's allowable rate differs from another's by a third (rm2,
2000 queries: 137.9 q/s on ``--sim``'s draw, ~100 on the live run's).

Differences from the simulator, by construction: a query whose deadline passes while it
waits is dropped by the dispatcher (answered with an error, counted as over QoS) where the
simulator serves it; service times carry the worker's and ZeroMQ's overhead (~1 ms, the
predictor learns it from ``Done``); and the dispatcher's matching runs on a CPU shared
with every other process here, so under load the figures are preliminary.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from keel.bench.kairos_sim import (allowable_throughput, bisect_rate, latency_table, pool_dict, sample_sizes,
                                   simulate)
from keel.common.client import Client
from keel.common.loadgen import open_loop, summarize
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import Launcher, free_port_block, wait_until
from keel.services.scheduling.kairos import KairosPolicy, feature_size

WARMUP = 0.1  # the first 10% of arrivals are left out of the 1% count, as in the simulator
TARGET = 0.01


def cluster_spec(model: str, pool: dict[str, int], qos_ms: float, scale: float, profile: str | None = None):
    """The spec of a live Kairos pool: one worker per instance, the ``kairos`` builtin."""
    m = {"builtin": "kairos", "kairos_model": model, "kairos_scale": scale, "pools": dict(pool),
         "deadline_ms": qos_ms * scale}
    if profile:
        m["kairos_profile"] = str(profile)
    return load_spec({
        "cluster": {"name": f"kairos-live-{model}", "base_port": free_port_block()},
        "frontend": {"cache_size": 0},  # equal batch sizes are equal rows: no cache hits
        "dispatcher": {"policy": "kairos"},
        "models": {model: m},
    })


def over_qos(records, qos_ms: float) -> tuple[float, np.ndarray, list[int]]:
    """Fraction of the queries after the warm-up over ``qos_ms`` (an error answer or none
    counts as over), the latencies (ms) of those answered by a prediction, and the input
    rows of those over."""
    recs = records[int(WARMUP * len(records)):]
    over, lat = [], []
    for r in recs:
        if r.received is None or r.error_code:
            over.append(r.index)
            continue
        lat.append(r.latency_ms)
        if r.latency_ms > qos_ms:
            over.append(r.index)
    return len(over) / max(1, len(recs)), np.array(lat), over


def _idle(endpoint: str, timeout_s: float = 30.0) -> bool:
    """Wait until the dispatcher holds nothing in flight (the last trial has drained)."""
    seen: list = []

    def quiet() -> bool:
        info = request_status(endpoint, 1.0)
        seen.append(info)
        return info is not None and not any(p["inflight"] for p in info.get("pools", {}).values())
    return wait_until(quiet, timeout_s)


def live_inputs(seed: int = 0, n_inputs: int = 4096) -> np.ndarray:
    """The queries' batch sizes (the paper's mix), one a row: what ``open_loop`` picks from."""
    from keel.common.kairos.profiles import sample_batch_sizes

    return sample_batch_sizes(n_inputs, np.random.default_rng(seed)).astype(np.float32).reshape(-1, 1)


def same_sequence(inputs: np.ndarray, n: int, seed: int = 0):
    """The simulator's ``sizes`` giving the batch sizes ``open_loop`` sends (its rows come
    from ``schedule``'s second generator; its arrivals are the simulator's with the same
    seed), so the simulation and the live run serve the very same queries."""
    from keel.common.loadgen import schedule

    sizes = inputs[schedule(1.0, n, seed, len(inputs))[1], 0].astype(int)
    return lambda rng, k: sizes[:k]


def live_throughput(model: str, pool: dict[str, int], qos_ms: float, sim_rps: float, scale: float = 1.0,
                    n: int = 1000, rel_tol: float = 0.03, seed: int = 0, profile: str | None = None,
                    log: Callable[[str], None] = print, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Allowable throughput of Kairos on a live ``pool`` (see the module docstring)."""
    sizes = live_inputs(seed)
    spec = cluster_spec(model, pool, qos_ms, scale, profile)
    live_qos = qos_ms * scale
    trials: list[dict] = []
    lost = 0
    run_dir = Path(run_dir or f"runs/kairos-live/{model}")  # the processes' logs
    with Launcher(run_dir) as launcher:
        t0 = time.time()
        launcher.start_spec(spec, timeout_s=120.0)
        log(f"   live cluster up: {sum(pool.values())} workers ({time.time() - t0:.1f} s)")
        endpoint = spec.service("dispatcher").config.worker_endpoint
        with Client(spec.client_endpoints, timeout_ms=5 * live_qos + 1000) as client:
            def trial(rate_profile: float) -> bool:  # a rate in the profile's time
                nonlocal lost
                rate = rate_profile / scale
                t = time.time()
                # each query's deadline is the QoS target: what Eq. 5 reads (the client's
                # default timeout would be the policy's QoS otherwise, and no pair late)
                records = open_loop(client, model, sizes, rate, n, seed=seed, timeout_ms=live_qos,
                                    duration_s=n / rate * 2 + 10, drain_s=5 * live_qos / 1000.0 + 5.0)
                s = summarize(records)
                frac, lat, over = over_qos(records, live_qos)
                lost += s["lost"]
                trials.append({"rate": rate_profile, "over_qos": frac, "lost": s["lost"], "sent": len(records),
                               "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
                               "latencies_ms": lat.round(2).tolist(),
                               "over_sizes": sorted(int(sizes[i, 0]) for i in over), "s": round(time.time() - t, 1)})
                log(f"    trial {rate_profile:7.1f} q/s: {frac * 100:5.2f}% over QoS, lost {s['lost']}, "
                    f"p99 {trials[-1]['p99_ms'] or 0:.0f} ms ({time.time() - t:.1f} s)")
                _idle(endpoint)
                return frac <= TARGET

            lo, hi = 0.7 * sim_rps, 1.2 * sim_rps
            if not trial(lo):
                lo, hi = 0.4 * sim_rps, lo
                if not trial(lo):
                    lo = 0.0
            elif trial(hi):
                lo, hi = hi, 1.6 * sim_rps
                if trial(hi):
                    lo = hi
            rate = bisect_rate(trial, lo, hi, rel_tol) if 0.0 < lo < hi else lo
        status = request_status(endpoint, 1.0) or {}
    at = [t for t in trials if t["rate"] == rate]
    return {"kairos_live_rps": rate, "sim_rps": sim_rps, "live_vs_sim": rate / sim_rps if sim_rps else None,
            "scale": scale, "n": n, "rel_tol": rel_tol, "trials": trials, "lost": lost,
            "latencies_ms_at_rate": at[-1]["latencies_ms"] if at else [], "qos_ms": qos_ms,
            "cost_per_hour": status.get("cost_per_hour"), "pools_status": status.get("pools"),
            "elapsed_s": round(time.time() - t0, 1)}


def run_live(models: list[str], quick: bool, profile_root: str | None = None,
             budget: float | None = None, scale: float = 1.0, log: Callable[[str], None] = print) -> dict:
    """Per model: the planned pool, Kairos's simulated allowable throughput on it (the
    same trial size and seed) and the live one (``plot_cdfs`` draws the latency CDFs)."""

    from keel.common.kairos.planner import plan_pools
    from keel.common.kairos.profiles import QOS_MS, Profiles

    n, rel_tol = (2000, 0.04) if quick else (3000, 0.03)
    prof = Profiles.load(profile_root)
    out: dict[str, Any] = {"mode": "live", "quick": quick, "models": {}}
    t0 = time.time()
    for model in models:
        plan = plan_pools(prof, model, budget=budget)
        pool = pool_dict(plan.types, plan.pick.counts)
        qos = QOS_MS[model]
        lat = latency_table(prof, model, plan.types)
        # the simulation on the very queries the live run sends (arrivals and sizes), and
        # on the experiment's own draw (``--sim``'s sequence) for reference
        seq = same_sequence(live_inputs(0), n, 0)
        sim = allowable_throughput(lambda: KairosPolicy(lat, feature_size), pool, qos, lat, seq,
                                   rel_tol=rel_tol, n=n, seed=0)
        own = allowable_throughput(lambda: KairosPolicy(lat, feature_size), pool, qos, lat, sample_sizes,
                                   rel_tol=rel_tol, n=n, seed=0)
        r = simulate(KairosPolicy(lat, feature_size), pool, lat, sim, seq, qos, n=n, seed=0)
        log(f"-- {model}: pool {pool} (${plan.pick.cost:.3f}/h), QoS {qos} ms x scale {scale}; simulated "
            f"kairos {sim:.1f} q/s on the live run's queries ({own:.1f} on --sim's draw)")
        m = live_throughput(model, pool, qos, sim, scale=scale, n=n, rel_tol=rel_tol, profile=profile_root, log=log)
        m.update({"pool": pool, "pool_cost": round(plan.pick.cost, 4), "sim_rps_sim_draw": own,
                  "sim_latencies_ms_at_rate": np.asarray(r.latencies_ms)[~np.isnan(r.latencies_ms)].round(2).tolist()})
        ok = m["live_vs_sim"] is not None and abs(m["live_vs_sim"] - 1.0) <= 0.10
        m["within_10pct_of_sim"] = ok
        log(f"   live {m['kairos_live_rps']:.1f} q/s vs sim {sim:.1f}: {m['live_vs_sim']:.2f}x "
            f"(target within 10%: {'met' if ok else 'MISSED'}); lost {m['lost']}; {m['elapsed_s']:.0f} s")
        out["models"][model] = m
    out["lost"] = sum(m["lost"] for m in out["models"].values())
    out["elapsed_s"] = round(time.time() - t0, 1)
    return out


def plot_cdfs(out: dict, path: Path) -> None:
    """Latency CDF per model at the live allowable rate, live (scaled back to the profile's
    time) and simulated, against the QoS line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(out["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, name in zip(axes[0], models):
        m = out["models"][name]
        for label, lat in (("live", np.asarray(m["latencies_ms_at_rate"]) / m["scale"]),
                           ("simulated", np.asarray(m["sim_latencies_ms_at_rate"]))):
            if len(lat):
                xs = np.sort(lat)
                ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label)
        ax.axvline(m["qos_ms"], color="r", ls="--", lw=1, label="QoS")
        ax.set_title(f"{name}: kairos, live {m['kairos_live_rps']:.0f} / sim {m['sim_rps']:.0f} q/s")
        ax.set_xlabel("latency (ms, profile time)")
        ax.set_ylabel("fraction of queries")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
