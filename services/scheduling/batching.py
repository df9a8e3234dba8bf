"""Batching plug-ins: how many queries a worker's next batch takes (Clipper §4.3).

A ``Batching`` belongs to one model's queue (``BatchPolicy``) and keeps its per-worker
state on ``WorkerState.batch_size``:

- ``start_size(max_batch) -> int``: a newly registered worker's batch size.
- ``size(worker) -> int``: rows for that worker's next batch.
- ``hold_until(queue, want, now) -> float | None``: delayed batching (§4.3.2): while the
  queue holds fewer than ``want`` queries, a partial batch waits for more, up to
  ``batch_delay_ms`` after its oldest query arrived; the time to look again, or None to
  send now. Like Nagle's algorithm: worth it when a batch's fixed cost is high.
- ``observe(worker, size, service_ms, ok)``: a batch finished (``Done``).

``AIMD`` is §4.3.1's dynamic batch size: +``aimd_step`` while a full batch's service time
stays within ``batch_budget_ms``, x``aimd_backoff`` (0.9: "reducing the batch size by
10%") when it does not. ``FixedBatch`` keeps ``fixed_batch`` (ParM's latency runs use 1).
``batching_for(policy)`` picks one: fixed when ``fixed_batch`` is set, else AIMD.

Example
-------
>>> from keel.common.config import BatchPolicy
>>> type(batching_for(BatchPolicy(fixed_batch=4))).__name__
'FixedBatch'
"""
from __future__ import annotations

from typing import Any

from keel.common.config import BatchPolicy
from keel.services.scheduling.view import WorkerState


class Batching:
    """Delayed batching (§4.3.2) shared by every batch-size rule."""

    def __init__(self, policy: BatchPolicy):
        self.policy = policy
        self.delay_s = policy.batch_delay_ms / 1000.0

    def start_size(self, max_batch: int) -> int:
        return min(self.policy.fixed_batch or 1, max_batch)

    def size(self, worker: WorkerState) -> int:
        return worker.batch_size

    def hold_until(self, queue: Any, want: int, now: float) -> float | None:
        if self.delay_s <= 0 or len(queue.entries) >= want:
            return None
        ready_at = queue.entries[0].enqueued + self.delay_s
        return ready_at if ready_at > now else None

    def observe(self, worker: WorkerState, size: int, service_ms: float, ok: bool) -> None:
        """A batch of ``size`` finished in ``service_ms`` (``ok`` False: the model failed)."""


class FixedBatch(Batching):
    """Every batch takes ``fixed_batch`` queries (or what the queue has)."""


class AIMD(Batching):
    """Clipper §4.3.1: additive increase while under the batch latency budget,
    multiplicative back-off over it; only a full batch says anything about a larger one."""

    def observe(self, worker: WorkerState, size: int, service_ms: float, ok: bool) -> None:
        if not ok:
            return
        policy = self.policy
        if service_ms > policy.batch_budget_ms:
            worker.batch_size = max(1, int(worker.batch_size * policy.aimd_backoff))
        elif size >= worker.batch_size:
            worker.batch_size = min(worker.max_batch, worker.batch_size + policy.aimd_step)


BATCHING: dict[str, type[Batching]] = {"aimd": AIMD, "fixed": FixedBatch}


def batching_for(policy: BatchPolicy) -> Batching:
    return BATCHING["fixed" if policy.fixed_batch is not None else "aimd"](policy)
