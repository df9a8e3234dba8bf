"""``keel experiment parm-tail``: ParM §6 on this machine — tail latency under shuffles.

Setup (ParM §6.1, scaled to a 2-core machine): every worker on its own host (a network
namespace with a ``tbf``-limited link, netns mode), one host for the frontend,
dispatcher, encoder and decoder, one for the client. m = 4 workers, k = 2:

- ``equal``: 6 workers of the deployed model (Equal-Resources baseline);
- ``parm``: 4 workers + 2 parity workers, encoder, decoder.

The deployed model is the digits MLP with its k=2 addition-encoder parity model, with
its service time padded to ``SERVICE_MS`` (a model of a few ms); batch size 1; cache off.
Queries are Poisson arrivals from the digits dataset; N concurrent background shuffles
of 128-256 MB run among the worker hosts for the whole run. Both modes run back to back
under the same seed, arrivals and fault plan, so each ratio is taken in one run.

Figures: per mode p50/p99/p99.9, answered, lost, reconstructed; ``gap_ratio`` =
(p99.9 - p50 of equal) / (p99.9 - p50 of parm); ``median_ratio`` = p50 parm / p50 equal;
``online_degraded_accuracy`` = top-1 accuracy of the answers that were reconstructions,
against the digits labels.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

SERVICE_MS = 4.0
WORKER_HOSTS = [f"w{i}" for i in range(1, 7)]


def experiment(shuffles: int, quick: bool, seed: int, local: bool, store: str, rate: float = 100.0,
               link_mbit: float = 50.0) -> dict:
    duration = 35.0 if quick else 90.0
    model = {
        "store_name": "digits-mlp", "workers": 4, "k": 2, "hosts": WORKER_HOSTS[:4],
        "fixed_batch": 1, "max_batch": 1, "deadline_ms": 2000, "fixed_ms": SERVICE_MS,
    }
    equal = {"models": {"digits-mlp": {"mode": "equal", "hosts": WORKER_HOSTS}}}
    parm = {"models": {"digits-mlp": {"mode": "parm", "parity_store_name": "digits-mlp-parity-k2-add", "encoder": "add",
                                      "parity_hosts": WORKER_HOSTS[4:]}}}
    return {
        "name": f"parm_tail_s{shuffles}",
        "description": f"ParM §6.1: m=4, k=2, {shuffles} concurrent 128-256 MB shuffles among worker hosts; equal vs parm",
        "seed": seed, "netns": False if local else "auto", "link_mbit": link_mbit,
        "max_duration_s": 4 * duration + 120, "modes": ["equal", "parm"], "schedule": "back_to_back",
        "mode_overrides": {"equal": equal, "parm": parm}, "settle_s": 2.0, "start_timeout_s": 90.0,
        "cluster": {
            "cluster": {"name": f"parm-tail-s{shuffles}", "store": store},
            "hosts": {h: "127.0.0.1" for h in ["fe", *WORKER_HOSTS]},
            "frontend": {"host": "fe", "cache_size": 0, "log_requests": False},
            "dispatcher": {"host": "fe"},
            "models": {"digits-mlp": model},
        },
        "workload": {
            "model": "digits-mlp", "dataset": "digits", "rate": rate, "count": int(rate * duration),
            "duration_s": duration, "timeout_ms": 2000, "retries": 1, "drain_s": 5.0,
            "client_host": "client", "keep_outputs": True,
        },
        "faults": [{"at_s": 0.5, "kind": "shuffle", "hosts": WORKER_HOSTS, "concurrent": shuffles,
                    "size_mb": [128, 256], "duration_s": duration}] if shuffles else [],
    }


def _figures(report: dict, labels: np.ndarray) -> dict:
    from keel.chaos.workload import read_records
    from keel.common.loadgen import grade

    out: dict = {}
    for mode in report["modes_order"]:
        s = report["modes"][mode]
        lat = s["latency_ms"]
        graded = grade(read_records(Path(report["records"][mode])), labels)
        out[mode] = {
            "p50_ms": lat["p50"], "p99_ms": lat["p99"], "p999_ms": lat["p99.9"], "answered": s["answered"],
            "lost": s["lost"], "reconstructed": s["sources"].get("reconstruction", 0), "sources": s["sources"],
            "degraded_accuracy": graded["degraded_accuracy"], "accuracy": graded["accuracy"],
        }
    e, p = out["equal"], out["parm"]
    out["gap_ratio"] = (e["p999_ms"] - e["p50_ms"]) / max(1e-9, p["p999_ms"] - p["p50_ms"])
    out["median_ratio"] = p["p50_ms"] / e["p50_ms"]
    out["online_degraded_accuracy"] = p["degraded_accuracy"]
    out["invariants_ok"] = all(r["ok"] for r in report["invariants_all"])
    out["hosts_mode"] = report["hosts_mode"]
    return out


def run(args: argparse.Namespace, log=print) -> dict:
    from keel.chaos.experiment import load_experiment, run_experiment
    from keel.training.cli import ensure_default_parity
    from keel.training.datasets import load

    store = str(Path("store").absolute())
    ensure_default_parity(store, k=2, encoder="add")
    data = load("digits")
    labels = np.concatenate([data.y_train, data.y_test])
    shuffles = args.shuffles or ([4] if args.quick else [4, 2, 5])
    runs = Path(args.json).parent if args.json else Path("runs/parm-tail")  # each shuffle count's report
    out = {"quick": args.quick, "seed": args.seed, "service_ms": SERVICE_MS, "m": 4, "k": 2, "rate": args.rate,
           "link_mbit": args.link_mbit, "runs": {}}
    t0 = time.time()
    for n in shuffles:
        log(f"== {n} concurrent shuffles: equal, then parm ...")
        exp = load_experiment(experiment(n, args.quick, args.seed, args.local, store, args.rate, args.link_mbit))
        report = run_experiment(exp, runs / f"shuffles-{n}.json")
        figs = _figures(report, labels)
        figs["report"] = str(runs / f"shuffles-{n}.json")
        figs["plots"] = report["plots"]
        figs["workload"] = exp.workload
        out["runs"][str(n)] = figs
        log(f"   {'mode':6s} {'p50':>8s} {'p99':>8s} {'p99.9':>8s} {'answered':>9s} {'lost':>5s} {'rebuilt':>8s}")
        for mode in ("equal", "parm"):
            f = figs[mode]
            log(f"   {mode:6s} {f['p50_ms']:8.2f} {f['p99_ms']:8.2f} {f['p999_ms']:8.2f} {f['answered']:9d} {f['lost']:5d} {f['reconstructed']:8d}")
        acc = figs["online_degraded_accuracy"]
        log(f"   gap_ratio {figs['gap_ratio']:.2f} (target >= 3.5)   median_ratio {figs['median_ratio']:.3f} (target <= 1.05)   "
            f"online degraded accuracy {acc * 100 if acc is not None else float('nan'):.1f}%   invariants ok: {figs['invariants_ok']}")
    main = out["runs"][str(shuffles[0])]
    out.update({k: main[k] for k in ("equal", "parm", "gap_ratio", "median_ratio", "online_degraded_accuracy")})
    out["elapsed_s"] = time.time() - t0
    out["lost"] = sum(out["runs"][r][m]["lost"] for r in out["runs"] for m in ("equal", "parm"))
    return out


#: the printed table and its targets (keel experiment)
FIGURES = ("gap_ratio", "median_ratio", "online_degraded_accuracy", "lost", "elapsed_s")
TARGETS = {"gap_ratio": ">= 3.5", "median_ratio": "<= 1.05", "lost": "0"}


def options(e: argparse.ArgumentParser) -> None:
    """``keel experiment parm-tail``'s own options."""
    e.add_argument("--shuffles", type=int, nargs="+", default=None, help="concurrent shuffles to run (default: 4, and 2 and 5 unless --quick)")
    e.add_argument("--local", action="store_true", help="processes on loopback instead of network namespaces")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--rate", type=float, default=100.0, help="Poisson arrival rate, queries/s (default: %(default)s)")
    e.add_argument("--link-mbit", type=float, default=50.0, help="tbf limit of each host's link (default: %(default)s)")
