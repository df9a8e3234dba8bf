"""Which GPU a worker runs on, and which GPUs a host has.

A worker placed on a GPU (``WorkerConfig.gpu``: an index, or a GPU or MIG UUID, from the
spec's ``gpus``, ``common.spec.gpus``) runs with ``CUDA_VISIBLE_DEVICES`` set to it, so the
program sees that one GPU as ``cuda:0``: supervisord's program and the systemd unit's
environment file set it (``program_env``), and the worker sets it again itself before
CUDA starts (``see_only``), for launchers that pass no environment (tests, the chaos
harness). ``keel up`` checks before it starts anything that every GPU the spec's workers
ask for is on the host (``present_gpus``, ``missing``).

Example
-------
>>> program_env({"device": "cuda", "gpu": "1"})
{'CUDA_VISIBLE_DEVICES': '1'}
>>> wanted_gpu({"device": "cuda:2", "gpu": None})
'2'
>>> missing({"device": "cuda", "gpu": "3"}, ["0", "1", "GPU-aa"])
'GPU 3 but this host has 2 GPU(s): 0, 1, GPU-aa'
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

VISIBLE = "CUDA_VISIBLE_DEVICES"
# nvidia-smi -L: "GPU 0: NVIDIA H200 (UUID: GPU-...)" and, under a MIG-enabled GPU,
# "  MIG 1g.18gb     Device  0: (UUID: MIG-...)"
_SMI_GPU = re.compile(r"^GPU (\d+):.*\(UUID: (GPU-[0-9a-fA-F-]+)\)")
_SMI_MIG = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)")


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def wanted_gpu(config: Any) -> str | None:
    """The GPU a worker config (a ``WorkerConfig`` or its dict) runs on, as the host names
    it: its ``gpu``, else the index in ``device`` ("cuda" is GPU 0); None on the CPU."""
    device = _get(config, "device") or "cpu"
    if device == "cpu":
        return None
    return _get(config, "gpu") or (device.partition(":")[2] or "0")


def program_env(config: Any) -> dict[str, str]:
    """The environment a worker's program starts with beyond the supervisor's own: the GPU
    it is placed on as its only visible one."""
    gpu = _get(config, "gpu")
    return {VISIBLE: str(gpu)} if gpu else {}


def see_only(gpu: str | None) -> None:
    """Make ``gpu`` this process's only visible GPU (before CUDA starts: it reads the
    variable once). A process whose CUDA already runs keeps what it sees."""
    if not gpu or os.environ.get(VISIBLE) == gpu:
        return
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(f"CUDA already started in this process; cannot place it on GPU {gpu} now")
    os.environ[VISIBLE] = gpu


def present_gpus() -> list[str]:
    """The GPUs of this host as ``CUDA_VISIBLE_DEVICES`` can name them: each GPU's index and
    UUID, and each MIG device's UUID. Asked of NVML (nvidia-ml-py) when it imports, else
    of ``nvidia-smi -L``; [] when neither finds a GPU. torch is not imported (seconds)."""
    found = _from_nvml()
    return found if found is not None else _from_smi()


def _from_nvml() -> list[str] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVMLError_LibraryNotFound / DriverNotLoaded
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            out += [str(i), _text(pynvml.nvmlDeviceGetUUID(handle))]
            try:
                count = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
            except Exception:  # not a MIG-capable GPU
                count = 0
            for j in range(count):
                try:
                    out.append(_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j))))
                except Exception:  # no MIG device in that place
                    continue
        return out
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _from_smi() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_smi(listing)


def parse_smi(listing: str) -> list[str]:
    """The GPUs of an ``nvidia-smi -L`` listing (``present_gpus``)."""
    out = []
    for line in listing.splitlines():
        gpu, mig = _SMI_GPU.match(line), _SMI_MIG.match(line)
        if gpu:
            out += [gpu.group(1), gpu.group(2)]
        elif mig:
            out.append(mig.group(1))
    return out


def missing(config: Any, present: list[str]) -> str | None:
    """Why the GPU a worker config asks for is not among ``present`` (``present_gpus``), or
    None when it is there (or the worker runs on the CPU)."""
    gpu = wanted_gpu(config)
    if gpu is None or gpu in present:
        return None
    indices = [g for g in present if g.isdigit()]
    if not present:
        return f"GPU {gpu} but this host has no GPU (NVML and nvidia-smi find none)"
    return f"GPU {gpu} but this host has {len(indices)} GPU(s): {', '.join(present)}"
