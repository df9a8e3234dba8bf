"""``keel demo``: Keel's main job on its embedded defaults.

1. Train the default model (an MLP on scikit-learn's digits) and its k=2 parity model
   into the model store if they are missing.
2. Start frontend, dispatcher, 4 workers, 2 parity workers, encoder and decoder under
   supervisord (``keel up`` of a spec written to the run folder).
3. Send a few thousand queries from the digits test split through the client library
   (open-loop Poisson arrivals); print accuracy, latency percentiles and batch sizes.
4. ParM: freeze one worker (SIGSTOP) and send more queries; its batches are rebuilt from
   the parity model; print how many were reconstructed and the degraded-mode accuracy
   measured online (reconstructions against the true labels).
5. Shut everything down.

The prediction cache is off here so that every query exercises the model path.
"""
from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import numpy as np

from keel.common.client import Client
from keel.common.loadgen import grade, open_loop, summarize
from keel.common.spec import load_spec
from keel.common.transport import request_status


DEFAULT_BASE_PORT = 7400


def base_port(preferred: int = DEFAULT_BASE_PORT, n: int = 64) -> int:
    """``preferred`` when its block of ``n`` ports is free on loopback, else a free block."""
    import socket

    from keel.deploy.local import free_port_block

    socks = []
    try:
        for port in range(preferred, preferred + n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
        return preferred
    except OSError:
        return free_port_block(n)
    finally:
        for s in socks:
            s.close()


def _spec(args: argparse.Namespace, parity_store_name: str | None) -> dict:
    model = {"store_name": "digits-mlp", "deadline_ms": 1000, "max_batch": 32, "workers": args.workers}
    if parity_store_name:
        model.update(k=2, mode="parm", parity_store_name=parity_store_name, encoder="add")
    return {
        "cluster": {"name": "demo", "store": args.store, "run_dir": args.run_dir, "base_port": base_port()},
        "frontend": {"host": "local", "cache_size": 0, "log_requests": True},
        "dispatcher": {"host": "local"},
        "models": {"digits-mlp": model},
    }


def _report(title: str, records, labels: np.ndarray, log) -> dict:
    records = [r.as_dict() for r in records]
    stats = {**summarize(records), **grade(records, labels)}
    lat = stats["latency_ms"]
    log(f"\n{title}")
    log(f"  queries {stats['sent']}, answered {stats['answered']}, lost {stats['lost']}, by source {stats['sources']}")
    if lat["p50"] is not None:
        log(f"  latency ms: p50 {lat['p50']:.2f}  p90 {lat['p90']:.2f}  p99 {lat['p99']:.2f}  p99.9 {lat['p99.9']:.2f}")
    if stats["accuracy"] is not None:
        log(f"  accuracy {stats['accuracy'] * 100:.1f}%")
    if stats["reconstructed"]:
        log(f"  reconstructed {stats['reconstructed']}; degraded-mode accuracy online {stats['degraded_accuracy'] * 100:.1f}%")
    return stats


def run(args: argparse.Namespace, log=print) -> int:
    from keel.deploy import supervisor
    from keel.training.cli import ensure_default_model, ensure_default_parity
    from keel.training.datasets import load

    import torch

    torch.set_num_threads(1)  # small models on 2 shared cores train far faster on one thread
    t0 = time.time()
    log("== model store")
    manifest = ensure_default_model(args.store)
    log(f"  digits-mlp v{manifest.version}: test accuracy {manifest.metrics.get('test_accuracy', float('nan')) * 100:.1f}%")
    parity = None
    if not args.no_parm:
        parity = ensure_default_parity(args.store, k=2, encoder="add")
        log(f"  {parity.name} v{parity.version} (ParM k=2, addition encoder)")
    data = load("digits")
    xs = data.x_test.reshape(len(data.x_test), *manifest.input_shape).astype(np.float32)
    labels = np.asarray(data.y_test)

    spec = load_spec(_spec(args, parity.name if parity else None))
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    log(f"\n== starting {len(spec.services)} services under supervisord (logs in {args.run_dir})")
    supervisor.up(spec, wait_s=180.0)  # until every worker has loaded torch and registered
    results: dict = {}
    frozen_pid = None
    try:
        with Client(spec.local_client_endpoints, timeout_ms=2000) as client:
            records = open_loop(client, "digits-mlp", xs, rate=args.rate, count=args.queries, seed=0,
                                duration_s=120, keep_outputs=True)
            results["serving"] = _report(f"== {args.queries} queries from the digits test split at {args.rate:.0f}/s",
                                         records, labels, log)
            dispatcher = next(s for s in spec.services if s.role == "dispatcher").config
            info = request_status(dispatcher.worker_endpoint, 2.0) or {"workers": {}}
            sizes = {name: w["batch_size"] for name, w in info["workers"].items() if w["role"] == "deployed"}
            log(f"  AIMD batch sizes per worker: {sizes}")
            results["batch_sizes"] = sizes
            if parity is not None:
                victim = next(s.name for s in spec.services if s.role == "worker" and s.config.role == "deployed")
                frozen_pid = supervisor.rpc(spec.run_dir).supervisor.getProcessInfo(victim)["pid"]
                os.kill(frozen_pid, signal.SIGSTOP)
                log(f"\n== ParM: {victim} (pid {frozen_pid}) frozen with SIGSTOP")
                records = open_loop(client, "digits-mlp", xs, rate=args.rate, count=max(500, args.queries // 2),
                                    seed=1, duration_s=120, keep_outputs=True)
                results["parm"] = _report("== queries while one worker is frozen", records, labels, log)
                os.kill(frozen_pid, signal.SIGCONT)
                frozen_pid = None
                fe = request_status(spec.local_client_endpoints[0], 2.0) or {}
                counts = fe.get("answered", {})
                graded = counts.get("reconstructions_graded", 0)
                if graded:
                    log(f"  frontend: {graded} reconstructions later met their real prediction; "
                        f"{counts.get('reconstructions_agree', 0)} agreed on the top class")
    finally:
        if frozen_pid is not None:
            os.kill(frozen_pid, signal.SIGCONT)
        supervisor.down(spec, out=None)
    log(f"\n== done in {time.time() - t0:.0f} s; everything stopped")
    lost = sum(r.get("lost", 0) for r in results.values() if isinstance(r, dict) and "lost" in r)
    return 1 if lost else 0
