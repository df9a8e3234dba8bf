"""A GPU worker's device metrics, with NVML stood in for (nvidia-ml-py and a GPU are not
needed): the GPU's utilisation and memory under the model, version and GPU labels, opened
by the GPU's host name (index or UUID); none on the CPU or without nvidia-ml-py."""
from __future__ import annotations

import sys
import types

from keel.common.config import WorkerConfig
from keel.common.metrics import Metrics
from keel.services.gpu import gpu_metrics


def fake_nvml(opened: list) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: opened.append(("index", i)) or f"h{i}"
    nvml.nvmlDeviceGetHandleByUUID = lambda u: opened.append(("uuid", u)) or f"h-{u}"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 << 30, total=80 << 30, free=77 << 30)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=42, memory=10)
    return nvml


def value(metrics: Metrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, {"service": "w", **labels})


def test_a_gpu_workers_metrics_carry_model_version_and_gpu(monkeypatch):
    opened = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(opened))
    metrics, version = Metrics("w"), ["3"]
    watcher = gpu_metrics(metrics, WorkerConfig(model="resnet", device="cuda", gpu="1"), lambda: version[0])
    watcher.sample()
    labels = {"model": "resnet", "version": "3", "gpu": "1"}
    assert opened == [("index", 1)]
    assert value(metrics, "keel_gpu_utilization_ratio", **labels) == 0.42
    assert value(metrics, "keel_gpu_memory_used_bytes", **labels) == 3 << 30
    assert value(metrics, "keel_gpu_memory_total_bytes", **labels) == 80 << 30
    version[0] = "4"  # a rollout: the next sample is labelled with the version served
    watcher.sample()
    assert value(metrics, "keel_gpu_utilization_ratio", **{**labels, "version": "4"}) == 0.42


def test_a_mig_device_is_opened_by_its_uuid(monkeypatch):
    opened = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(opened))
    gpu_metrics(Metrics("w"), WorkerConfig(device="cuda", gpu="MIG-abc"), lambda: "1")
    assert opened == [("uuid", "MIG-abc")]


def test_no_gpu_metrics_on_the_cpu_or_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([]))
    assert gpu_metrics(Metrics("w"), WorkerConfig(device="cpu"), lambda: "1") is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu_metrics(Metrics("w"), WorkerConfig(device="cuda"), lambda: "1") is None
