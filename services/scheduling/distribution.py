"""Query-distribution policies: which worker gets which query batch (a dispatcher plug-in).

Interface::

    policy.assign(queue: ModelQueue, workers: Sequence[WorkerState], now: float) -> list[Assignment]

``queue.entries`` is the model's FIFO (``Query``: ``size``, ``enqueued``, ``deadline``;
parity queues hold whole parity ``Batch``es), ``workers`` every live worker of the model,
free or busy, with what it declared (``instance``, ``price``, ``threads``, ``slots``,
``max_batch``) and what was measured (``profile.estimate(batch_size)``,
``expected_free_at(now)``, ``inflight``). Read them; never change them.

The plan is a list of ``Assignment(worker, count)`` taken in order as consecutive chunks
from the head of the queue: the first assignment's chunk is the first ``count`` queries,
the next one's the following ``count``, and so on. ``count`` None means what the batching
plug-in says for that worker (``queue.batching.size(worker)``); ``worker`` None keeps the
chunk queued this round (a policy that would rather wait for a busy, faster worker). An
assignment to a worker with no free slot is skipped: credits are the dispatcher's
invariant, not a policy's. The dispatcher asks again after each round that sent
something, until the queue or the free slots run out, so a policy may return one
assignment at a time (``RoundRobin``) or a whole round (``SingleQueue``).

Kairos (§5.1) fits as: chunks = the head of the queue cut into candidate batches; cost
matrix C[chunk, worker] = (time until the worker is free + profile.estimate(chunk size))
x the worker's heterogeneity coefficient (ratio of its latency on the largest batch to the
fastest instance kind's), + a large penalty where the chunk's wait + completion exceeds
its deadline (Eq. 8); ``scipy.optimize.linear_sum_assignment(C)``; return the chunks in
queue order, each with its matched worker (None where it matched a busy one).

A policy is registered by name as its class or as the ``"module:Class"`` path of one,
imported only when a dispatcher runs it: Kairos's module pulls in ``scipy.optimize``
(0.24 s of a 0.37 s dispatcher import), which a single-queue dispatcher, restarted by
supervisord while its workers wait, never pays.

Example
-------
>>> sorted(POLICIES)
['clockwork', 'fcfs_base', 'kairos', 'round_robin', 'single_queue']
>>> policy_class("round_robin").__name__
'RoundRobin'
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence

from keel.common.config import ConfigError, DispatcherConfig
from keel.services.scheduling.view import Assignment, DistributionPolicy, ModelQueue, WorkerState  # noqa: F401 (re-exported)


class SingleQueue:
    """Clipper/ParM single-queue load balancing (ParM §6.1): any worker with a free slot
    pulls the next batch. Workers are served longest-quiet first, so load spreads evenly."""

    def assign(self, queue: ModelQueue, workers: Sequence[WorkerState], now: float) -> list[Assignment]:
        free = [w for w in workers if w.free_slots > 0]
        if len(free) > 1:
            free.sort(key=lambda w: w.last_seen)
        return [Assignment(w) for w in free]


class RoundRobin:
    """Rotate over the model's workers in registration order, skipping those with no free
    slot: one batch per turn, whatever the workers' speed."""

    def __init__(self) -> None:
        self.turn: dict[str, int] = {}  # model -> index of the worker whose turn is next

    def assign(self, queue: ModelQueue, workers: Sequence[WorkerState], now: float) -> list[Assignment]:
        n = len(workers)
        start = self.turn.get(queue.model, 0)
        for step in range(n):
            i = (start + step) % n
            if workers[i].free_slots > 0:
                self.turn[queue.model] = i + 1
                return [Assignment(workers[i])]
        return []


_KAIROS = "keel.services.scheduling.kairos"

#: name -> the policy's class, or the "module:Class" path of one (imported when first run).
#: Kairos §5.1 and its baselines (§6) build with defaults (size 1 per query, latencies
#: learned from Done); DRS needs its threshold: ``kairos.make_policy("drs", threshold=...)``
POLICIES: dict[str, type | str] = {
    "single_queue": SingleQueue, "round_robin": RoundRobin,
    "kairos": f"{_KAIROS}:KairosPolicy", "fcfs_base": f"{_KAIROS}:FcfsBase", "clockwork": f"{_KAIROS}:ClockworkPolicy",
}


def policy_class(name: str) -> type:
    """The class of the policy registered as ``name`` (importing its module if it is a path)."""
    entry = POLICIES[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    return entry


KAIROS_POLICIES = ("kairos", "fcfs_base", "clockwork", "drs")


def distribution_policy(cfg: DispatcherConfig):
    """The distribution policy ``cfg.policy`` names. The Kairos policies (§5.1, §6
    baselines), when ``cfg.kairos_model`` is set, are built with that model's measured
    profile (``common.kairos.profiles``) scaled by ``kairos_scale`` as their prior, the
    heterogeneity coefficients it gives (§5.1 Definition), and each query's batch size read
    from its first feature (``feature_size``, the emulated ``kairos`` model's rows)."""
    if cfg.policy not in POLICIES and cfg.policy != "drs":
        raise ConfigError(f"unknown distribution policy {cfg.policy!r}; known: {sorted([*POLICIES, 'drs'])}")
    if cfg.policy not in KAIROS_POLICIES:
        return policy_class(cfg.policy)()
    from keel.services.scheduling.kairos import feature_size, make_policy

    kw: dict = {"threshold": cfg.drs_threshold} if cfg.policy == "drs" else {}
    if not cfg.kairos_model:
        return make_policy(cfg.policy, **kw)
    from keel.common.kairos.profiles import Profiles

    try:
        prof = Profiles.load(cfg.kairos_profile or None)
        prof.latency_ms(prof.types[0], cfg.kairos_model, 1)
    except (FileNotFoundError, KeyError) as exc:
        raise ConfigError(f"dispatcher: kairos_model/kairos_profile: {exc}") from None
    model, scale, known = cfg.kairos_model, cfg.kairos_scale, set(prof.types)

    def latency_ms(instance: str, size: int) -> float | None:
        return prof.latency_ms(instance, model, size) * scale if instance in known else None

    if cfg.policy == "kairos":
        kw["coefficients"] = {t: prof.coefficient(t, model) for t in prof.types}
    return make_policy(cfg.policy, latency_ms=latency_ms, size_of=feature_size, **kw)
