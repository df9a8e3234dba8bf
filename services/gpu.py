"""A GPU worker's device metrics: the GPU's utilisation and memory (NVML, nvidia-ml-py)
beside the worker's own, labelled with its model, version and GPU, as Triton's
``nv_gpu_*`` are. They exist only when nvidia-ml-py imports (``pip install 'keel[gpu]'``)
and the worker runs on a GPU that NVML can open; a CPU worker has none and pays nothing.

NVML sees every GPU of the host whatever ``CUDA_VISIBLE_DEVICES`` says, so the GPU is
opened by the name the placement gave it (an index or a GPU/MIG UUID: ``WorkerConfig.gpu``),
not by the worker's ``cuda:0``. A MIG device reports memory but no utilisation.

Metrics (every one also has the ``service`` label):

- ``keel_gpu_utilization_ratio{model,version,gpu}``: the share of the last sample period the GPU ran a kernel;
- ``keel_gpu_memory_used_bytes`` / ``keel_gpu_memory_total_bytes{model,version,gpu}``: the GPU's, all processes;
- ``keel_gpu_worker_memory_bytes{model,version,gpu}``: what this worker's torch holds there (its caching allocator).
"""
from __future__ import annotations

import sys
from typing import Any

from keel.common.devices import wanted_gpu

#: how often the worker samples its GPU (s)
SAMPLE_S = 1.0
LABELS = ["model", "version", "gpu"]


class GpuMetrics:
    """Samples one GPU through NVML into the worker's registry."""

    def __init__(self, metrics: Any, nvml: Any, gpu: str, model: str, version: Any):
        self.nvml, self.gpu, self.model, self.version = nvml, gpu, model, version  # version(): the one now served
        self.handle = nvml.nvmlDeviceGetHandleByIndex(int(gpu)) if gpu.isdigit() else nvml.nvmlDeviceGetHandleByUUID(gpu)
        self.util = metrics.gauge("gpu_utilization_ratio", "share of the sample period the GPU ran a kernel (NVML)", LABELS)
        self.used = metrics.gauge("gpu_memory_used_bytes", "GPU memory in use, every process (NVML)", LABELS)
        self.total = metrics.gauge("gpu_memory_total_bytes", "GPU memory in all (NVML)", LABELS)
        self.mine = metrics.gauge("gpu_worker_memory_bytes", "GPU memory this worker's torch holds", LABELS)
        self.samples = 0

    def sample(self, _now: float = 0.0) -> None:
        labels = {"model": self.model, "version": str(self.version()), "gpu": self.gpu}
        try:
            memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
            self.used.labels(**labels).set(memory.used)
            self.total.labels(**labels).set(memory.total)
            self.util.labels(**labels).set(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0)
        except Exception:  # a MIG device has no utilisation; a lost GPU must not stop the worker
            pass
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            self.mine.labels(**labels).set(torch.cuda.memory_reserved())
        self.samples += 1


def gpu_metrics(metrics: Any, cfg: Any, version: Any) -> GpuMetrics | None:
    """The GPU metrics of a worker config, or None: on the CPU, without nvidia-ml-py, or
    when NVML cannot open the GPU (no driver)."""
    gpu = wanted_gpu(cfg)
    if gpu is None:
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return GpuMetrics(metrics, pynvml, gpu, cfg.model, version)
    except Exception:  # NVMLError: no driver, no such GPU
        return None


def watch_gpu(worker: Any) -> GpuMetrics | None:
    """Sample the worker's GPU every ``SAMPLE_S`` from its loop (a timed chore)."""
    watcher = gpu_metrics(worker.metrics, worker.cfg, lambda: worker.version)
    if watcher is not None:
        watcher.sample()
        worker.every(SAMPLE_S, watcher.sample)
    return watcher
