"""GPU placement: the GPUs a host offers and how a model's workers spread over them.

Spec syntax::

    [hosts]
    gpu-a = { address = "10.0.0.2", gpus = [0, 1] }   # GPU indices, or GPU-/MIG- UUIDs
    gpu-b = { address = "10.0.0.3", gpus = ["MIG-4f1c...", "MIG-9a2e..."] }
    cpu-a = "10.0.0.4"                                # a host with no GPU for Keel

    [models.resnet]
    hosts = ["gpu-a", "gpu-b"]
    gpus = "all"        # every GPU each of its hosts lists; or a list: [0, 1]
    per_gpu = 2         # workers per GPU (default 1)

The model's GPU slots are (host, GPU) pairs, ``per_gpu`` times each, dealt GPU by GPU so
that consecutive workers land on different GPUs (and different hosts) before any GPU
takes a second one. Its workers default to one per slot; a ``workers`` count given with
``gpus`` is dealt over the slots round-robin. ParM's parity workers continue the deal over
the ``parity_hosts``' slots, as they continue the round-robin over hosts without GPUs.
Each worker gets ``gpu`` (what its program's ``CUDA_VISIBLE_DEVICES`` holds:
``common.devices``) and ``device = "cuda"``, the one GPU it then sees. A GPU the spec asks
for that a host does not list is refused here; one a host lists but does not have is
refused by ``keel up`` before anything starts (``deploy.preflight.check_devices``).
"""
from __future__ import annotations

from typing import Any

from keel.common.spec.tables import Table, fail

#: a model's GPU slots: (host, GPU) per worker place
Slots = list[tuple[str, str]]


def read_gpus(t: Table, out: dict[str, Any], host_gpus: dict[str, list[str]]) -> None:
    """Fill ``out["gpu_slots"]`` and ``out["parity_gpu_slots"]`` (None: no GPU placement)
    from the model table's ``gpus`` and ``per_gpu``; needs ``hosts`` and ``parity_hosts``."""
    out["gpu_slots"] = out["parity_gpu_slots"] = None
    wanted = t.take("gpus", str | list[int | str], None)
    per_gpu = t.take("per_gpu", int, 1)
    if wanted is None:
        if t.has("per_gpu"):
            fail(t.key("per_gpu"), "only used with gpus")
        return
    if per_gpu < 1:
        fail(t.key("per_gpu"), "must be >= 1")
    if isinstance(wanted, str) and wanted != "all":
        fail(t.key("gpus"), f'must be "all" or a list of GPUs, got {wanted!r}')
    if out.get("pool"):
        fail(t.key("gpus"), "gpus with pools: a pool's instance types place themselves; give one or the other")
    out["gpu_slots"] = _slots(t, out["hosts"], wanted, per_gpu, host_gpus)
    out["parity_gpu_slots"] = _slots(t, out["parity_hosts"], wanted, per_gpu, host_gpus)


def _slots(t: Table, hosts: list[str], wanted: str | list, per_gpu: int, host_gpus: dict[str, list[str]]) -> Slots:
    per_host = []
    for host in hosts:
        listed = host_gpus.get(host, [])
        gpus = listed if wanted == "all" else [str(g) for g in wanted]
        for g in gpus:
            if g not in listed:
                offered = f"lists {listed}" if listed else 'lists none (give it as { address = "...", gpus = [...] })'
                fail(t.key("gpus"), f"GPU {g} is not one host {host!r} offers: [hosts] {host} {offered}")
        if not gpus:
            fail(t.key("gpus"), f'"all" but host {host!r} lists no GPUs')
        per_host.append([(host, g) for g in gpus])
    # GPU by GPU across the hosts, then the next round of per_gpu
    dealt = [slot for i in range(max(map(len, per_host))) for slots in per_host if i < len(slots) for slot in [slots[i]]]
    return dealt * per_gpu


def place(t: dict[str, Any], key: str, i: int, hosts: list[str]) -> tuple[str, dict[str, str]]:
    """Worker ``i``'s host and its GPU options: the ``key`` slots ("gpu_slots" or
    "parity_gpu_slots") dealt round-robin, else ``hosts`` round-robin and no GPU."""
    slots = t.get(key)
    if not slots:
        return hosts[i % len(hosts)], {}
    host, gpu = slots[i % len(slots)]
    return host, {"gpu": gpu, "device": "cuda"}


def check_device_option(t: Table, out: dict[str, Any]) -> None:
    """A model placed on GPUs runs its workers on "cuda" (the one GPU each sees): a
    ``device`` in its worker table would contradict the placement."""
    device = out["worker_options"].get("device")
    if out.get("gpu_slots") and device not in (None, "cuda", "cuda:0"):
        fail(t.key("worker.device"), f'{device!r} with gpus: each worker sees its GPU as "cuda"; drop device')
