"""A discrete-event simulator of a heterogeneous pool on a virtual clock (Kairos §6-§7).

It runs the dispatcher's own distribution policies (``services.scheduling``) against the
dispatcher's own view objects: each query is a ``Query`` whose first feature is its batch
size (``feature_size``), each instance a ``WorkerState`` (``instance`` its type, one slot:
Kairos serves one query at a time per instance), the queue a ``ModelQueue``. The plan is
taken like ``Dispatcher._dispatch_queue`` takes it (consecutive chunks from the head; None
keeps a chunk queued; a busy worker's assignment is skipped; rounds until nothing is
sent), except that a query past its deadline is still served and counted over QoS (the
paper's accounting; the dispatcher would drop it), so no query is ever lost.

- ``simulate(policy, pool, latency_ms, rate, sizes, qos_ms, ...)`` -> ``SimResult``:
  Poisson arrivals at ``rate`` queries/s, batch sizes from ``sizes(rng, n)``, service time
  ``latency_ms(type, size)`` (x a Gaussian noise factor if ``noise``).
- ``allowable_throughput(policy_factory, pool, qos_ms, ...)``: the highest Poisson rate with
  at most 1% of queries over QoS (§4 "allowable throughput"), by bisection (``bisect_rate``).
- ``oracle_throughput(...)``: ORCL (§6), which knows every query in advance.
- ``tune_drs(...)``: DeepRecSys's hill-climbing sweep of the batch-size threshold.

Example
-------
>>> from keel.services.scheduling.kairos import KairosPolicy, feature_size
>>> lat = lambda t, s: {"gpu": 5 + 0.1 * s, "cpu": 1.0 * s}[t]
>>> sizes = lambda rng, n: rng.integers(1, 100, n)
>>> r = simulate(KairosPolicy(lat, feature_size), {"gpu": 1, "cpu": 2}, lat, 50.0, sizes, 60.0, n=200)
>>> r.served, r.lost
(200, 0)
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from keel.common.config import BatchPolicy
from keel.common.kairos.profiles import sample_batch_sizes
from keel.services.scheduling.batching import FixedBatch
from keel.services.scheduling.view import Inflight, ModelQueue, Query, WorkerState

Sizes = Callable[[np.random.Generator, int], np.ndarray]
MODEL = "sim"


@dataclass
class SimResult:
    latencies_ms: np.ndarray  # per query, arrival to completion, in arrival order
    over_qos: float  # fraction of queries over QoS
    throughput: float  # queries served per second of virtual time
    served: int
    lost: int
    placed: dict  # instance type -> sizes of the queries it served
    expired: int = 0  # dropped unserved at their deadline (``drop_expired``): answered, over QoS


def _workers(pool: dict[str, int], prices: dict[str, float] | None = None) -> list[WorkerState]:
    out = []
    for t, count in pool.items():
        for k in range(count):
            out.append(WorkerState(
                identity=f"{t}-{k}".encode(), name=f"{t}-{k}", model=MODEL, role="deployed", slots=1,
                max_batch=1, batch_size=1, last_seen=0.0, instance=t, price=(prices or {}).get(t, 0.0),
            ))
    return out


def simulate(policy, pool: dict[str, int], latency_ms: Callable[[str, int], float], rate: float, sizes: Sizes,
             qos_ms: float, n: int = 2000, seed: int = 0, noise: float = 0.0, warmup: float = 0.1,
             prices: dict[str, float] | None = None, drop_expired: bool = False) -> SimResult:
    """Serve ``n`` Poisson arrivals at ``rate``/s on ``pool`` with ``policy``.

    ``over_qos`` and ``throughput`` leave out the first ``warmup`` fraction of arrivals
    (the empty pool's start). ``noise`` is the standard deviation of a multiplicative
    Gaussian factor on each service time (§8.4 injects 5%). ``policy.observe`` (if any)
    hears every completion, as the dispatcher will call it. ``drop_expired``: a query whose
    deadline passes while it is queued is never started, as ``Dispatcher._take_batch`` does
    (the frontend answers it with its default): its latency is inf (over QoS, not lost);
    else it is served late, taking an instance's time (the count over QoS is the same).
    """
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    batch = np.maximum(1, np.asarray(sizes(rng, n), dtype=int))
    workers = _workers(pool, prices)
    policy_cfg = BatchPolicy(fixed_batch=1)
    queue = ModelQueue(MODEL, policy_cfg, FixedBatch(policy_cfg))
    kind = ((1,), np.dtype(np.float32))
    done = np.full(n, np.nan)
    placed: dict[str, list[int]] = {t: [] for t in pool}
    events: list[tuple[float, int, int]] = [(float(arrivals[0]), 0, 0)]  # (time, 0 arrival / 1 done, index)
    observe = getattr(policy, "observe", None)
    next_arrival, batch_ids, expired = 1, 0, 0
    while events:
        now, what, idx = heapq.heappop(events)
        if what == 0:
            queue.entries.append(Query(idx, now + qos_ms / 1000.0, "", np.array([batch[idx]], np.float32), now, kind))
            if next_arrival < n:
                heapq.heappush(events, (float(arrivals[next_arrival]), 0, next_arrival))
                next_arrival += 1
        else:
            w = workers[idx]
            (bid, flight), = w.inflight.items()
            del w.inflight[bid]
            service_ms = (now - flight.sent_at) * 1000.0
            w.batches += 1
            w.profile.observe(flight.size, service_ms)
            if observe is not None:
                observe(w, int(flight.held[0].input[0]), service_ms)
            done[flight.held[0].qid] = now
        if drop_expired:  # one QoS target for all: the expired are at the queue's head
            while queue.entries and queue.entries[0].deadline <= now:
                done[queue.entries.popleft().qid] = np.inf
                expired += 1
        # the dispatcher's rounds: a policy is asked only while some slot is free
        sent = True
        while sent and queue.entries and any(w.free_slots > 0 for w in workers):
            sent, kept = False, []
            for a in policy.assign(queue, workers, now):
                if not queue.entries:
                    break
                if a.worker is None:
                    for _ in range(min(a.count or 1, len(queue.entries))):
                        kept.append(queue.entries.popleft())
                    continue
                w = a.worker
                if w.free_slots <= 0:
                    continue
                q = queue.entries.popleft()
                size = int(q.input[0])
                factor = max(0.05, 1.0 + rng.normal(0.0, noise)) if noise else 1.0
                service = latency_ms(w.instance, size) * factor / 1000.0
                batch_ids += 1
                w.inflight[batch_ids] = Inflight([q], 1, now)
                heapq.heappush(events, (now + service, 1, workers.index(w)))
                placed[w.instance].append(size)
                sent = True
            if kept:
                queue.entries.extendleft(reversed(kept))
    lat = (done - arrivals) * 1000.0
    served = int(np.isfinite(lat).sum())
    skip = int(warmup * n)
    tail = lat[skip:]
    ends = done[skip:][np.isfinite(done[skip:])]
    span = ends.max() - arrivals[skip] if len(ends) else 0.0
    return SimResult(
        latencies_ms=lat, over_qos=float(np.mean(~(tail <= qos_ms))) if len(tail) else 0.0,
        throughput=(len(tail) / span) if span > 0 else 0.0, served=served, lost=n - served - expired,
        placed={t: v for t, v in placed.items()}, expired=expired,
    )


def allowable_throughput(policy_factory: Callable[[], object], pool: dict[str, int], qos_ms: float,
                         latency_ms: Callable[[str, int], float], sizes: Sizes, target: float = 0.01,
                         lo: float = 0.0, hi: float | None = None, rel_tol: float = 0.02, n: int = 2000,
                         seed: int = 0, noise: float = 0.0, drop_expired: bool = False) -> float:
    """The highest Poisson rate (queries/s) with at most ``target`` of queries over QoS
    (Kairos §4's allowable throughput; §6 "gradually increase the arrival rate").

    Bisection between ``lo`` (meets the target) and ``hi`` (misses it; default found by
    doubling from the pool's capacity on mean-size queries) to ``rel_tol`` of ``hi``. A
    fresh policy per trial (its learning starts afresh); the same ``seed`` per trial, so
    the answer is deterministic. 0.0 if even a slow rate misses the target.
    """
    def ok(rate: float) -> bool:
        return simulate(policy_factory(), pool, latency_ms, rate, sizes, qos_ms, n=n, seed=seed,
                        noise=noise, drop_expired=drop_expired).over_qos <= target

    if hi is None:
        mean = max(1, int(np.mean(sizes(np.random.default_rng(seed), 1000))))
        hi = sum(c * 1000.0 / max(1e-6, latency_ms(t, mean)) for t, c in pool.items())
        while ok(hi):
            lo, hi = hi, hi * 2
    if lo == 0.0:
        lo = hi / 64
        if not ok(lo):
            return 0.0
    return bisect_rate(ok, lo, hi, rel_tol)


def bisect_rate(ok: Callable[[float], bool], lo: float, hi: float, rel_tol: float = 0.02) -> float:
    """Bisection: ``ok(lo)`` holds and ``ok(hi)`` does not; the highest rate found to hold,
    within ``rel_tol`` x ``hi`` of the boundary."""
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def oracle_throughput(pool: dict[str, int], latency_ms: Callable[[str, int], float], sizes: Sizes, qos_ms: float,
                      base: str, n: int = 2000, seed: int = 0) -> float:
    """ORCL (Kairos §6): knows the whole query sequence in advance, sorts it by batch size;
    whenever a base instance is free it serves the largest query left, an auxiliary
    instance the smallest left that it serves within QoS (else it stops). Queries never
    wait and never run where they would miss QoS; throughput = queries / makespan.

    What it can do: bound what distribution alone can reach on a pool and a size mix. What
    it cannot: run online (no policy object: it needs the future), model arrival times or
    queueing (it is a drain of a known backlog), or serve a query no instance meets QoS on
    (it still counts it, served by a base instance).
    """
    return _drain(_sorted_draw(sizes, n, seed), pool, latency_ms, qos_ms, base)


def oracle_search(pools: list[dict[str, int]], latency_ms: Callable[[str, int], float], sizes: Sizes,
                  qos_ms: float, base: str, n: int = 2000, seed: int = 0) -> tuple[float, dict[str, int]]:
    """ORCL as §7 defines it: ``oracle_throughput`` on every pool (of the search space within
    the budget), the largest -> (throughput, its pool). Pools without a base instance serve
    nothing (some query meets QoS nowhere else)."""
    order = _sorted_draw(sizes, n, seed)
    best, best_pool = 0.0, {}
    for pool in pools:
        if pool.get(base):
            q = _drain(order, pool, latency_ms, qos_ms, base)
            if q > best:
                best, best_pool = q, pool
    return best, best_pool


def _sorted_draw(sizes: Sizes, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return sorted(int(s) for s in np.maximum(1, np.asarray(sizes(rng, n), dtype=int)))


def _drain(order: list[int], pool: dict[str, int], latency_ms: Callable[[str, int], float], qos_ms: float,
           base: str) -> float:
    """The oracle's drain of the sorted ``order`` on ``pool`` -> queries / makespan (per s)."""
    lo, hi = 0, len(order)  # the queries left are order[lo:hi]
    free = [(0.0, t == base, t, k) for t, c in pool.items() for k in range(c)]
    heapq.heapify(free)
    end = 0.0
    while lo < hi and free:
        at, is_base, t, k = heapq.heappop(free)
        if is_base:
            size, hi = order[hi - 1], hi - 1
        elif latency_ms(t, order[lo]) <= qos_ms:
            size, lo = order[lo], lo + 1
        else:
            continue  # this auxiliary instance can serve nothing left within QoS
        at += latency_ms(t, size)
        end = max(end, at)
        heapq.heappush(free, (at, is_base, t, k))
    return len(order) / (end / 1000.0) if end > 0 and lo >= hi else 0.0


def tune_drs(score: Callable[[int], float], candidates: list[int], start: int | None = None) -> int:
    """DeepRecSys's hill climbing (Kairos §6): from ``start``, step to the neighbouring
    threshold in ``candidates`` (sorted) while ``score`` (e.g. the allowable throughput of
    an observed window under that threshold) improves; the threshold where it stops."""
    cands = sorted(candidates)
    i = cands.index(start) if start in cands else len(cands) // 2
    best = score(cands[i])
    while True:
        moves = [(score(cands[j]), j) for j in (i - 1, i + 1) if 0 <= j < len(cands)]
        top = max(moves, default=(best, i))
        if top[0] <= best:
            return cands[i]
        best, i = top


def latency_table(prof, model: str, types: list[str]) -> Callable[[str, int], float]:
    """The profile as a lookup by integer batch size (1..1000): ``(type, size) -> ms``."""
    tab = {t: prof.latency_ms(t, model, np.arange(0, 1001)) for t in types}
    return lambda t, s: float(tab[t][min(1000, max(1, int(s)))])


def sample_sizes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` request batch sizes from the authors' size mix."""
    return sample_batch_sizes(n, rng)


def pool_dict(types: list[str], counts) -> dict[str, int]:
    """A pool as instance type -> count, leaving out types it has none of."""
    return {t: int(n) for t, n in zip(types, counts) if n}
