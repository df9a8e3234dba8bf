"""Query-distribution policies: which workers get the next batches (a dispatcher plug-in).

A policy's ``assign(queued, free, now)`` orders the workers that have a free slot; the
dispatcher hands each, in that order, its next batch from the model's queue. New
policies (round-robin, Kairos) register in ``POLICIES``.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorkerState:
    """The dispatcher's view of one worker."""

    identity: bytes
    name: str
    model: str
    role: str
    slots: int
    max_batch: int
    batch_size: int
    last_seen: float
    inflight: dict = field(default_factory=dict)  # batch_id -> queries (or the parity Batch)
    batches: int = 0
    last_service_ms: float = 0.0
    idle_since: float = 0.0

    @property
    def free_slots(self) -> int:
        return self.slots - len(self.inflight)


class SingleQueue:
    """Clipper/ParM single-queue load balancing: any worker with a free slot pulls next.

    Workers are served in order of how long they have been idle, so load spreads evenly.
    """

    def assign(self, queued: int, free: list[WorkerState], now: float) -> list[WorkerState]:
        return sorted(free, key=lambda w: w.last_seen) if len(free) > 1 else free


POLICIES = {"single_queue": SingleQueue}
