"""What schedulers read: the dispatcher's queues and its view of every worker.

Policies read these and never change them (the dispatcher does). Times are the
dispatcher's ``time.monotonic()``.

- ``Query``: one queued query (a row): its deadline, when it was queued; ``size`` 1.
  Kairos §5.1 reads wait time (``now - enqueued``) and the deadline (its QoS check, Eq. 3).
- ``ModelQueue``: one model's FIFO of ``Query`` (deployed models) or parity ``Batch``
  (parity models, ParM §4.1), its batching plug-in, its coding groups, and the arrival
  rate SERF's load-adaptive scheduler follows.
- ``WorkerState``: what the worker declared in ``Register`` (instance kind and price for
  Kairos; threads and slots for SERF; max_batch) and what the dispatcher measured: a
  ``ServiceProfile`` per (slots, threads) configuration, its in-flight batches.
- ``ServiceProfile``: EWMA of service time per batch size, with linear inter- and
  extrapolation for sizes not yet seen (Kairos §5.1 "starts with a linear model ... a
  lookup table after processing more queries").

Example
-------
>>> p = ServiceProfile()
>>> p.observe(1, 2.0); p.observe(9, 10.0)
>>> p.estimate(5)
6.0
"""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from keel.common.config import BatchPolicy

#: SERF's arrival rate (``ModelQueue.arrival_rate``): counted over at most
#: ARRIVAL_WINDOW_S (how far back a queue keeps its arrivals), from FIRST_RATE_S after the
#: first arrival; a step is seen where two rates split at one arrival explain the arrivals
#: better than one rate by a log-likelihood ratio over STEP_LLR, each side at least STEP_MIN_S
ARRIVAL_WINDOW_S = 4.0
FIRST_RATE_S = 0.5
STEP_LLR = 12.0
STEP_MIN_S = 0.05


@dataclass(slots=True)
class Query:
    qid: int
    deadline: float  # monotonic
    reply_to: str
    input: np.ndarray
    enqueued: float  # monotonic
    #: (row shape, dtype) of the Queries message it came in; one object per message, so a
    #: batch keeps to one shape with an identity test (rows of another shape wait)
    kind: tuple
    #: back in the queue after its worker died or left: skipped if meanwhile answered
    requeued: bool = False

    @property
    def size(self) -> int:
        return 1


@dataclass
class ModelQueue:
    model: str
    policy: BatchPolicy
    batching: Any  # services.scheduling.batching.Batching
    coding: Any = None  # services.scheduling.coding.CodingGroups for coded models
    #: Query, or for a parity model's queue, parity Batch (sent whole)
    entries: deque = field(default_factory=deque)
    parity: bool = False
    #: rows received since the last rate update, and the EWMA of arrivals per second
    arrived: int = 0
    rate: float = 0.0
    rate_at: float = 0.0
    #: (when, rows) of each arrival within the last ``ARRIVAL_WINDOW_S`` (SERF's rate)
    arrivals: deque = field(default_factory=deque)
    first_arrival: float | None = None
    step_at: float = float("-inf")  # the last step in the arrival rate seen (``arrival_rate``)

    def arrive(self, rows: int, now: float) -> None:
        if self.first_arrival is None:
            self.first_arrival = now
        self.arrived += rows
        self.arrivals.append((now, rows))
        self._forget(now)

    def arrival_rate(self, now: float) -> tuple[float, float] | None:
        """SERF's arrival rate: (rows per second, over how many seconds), counted since the
        last step in the rate (at most ``ARRIVAL_WINDOW_S`` back). 0 before the first
        arrival; None until ``FIRST_RATE_S`` after it.

        A step is a change point of a Poisson process: of every split of the counted
        arrivals at one of them (at least ``STEP_MIN_S`` either side), the one whose two
        rates raise the log-likelihood most over one rate, seen once the rise is over
        ``STEP_LLR``; the rate is then counted from that split on. Why not fixed windows
        (0.5-4 s, each shorter one against the rest of the longer, at 4 standard errors):
        a step from 58 to 174/s needed 0.3 s to show in the shortest window, and was read
        at the first chore 0.5 s after it, while the light load's configuration built the
        backlog the high phase then paid for. Every split weighs all the evidence: the same
        step shows in 0.1-0.2 s, and over 18 minutes of steady Poisson arrivals at 10-174/s,
        looked at every 0.05 s, no step was seen (``STEP_LLR`` 8 saw 20)."""
        self._forget(now)
        if self.first_arrival is None:
            return 0.0, ARRIVAL_WINDOW_S
        if now - self.first_arrival < FIRST_RATE_S:
            return None
        start = max(self.first_arrival, self.step_at, now - ARRIVAL_WINDOW_S)
        t, rows = self._since(start)
        split = _change_point(t, rows, start, now)
        if split is not None:
            self.step_at = start = split
            rows = rows[t > start]  # the arrivals after the step (those read above, not the queue again)
        return float(rows.sum()) / (now - start), now - start

    def _since(self, start: float) -> tuple[np.ndarray, np.ndarray]:
        """The times and rows of the arrivals after ``start``."""
        kept = [(t, n) for t, n in self.arrivals if t > start]
        if not kept:
            return np.empty(0), np.empty(0)
        t, rows = zip(*kept)
        return np.asarray(t, float), np.asarray(rows, float)

    def _forget(self, now: float) -> None:
        while self.arrivals and self.arrivals[0][0] <= now - ARRIVAL_WINDOW_S:
            self.arrivals.popleft()

    def update_rate(self, now: float, alpha: float = 0.3) -> None:
        if self.rate_at and now > self.rate_at:
            self.rate += alpha * (self.arrived / (now - self.rate_at) - self.rate)
        self.arrived, self.rate_at = 0, now


