"""Part 3 of ``keel bench gpu``: ParM's tail (§6) with its workers on the GPU.

A live cluster on this machine (``deploy.local.Launcher``): the conv net (ResNet-18,
3x32x32) served by m = 4 workers with k = 2, so 2 parity workers (``parm``), against
Equal-Resources' 6 workers (``equal``), every worker placed on the GPUs present
(``gpus = "all"``: dealt GPU by GPU). Batch size 1, cache off, the same open-loop Poisson
arrivals in both modes. The straggler: a background GPU load (a matmul loop in its own
process, ``LOAD``) on worker-0's GPU for the whole run. On a host with one GPU that load
slows every worker, not one (the report says how many GPUs there were).

The parity model is the deployed architecture with its own weights, untrained: the
latencies are ParM's, the reconstructions' accuracy is not measured here (the digits
models' is, in ``keel experiment parm-tail``).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

#: the background GPU load: square matmuls of this size, back to back, until killed
LOAD = """
import torch
x = torch.randn({n}, {n}, device="cuda")
while True:
    y = x @ x
    torch.cuda.synchronize()
"""
SHAPE = [3, 32, 32]


def _store(root: Path) -> str:
    from keel.common.architectures import build, config_for
    from keel.common.modelstore import ModelStore

    store = ModelStore(root)
    config = config_for("resnet18", SHAPE, 10)
    store.save("conv", build("resnet18", **config).eval(), arch="resnet18", arch_config=config, input_shape=SHAPE, output_size=10)
    store.save("conv-parity", build("resnet18", **config).eval(), arch="resnet18", arch_config=config, input_shape=SHAPE,
               output_size=10, parity={"k": 2, "encoder": "add", "deployed": "conv"})
    return str(store.root)


def _spec(mode: str, store: str, run_dir: Path, gpus: list[str]) -> dict:
    from keel.deploy.local import free_port_block

    model = {"store_name": "conv", "workers": 4, "k": 2, "mode": mode, "gpus": "all", "fixed_batch": 1, "max_batch": 1,
             "deadline_ms": 2000}
    if mode == "parm":
        model["parity_store_name"] = "conv-parity"
    return {"cluster": {"name": f"gpu-tail-{mode}", "store": store, "base_port": free_port_block(), "run_dir": str(run_dir)},
            "hosts": {"local": {"address": "127.0.0.1", "gpus": gpus}},
            "frontend": {"cache_size": 0}, "models": {"conv": model}}


def _one_mode(mode: str, store: str, root: Path, gpus: list[str], rate: float, count: int, seconds: float,
              load_n: int, log) -> dict[str, Any]:
    from keel.common.client import Client
    from keel.common.loadgen import open_loop, summarize
    from keel.common.spec import load_spec
    from keel.deploy.local import Launcher

    spec = load_spec(_spec(mode, store, root / mode, gpus))
    straggler = spec.role("worker")[0]
    inputs = np.random.default_rng(0).standard_normal((256, *SHAPE)).astype(np.float32)
    with Launcher(root / mode) as launcher:
        cluster = launcher.start_spec(spec, timeout_s=180.0)
        env = {"CUDA_VISIBLE_DEVICES": straggler.config.gpu or "0"}
        load = subprocess.Popen([sys.executable, "-c", LOAD.format(n=load_n)], env={**launcher.env, **env},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(2.0)  # the load is running before the first query
            with Client(cluster.client_endpoints, timeout_ms=5000) as client:
                records = open_loop(client, "conv", inputs, rate=rate, count=count, seed=1, duration_s=seconds)
        finally:
            load.kill()
            load.wait(10)
    summary = summarize(records)
    log(f"  {mode:5s}: p50 {summary['latency_ms']['p50']:.2f} ms  p99 {summary['latency_ms']['p99']:.2f} ms  "
        f"p99.9 {summary['latency_ms']['p99.9']:.2f} ms  sources {summary['sources']}  lost {summary['lost']}")
    return {**summary, "straggler": straggler.name, "straggler_gpu": straggler.config.gpu}


def parm_tail(quick: bool, log, rate: float = 300.0, load_n: int = 8192) -> dict[str, Any]:
    """Both modes back to back under the same arrivals and straggler; their summaries."""
    from keel.common.devices import present_gpus

    gpus = [g for g in present_gpus() if g.isdigit()]
    if not gpus:
        return {"error": "NVML and nvidia-smi find no GPU to place the workers on"}
    seconds = 15.0 if quick else 60.0
    count = int(rate * seconds)
    log(f"ParM tail: m=4, k=2 vs equal resources, {len(gpus)} GPU(s), {rate:g} q/s for {seconds:g} s, "
        f"a {load_n}x{load_n} matmul loop on worker-0's GPU")
    out: dict[str, Any] = {"gpus": len(gpus), "rate": rate, "seconds": seconds, "load_matmul": load_n, "modes": {}}
    with tempfile.TemporaryDirectory(prefix="keel-gpu-tail-") as tmp:
        root = Path(tmp)
        store = _store(root / "store")
        for mode in ("equal", "parm"):
            try:
                out["modes"][mode] = _one_mode(mode, store, root, gpus, rate, count, seconds, load_n, log)
            except Exception as exc:  # a mode that could not start is reported with why
                out["modes"][mode] = {"error": f"{type(exc).__name__}: {exc}"}
                log(f"  {mode}: failed: {out['modes'][mode]['error']}")
    return out