def _change_point(t: np.ndarray, rows: np.ndarray, start: float, now: float) -> float | None:
    """The arrival time at which the rate of the arrivals ``t`` (``rows`` each) in (start,
    now] stepped (``ModelQueue.arrival_rate``), or None: the split (the arrivals up to and
    including one, and those after) whose two Poisson rates raise the log-likelihood over
    one rate the most, where that rise is over ``STEP_LLR``."""
    total, span = rows.sum(), now - start
    if len(t) < 2 or total <= 0:
        return None
    n1 = np.cumsum(rows)  # rows up to and including each arrival
    n2 = total - n1
    t1, t2 = t - start, now - t
    ok = (t1 >= STEP_MIN_S) & (t2 >= STEP_MIN_S)
    if not ok.any():
        return None
    n1, n2, t1, t2 = n1[ok], n2[ok], t1[ok], t2[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        llr = np.where(n1 > 0, n1 * np.log(n1 / t1), 0.0) + np.where(n2 > 0, n2 * np.log(n2 / t2), 0.0)
    llr -= total * np.log(total / span)
    best = int(np.argmax(llr))
    return float(t[ok][best]) if llr[best] > STEP_LLR else None


class ServiceProfile:
    """Service time (ms) per batch size: EWMA of what ``Done`` reported."""

    __slots__ = ("alpha", "ms", "count", "_sizes")

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        self.ms: dict[int, float] = {}
        self.count = 0
        self._sizes: list[int] = []  # sorted keys of ms

    def observe(self, size: int, service_ms: float) -> None:
        self.count += 1
        old = self.ms.get(size)
        if old is None:
            self.ms[size] = service_ms
            bisect.insort(self._sizes, size)
        else:
            self.ms[size] = old + self.alpha * (service_ms - old)

    def estimate(self, size: int) -> float | None:
        """Expected service time of a batch of ``size``; None before any observation."""
        exact = self.ms.get(size)
        if exact is not None or not self._sizes:
            return exact
        sizes, i = self._sizes, bisect.bisect(self._sizes, size)
        if len(sizes) == 1:  # one point: proportional to the batch size
            return self.ms[sizes[0]] * size / sizes[0] if sizes[0] else self.ms[sizes[0]]
        lo, hi = (i - 1, i) if 0 < i < len(sizes) else ((0, 1) if i == 0 else (len(sizes) - 2, len(sizes) - 1))
        x0, x1 = sizes[lo], sizes[hi]
        y0, y1 = self.ms[x0], self.ms[x1]
        slope = max(0.0, (y1 - y0) / (x1 - x0))
        return max(0.0, y0 + slope * (size - x0))

    def to_json(self) -> dict[str, float]:
        return {str(s): round(self.ms[s], 3) for s in self._sizes}


@dataclass(slots=True)
class Inflight:
    """A batch a worker holds: its queries (or the parity Batch), size, when it was sent."""

    held: Any  # list[Query] | Batch
    size: int
    sent_at: float


@dataclass
class WorkerState:
    """The dispatcher's view of one worker: declared at ``Register``, measured from ``Done``."""

    identity: bytes
    name: str
    model: str
    role: str
    slots: int
    max_batch: int
    batch_size: int
    last_seen: float
    instance: str = ""  # declared instance kind (Kairos: a heterogeneous pool's types)
    price: float = 0.0  # declared cost per hour
    threads: int = 1  # declared (or configured) torch threads
    inflight: dict[int, Inflight] = field(default_factory=dict)  # batch_id -> Inflight
    batches: int = 0
    last_service_ms: float = 0.0
    #: service-time profile per (slots, threads) configuration (SERF profiles each)
    profiles: dict[tuple[int, int], ServiceProfile] = field(default_factory=dict)
    alive: bool = True

    @property
    def free_slots(self) -> int:
        return self.slots - len(self.inflight)

    @property
    def profile(self) -> ServiceProfile:
        """The profile of the current configuration."""
        key = (self.slots, self.threads)
        profile = self.profiles.get(key)
        if profile is None:
            profile = self.profiles[key] = ServiceProfile()
        return profile

    def expected_free_at(self, now: float) -> float:
        """When the earliest in-flight batch is expected to finish (``now`` if a slot is
        free): the "remaining time till the instance can serve" of Kairos §5.1."""
        if self.free_slots > 0 or not self.inflight:
            return now
        profile = self.profile
        ends = [f.sent_at + (profile.estimate(f.size) or 0.0) / 1000.0 for f in self.inflight.values()]
        return max(now, min(ends))

    def status(self) -> dict:
        return {
            "model": self.model, "role": self.role, "instance": self.instance, "price": self.price,
            "threads": self.threads, "slots": self.slots, "max_batch": self.max_batch,
            "batch_size": self.batch_size, "inflight": len(self.inflight), "batches": self.batches,
            "last_service_ms": round(self.last_service_ms, 3), "profile": self.profile.to_json(),
        }


def pool_summary(workers: Iterable[WorkerState]) -> dict:
    """Per declared instance type (Kairos' heterogeneous pool), in name order (not the
    order the workers happened to register in): workers, busy fraction now (in-flight
    batches / slots), batches served, and the pool's cost per hour; {} when no worker
    declares an instance type."""
    pools: dict[str, dict] = {}
    for w in workers:
        if not w.instance:
            continue
        p = pools.setdefault(w.instance, {"workers": 0, "slots": 0, "inflight": 0, "batches": 0, "cost_per_hour": 0.0})
        p["workers"] += 1
        p["slots"] += w.slots
        p["inflight"] += len(w.inflight)
        p["batches"] += w.batches
        p["cost_per_hour"] += w.price
    for p in pools.values():
        p["busy"] = round(p["inflight"] / p["slots"], 3) if p["slots"] else 0.0
        p["cost_per_hour"] = round(p["cost_per_hour"], 4)
    if not pools:
        return {}
    return {"pools": {name: pools[name] for name in sorted(pools)},
            "cost_per_hour": round(sum(p["cost_per_hour"] for p in pools.values()), 4)}


@dataclass(slots=True)
class Assignment:
    """The next chunk of the queue goes to ``worker`` (None: stays queued this round)."""

    worker: WorkerState | None
    count: int | None = None


class DistributionPolicy(Protocol):
    """A query-distribution plug-in of the dispatcher (``distribution.POLICIES``)."""

    def assign(self, queue: ModelQueue, workers: Sequence[WorkerState], now: float) -> list[Assignment]: ...
