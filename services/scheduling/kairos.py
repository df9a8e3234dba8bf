"""Kairos query distribution (Kairos §5.1) and the paper's baselines (§6), as dispatcher
distribution policies (``services.scheduling.distribution``).

A Kairos *query* is one queued Keel ``Query``; its batch size (items) is not on the wire.
Every policy here takes ``size_of(query) -> int`` (default 1 item; ``feature_size`` reads
it from the query's first feature, where the emulated model carries it, and is what the
dispatcher integration will pass for it) and ``latency_ms(instance_type, size) -> float | None`` (the profile: e.g.
the authors' measured latencies; None where unknown), both at construction. Each policy
returns one ``Assignment(worker, 1)`` per query, in queue order, over a bounded window of
the queue's head: ``worker`` None keeps that query queued this round (it waits for a busy
instance, or for an instance of its class).

Learning (§5.1 "starts with a linear model ... a lookup table after processing more
queries"): ``LatencyPredictor`` refines the profile with observed service times per
(model, type, size). Integration in the dispatcher (later): build the policy with
``size_of=feature_size`` (emulated models) and the profile reader's ``latency_ms``, and
in ``_on_done``, after ``worker.profile.observe``, for a successful batch of queries::

    observe = getattr(self.policy, "observe", None)
    if msg.ok and observe is not None and isinstance(held.held, list):
        observe(worker, sum(self.policy.size_of(q) for q in held.held), msg.service_ms)

Every plan here is one query per assignment (count 1), so a batch is one Kairos query.
Caveat: ``Dispatcher._take_batch`` drops a query past its deadline and takes the next,
which shifts the plan's chunks by one for the rest of that round (the next round
re-plans); the simulator serves late queries instead (the paper's accounting).

- ``KairosPolicy``   §5.1, Eq. 2-8: min-cost bipartite matching of the queue's head
  against all instances, free or busy, cost = coefficient x (remaining busy time +
  predicted latency), + a penalty where wait + completion would miss rho x QoS.
- ``FcfsBase``       Ribbon's distribution (§6): first come first served, base type first.
- ``DrsPolicy``      DeepRecSys (§6): a batch-size threshold; small queries to auxiliary
  types, large to the base type (threshold tuned by ``bench.kairos_sim.tune_drs``).
- ``ClockworkPolicy`` CLKWRK (§6): each query to the instance predicted to finish it first.

The Oracle (§6, ORCL) knows all arrivals and is no policy: ``bench.kairos_sim.oracle_throughput``.

Example
-------
>>> p = KairosPolicy(latency_ms=lambda t, s: {"gpu": 5 + 0.1 * s, "cpu": 1.0 * s}[t])
>>> round(p.predictor.coefficient("m", "cpu", ["gpu", "cpu"]), 3)   # L_gpu(1000) / L_cpu(1000)
0.105
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice

import numpy as np
from scipy.optimize import linear_sum_assignment

from keel.services.scheduling.view import Assignment, ModelQueue, Query, WorkerState

LatencyFn = Callable[[str, int], "float | None"]


def feature_size(query: Query) -> int:
    """The batch size the emulated model carries in the query's first feature (>= 1)."""
    try:
        return max(1, int(query.input.flat[0]))
    except (AttributeError, IndexError, TypeError, ValueError):
        return 1


def unit_size(query: Query) -> int:
    return 1


class LatencyPredictor:
    """Predicted service time (ms) of a query of ``size`` on an instance type (§5.1).

    Order of trust: the EWMA of observed service times at exactly (model, type, size);
    else the profile ``latency_ms`` mapped by a least-squares line ``k x profile + d``
    through the type's observed (profile, observed) points (the profile's shape, the
    measured level and fixed overhead; one point: the ratio ``k`` alone); else a
    least-squares line through the type's observed sizes (the paper's starting linear
    model); else the worker's own ``ServiceProfile`` (the dispatcher's, per rows: right
    when ``size_of`` is 1); else 0.

    Why a line and not a ratio: a live instance adds a fixed ~1-3 ms (transport, the
    sleep's wake-up) to every query; as a ratio learnt mostly from small queries (the
    mix's median is 176 items) that overhead was multiplied into the large ones (+4% at
    830 items on r5n.large for rm2: 14 ms, twice the rho margin of 7 ms), pushing queries
    an auxiliary type serves within QoS onto the base type.
    """

    def __init__(self, latency_ms: LatencyFn | None = None, alpha: float = 0.2, ref_size: int = 1000):
        self.prior = latency_ms
        self.alpha = alpha
        self.ref_size = ref_size  # the largest query: measures the coefficient (§5.1)
        self.seen: dict[tuple[str, str], dict[int, float]] = {}  # (model, type) -> size -> ms
        self._fit: dict[tuple[str, str], tuple[float, float]] = {}  # (model, type) -> (k, d)
        self._cache: dict[tuple[str, str], dict[int, float]] = {}  # (model, type) -> size -> ms
        self._arrays: dict[tuple[str, str], np.ndarray] = {}  # predict() by size, 0..len-1
        self._priors: dict[tuple[str, int], np.ndarray | None] = {}  # (type, length) -> the profile by size
        self._coef: dict[tuple[str, str], float] = {}

    def observe(self, model: str, instance: str, size: int, service_ms: float) -> None:
        key = (model, instance)
        table = self.seen.setdefault(key, {})
        old = table.get(size)
        table[size] = service_ms if old is None else old + self.alpha * (service_ms - old)
        self._fit.pop(key, None)
        self._cache.pop(key, None)
        self._arrays.pop(key, None)
        self._coef.clear()

    def level(self, model: str, instance: str) -> tuple[float, float] | None:
        """(k, d) of observed ~ k x profile + d for the type; None with nothing observed."""
        key = (model, instance)
        hit = self._fit.get(key)
        if hit is not None or self.prior is None:
            return hit
        seen = self.seen.get(key)
        if not seen:
            return None
        sizes = np.fromiter(seen, int, len(seen))
        ys = np.fromiter(seen.values(), float, len(seen))
        xs = self._prior_at(instance, sizes)
        keep = xs > 0
        xs, ys = xs[keep], ys[keep]
        if not len(xs):
            return None
        k, d = float(np.mean(ys / xs)), 0.0
        if len(xs) >= 2 and np.ptp(xs) > 0.05 * xs.max():
            dx = xs - xs.mean()  # least squares line, closed form (np.polyfit's answer)
            slope = float(dx @ (ys - ys.mean()) / (dx @ dx))
            if slope > 0:
                k, d = slope, float(ys.mean() - slope * xs.mean())
        self._fit[key] = (k, d)
        return k, d

    def predict(self, model: str, instance: str, size: int, worker: WorkerState | None = None) -> float:
        key = (model, instance)
        hit = self._cache.get(key, {}).get(size)
        if hit is not None:
            return hit
        table = self.seen.get(key, {})
        ms = table.get(size)
        if ms is None and self.prior is not None:
            p = self.prior(instance, size)
            if p is not None:
                k, d = self.level(model, instance) or (1.0, 0.0)
                ms = max(0.0, k * p + d)
        if ms is None and len(table) >= 2:
            xs, ys = np.fromiter(table, float), np.fromiter(table.values(), float)
            slope, icept = np.polyfit(xs, ys, 1)
            ms = max(0.0, icept + max(0.0, slope) * size)
        if ms is None and worker is not None:
            ms = worker.profile.estimate(size)
            if ms is not None:
                return ms  # the worker's, not the type's: not cached
        ms = 0.0 if ms is None else float(ms)
        self._cache.setdefault(key, {})[size] = ms
        return ms

    def predict_many(self, model: str, instance: str, sizes: np.ndarray) -> np.ndarray:
        """``predict`` for an array of sizes, from a table by size grown as needed (built
        with arrays where the profile knows the type: one pass per ``Done`` of it)."""
        key = (model, instance)
        table = self._arrays.get(key)
        top = int(sizes.max(initial=0)) + 1
        if top > 1 << 14:  # no table that large: one by one
            return np.array([self.predict(model, instance, int(s)) for s in sizes], float)
        if table is None or len(table) < top:
            n = max(top, 64, self.ref_size + 1)
            prior = self._prior_array(instance, n)
            if prior is None:
                table = np.array([self.predict(model, instance, s) for s in range(n)])
            else:
                k, d = self.level(model, instance) or (1.0, 0.0)
                table = np.maximum(0.0, k * prior + d)
                seen = self.seen.get(key, {})
                idx = np.fromiter(seen, int, len(seen))
                vals = np.fromiter(seen.values(), float, len(seen))
                inside = (idx >= 0) & (idx < n)
                table[idx[inside]] = vals[inside]
            self._arrays[key] = table
        return table[sizes]

    def _prior_array(self, instance: str, n: int) -> np.ndarray | None:
        """The profile at sizes 0..n-1 (None if it lacks any of them), computed once."""
        if self.prior is None:
            return None
        if (instance, n) not in self._priors:
            vals = [self.prior(instance, s) for s in range(n)]
            self._priors[(instance, n)] = None if any(v is None for v in vals) else np.array(vals, float)
        return self._priors[(instance, n)]

    def _prior_at(self, instance: str, sizes: np.ndarray) -> np.ndarray:
        """The profile at ``sizes`` (0 where it is unknown), from the cached table by size."""
        table = self._prior_array(instance, max(int(sizes.max(initial=0)) + 1, self.ref_size + 1))
        if table is not None:
            return table[sizes]
        vals = [self.prior(instance, int(s)) for s in sizes]
        return np.array([0.0 if v is None else v for v in vals], float)

    def coefficient(self, model: str, instance: str, types: Sequence[str]) -> float:
        """Heterogeneity coefficient (§5.1 Definition): L_base(ref) / L_type(ref), the base
        type being the fastest on the largest query; 1 where latencies are unknown."""
        c = self._coef.get((model, instance))
        if c is None:
            lat = {t: self.predict(model, t, self.ref_size) for t in set(types) | {instance}}
            base = min(lat.values())
            c = base / lat[instance] if base > 0 and lat[instance] > 0 else 1.0
            self._coef[(model, instance)] = c
        return c


class _Policy:
    """What the policies share: the size of a query, the predictor, busy times, the window."""

    window_per_instance = 2

    def __init__(self, latency_ms: LatencyFn | None = None, size_of: Callable[[Query], int] = unit_size,
                 predictor: LatencyPredictor | None = None):
        self.size_of = size_of
        self.predictor = predictor or LatencyPredictor(latency_ms)

    def observe(self, worker: WorkerState, size: int, service_ms: float) -> None:
        """A ``Done`` of a query of ``size`` items on ``worker`` took ``service_ms``."""
        self.predictor.observe(worker.model, worker.instance, size, service_ms)

    def busy_ms(self, worker: WorkerState, now: float) -> float:
        """Remaining time till ``worker`` can serve (ms): 0 with a free slot, else the
        earliest predicted end of what it holds (its queries' sizes, this predictor's)."""
        if worker.free_slots > 0 or not worker.inflight:
            return 0.0
        ends = []
        for f in worker.inflight.values():
            held = f.held if isinstance(f.held, list) else []
            size = sum(self.size_of(q) for q in held) or f.size
            ends.append(f.sent_at * 1000.0 + self.predictor.predict(worker.model, worker.instance, size, worker))
        return max(0.0, min(ends) - now * 1000.0)

    def head(self, queue: ModelQueue, workers: Sequence[WorkerState]) -> list:
        return list(islice(queue.entries, self.window_per_instance * max(1, len(workers))))


def solve(cost: np.ndarray, resolution_ms: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Min-cost bipartite matching (Eq. 4-7) by ``linear_sum_assignment``, on a reduced
    matrix with the same optimum: column minima subtracted when every instance is matched
    (queries >= instances), row minima when every query is (queries <= instances), then
    rounded to ``resolution_ms``. Costs of this form (coefficient x (busy + latency), two
    or three types) have many near-ties that make the solver several times slower than on
    a random matrix: 5 ms at 200 x 200 here raw, 1.2 ms reduced at 1 us, 0.85 ms at 0.1 ms.
    The plan found is then optimal to within ``resolution_ms`` / 2 per matched pair."""
    n, m = cost.shape
    if n >= m:
        cost = cost - cost.min(axis=0, keepdims=True)
    if n <= m:
        cost = cost - cost.min(axis=1, keepdims=True)
    return linear_sum_assignment(np.round(cost / resolution_ms))


class KairosPolicy(_Policy):
    """Kairos §5.1: the first queued queries (at most 2 x instances) matched against all
    instances by min-cost bipartite matching (Jonker-Volgenant, ``linear_sum_assignment``).

    cost[i, j] = c(type_j) x (busy_j + L(i, j))  (Eq. 2); where wait_i + busy_j + L(i, j) >
    rho x QoS_i it is ``penalty_factor`` x QoS_i + busy_j + L(i, j) instead, the real time
    unweighted, so a query late everywhere finishes soonest (Eq. 5 folded into the objective, Eq. 8; QoS_i
    is the query's budget ``deadline - enqueued``, rho 0.98 as in §5.1). Only pairs whose
    instance has a free slot start (count 1); a query matched to a busy instance, or left
    unmatched, waits (``Assignment(None, 1)``), so queue order is kept.

    Parameters
    ----------
    latency_ms : the profile, ``(instance_type, size) -> ms`` (None where unknown).
    size_of : a query's batch size; default 1 (``feature_size`` for the emulated model).
    coefficients : type -> coefficient; default computed from the predictor at ``ref_size``.
    rho : the noise safeguard: a pair within (1 - rho) of the QoS target counts as late.
    penalty_factor : a late pair costs this many QoS targets more (Eq. 8).
    resolution_ms : the matching's cost resolution (``solve``).
    """

    def __init__(self, latency_ms: LatencyFn | None = None, size_of: Callable[[Query], int] = unit_size,
                 coefficients: dict[str, float] | None = None, rho: float = 0.98, penalty_factor: float = 10.0,
                 predictor: LatencyPredictor | None = None, resolution_ms: float = 0.1):
        super().__init__(latency_ms, size_of, predictor)
        self.coefficients = coefficients
        self.resolution_ms = resolution_ms
        self.rho = rho
        self.penalty_factor = penalty_factor
        self._sizes: dict[int, tuple[Query, int]] = {}  # id(query) -> (query, size), the last window
        self._cols: tuple | None = None  # (worker ids, type index per worker, types)
        self._workers: Sequence[WorkerState] = ()
        self._ends: dict[int, tuple] = {}  # id(Inflight) -> (Inflight, predicted end, ms)

    def cost_matrix(self, queries: Sequence[Query], workers: Sequence[WorkerState], now: float) -> np.ndarray:
        """Eq. 8: the matrix of Eq. 2's usage times, penalised where Eq. 5 fails.

        A late pair costs the penalty plus its *real* completion time (busy + latency,
        not weighted by the coefficient): a query late on every instance then goes where
        it finishes soonest (the base type, or waits for it) rather than where the
        weighted usage is least, a slow CPU it would hold long past its QoS target.
        Any on-time pair still costs less than any late one (coefficients are <= 1).
        Built with arrays: one pass over the queries (size, times) and one over the
        workers (type column, busy time); the rest is numpy."""
        model = workers[0].model
        cols, kinds = self._columns(workers)
        self._workers = workers
        sizes, times = self._rows(queries)
        pred = self.predictor
        if pred.prior is None and any(not pred.seen.get((model, t)) for t in kinds):
            # nothing known of a type: each worker's own profile (rows), column by column
            lat = np.array([[pred.predict(model, w.instance, int(s), w) for w in workers] for s in sizes])
        else:
            lat = np.stack([pred.predict_many(model, t, sizes) for t in kinds], axis=1)[:, cols]
        busy = np.fromiter((0.0 if w.slots > len(w.inflight) else self._busy_ms(w, now) for w in workers),
                           float, len(workers))
        coef = self.coefficients or {}
        c = np.array([coef.get(t) or pred.coefficient(model, t, kinds) for t in kinds])[cols]
        qos = times[:, 1:] - times[:, :1]
        slack = self.rho * qos - (now * 1000.0 - times[:, :1])  # what a pair may take (Eq. 5)
        finish = lat
        finish += busy  # in place: one pass per step over the matrix
        late = finish > slack
        cost = finish * c
        finish += self.penalty_factor * qos
        np.copyto(cost, finish, where=late)
        return cost

    def observe(self, worker: WorkerState, size: int, service_ms: float) -> None:
        super().observe(worker, size, service_ms)
        self._ends.clear()  # predicted ends of held batches: re-predicted

    def _busy_ms(self, worker: WorkerState, now: float) -> float:
        """``busy_ms`` with each in-flight batch's predicted end remembered while it is held."""
        ends, known = [], self._ends
        for f in worker.inflight.values():
            hit = known.get(id(f))
            if hit is None or hit[0] is not f:
                held = f.held if isinstance(f.held, list) else []
                size = sum(self.size_of(q) for q in held) or f.size
                hit = known[id(f)] = (f, f.sent_at * 1000.0 + self.predictor.predict(worker.model, worker.instance,
                                                                                   size, worker))
            ends.append(hit[1])
        if len(known) > 4 * len(self._cols[1]) + 64:  # forget batches no longer held
            held = {id(f) for w in self._workers for f in w.inflight.values()}
            self._ends = {k: v for k, v in known.items() if k in held}
        return max(0.0, min(ends) - now * 1000.0) if ends else 0.0

    def _rows(self, queries: Sequence[Query]) -> tuple[np.ndarray, np.ndarray]:
        """Per query: its size, and (enqueued, deadline) in ms; sizes remembered per query
        object while it stays in the window (``size_of`` reads a feature: the slow part)."""
        known, sizes = self._sizes, np.empty(len(queries), int)
        seen: dict[int, tuple[Query, int]] = {}
        for i, q in enumerate(queries):
            hit = known.get(id(q))
            if hit is None or hit[0] is not q:
                hit = (q, self.size_of(q))
            seen[id(q)] = hit
            sizes[i] = hit[1]
        self._sizes = seen
        times = np.fromiter((t for q in queries for t in (q.enqueued, q.deadline)), float, 2 * len(queries))
        return sizes, times.reshape(len(queries), 2) * 1000.0

    def _columns(self, workers: Sequence[WorkerState]) -> tuple[np.ndarray, list[str]]:
        """Each worker's index into the sorted instance types, and those types; kept while
        the same workers come in the same order."""
        key = tuple((id(w), w.instance) for w in workers)
        if self._cols is None or self._cols[0] != key:
            types = [w.instance for w in workers]
            kinds = sorted(set(types))
            index = {t: i for i, t in enumerate(kinds)}
            self._cols = (key, np.array([index[t] for t in types]), kinds)
        return self._cols[1], self._cols[2]

    def assign(self, queue: ModelQueue, workers: Sequence[WorkerState], now: float) -> list[Assignment]:
        if queue.parity or not workers:  # parity batches: first free worker (no Kairos query)
            return [Assignment(w) for w in workers if w.free_slots > 0]
        if not any(w.free_slots > 0 for w in workers):
            return []
        queries = self.head(queue, workers)
        rows, cols = solve(self.cost_matrix(queries, workers, now), self.resolution_ms)
        plan = [Assignment(None, 1) for _ in queries]
        for i, j in zip(rows, cols):
            if workers[j].free_slots > 0:
                plan[i] = Assignment(workers[j], 1)
        while plan and plan[-1].worker is None:  # trailing waits need not be said
            plan.pop()
        return plan


def base_type(predictor: LatencyPredictor, model: str, workers: Sequence[WorkerState], ref_size: int = 1000) -> str:
    """The base type: the fastest on the largest query where latencies are known, else the
    dearest (the most cost-effective type meeting QoS is usually the most capable)."""
    types = sorted({w.instance for w in workers})
    lat = {t: predictor.predict(model, t, ref_size) for t in types}
    if all(v > 0 for v in lat.values()):
        return min(types, key=lambda t: lat[t])
    return max(workers, key=lambda w: w.price).instance


class FcfsBase(_Policy):
    """Ribbon's distribution (Kairos §6): the head of the queue goes to a free instance,
    base-type instances first, then the rest fastest first; no QoS check, no waiting."""

    def __init__(self, latency_ms: LatencyFn | None = None, size_of: Callable[[Query], int] = unit_size,
                 base: str | None = None, predictor: LatencyPredictor | None = None):
        super().__init__(latency_ms, size_of, predictor)
        self.base = base

    def assign(self, queue: ModelQueue, workers: Sequence[WorkerState], now: float) -> list[Assignment]:
        free = [w for w in workers if w.free_slots > 0]
        if not free:
            return []
        base = self.base or base_type(self.predictor, workers[0].model, workers)
        model, ref = workers[0].model, self.predictor.ref_size
        free.sort(key=lambda w: (w.instance != base, self.predictor.predict(model, w.instance, ref, w)))
        return [Assignment(w, 1) for w in free]


class DrsPolicy(_Policy):
    """DeepRecSys (Kairos §6): queries of size <= ``threshold`` go to auxiliary (non-base)
    instances, larger ones to base instances; each waits for a free instance of its class.
    The threshold is tuned by hill climbing (``bench.kairos_sim.tune_drs``)."""

    def __init__(self, threshold: int, latency_ms: LatencyFn | None = None,
                 size_of: Callable[[Query], int] = unit_size, base: str | None = None,
                 predictor: LatencyPredictor | None = None):
        super().__init__(latency_ms, size_of, predictor)
        self.threshold = threshold
        self.base = base

    def assign(self, queue: ModelQueue, workers: Sequence[WorkerState], now: float) -> list[Assignment]:
        base = self.base or base_type(self.predictor, workers[0].model, workers) if workers else None
        free_base = [w for w in workers if w.free_slots > 0 and w.instance == base]
        free_aux = [w for w in workers if w.free_slots > 0 and w.instance != base]
        has_aux = any(w.instance != base for w in workers)
        plan: list[Assignment] = []
        for q in self.head(queue, workers):
            if not free_base and not free_aux:
                break
            pool = free_aux if has_aux and self.size_of(q) <= self.threshold else free_base
            plan.append(Assignment(pool.pop(0), 1) if pool else Assignment(None, 1))
        while plan and plan[-1].worker is None:
            plan.pop()
        return plan


class ClockworkPolicy(_Policy):
    """CLKWRK (Kairos §6, after Clockwork's controller): queries in queue order, each to the
    instance predicted to finish it earliest (its free time + the query's latency); the
    instance's predicted free time then moves on, as if the query sat in its FIFO. A query
    whose instance is free now starts; the others wait and are re-planned next round."""

    def assign(self, queue: ModelQueue, workers: Sequence[WorkerState], now: float) -> list[Assignment]:
        if not any(w.free_slots > 0 for w in workers):
            return []
        model = workers[0].model
        free_at = [self.busy_ms(w, now) for w in workers]
        started = [False] * len(workers)
        plan: list[Assignment] = []
        for q in self.head(queue, workers):
            size = self.size_of(q)
            ends = [f + self.predictor.predict(model, w.instance, size, w) for f, w in zip(free_at, workers)]
            j = int(np.argmin(ends))
            now_free = free_at[j] == 0.0 and not started[j] and workers[j].free_slots > 0
            plan.append(Assignment(workers[j], 1) if now_free else Assignment(None, 1))
            started[j] = started[j] or now_free
            free_at[j] = ends[j]
        while plan and plan[-1].worker is None:
            plan.pop()
        return plan


def make_policy(name: str, **kw):
    """A policy of this module by its ``POLICIES`` name, with keyword arguments."""
    kinds = {"kairos": KairosPolicy, "fcfs_base": FcfsBase, "drs": DrsPolicy, "clockwork": ClockworkPolicy}
    if name not in kinds:
        raise ValueError(f"unknown Kairos policy {name!r}; known: {sorted(kinds)}")
    return kinds[name](**kw)


def solve_timing(shapes: Sequence[tuple[int, int]] = ((28, 14), (200, 200)), reps: int = 300,
                 seed: int = 0) -> dict[str, dict[str, float]]:
    """Time ``KairosPolicy``'s matrix build + ``linear_sum_assignment`` per (queries,
    instances) shape on a synthetic two-type pool, half the instances busy; -> ``{"QxI":
    {"p50_ms", "p99_ms"}}`` (§7 reports a 20x20 matching within 0.05 ms). A benchmark to
    print (``keel experiment kairos``), never a test's assertion."""
    import time

    from keel.common.config import BatchPolicy
    from keel.services.scheduling.batching import FixedBatch
    from keel.services.scheduling.view import Inflight

    rng = np.random.default_rng(seed)
    lat = lambda t, s: 5.0 + 0.05 * s if t == "gpu" else 0.5 * s  # noqa: E731
    out: dict[str, dict[str, float]] = {}
    for n_q, n_w in shapes:
        policy = KairosPolicy(lat, feature_size)
        workers = [WorkerState(identity=b"%d" % j, name=str(j), model="m", role="deployed", slots=1, max_batch=1,
                               batch_size=1, last_seen=0.0, instance="gpu" if j % 3 == 0 else "cpu")
                   for j in range(n_w)]
        cfg = BatchPolicy(fixed_batch=1)
        queue = ModelQueue("m", cfg, FixedBatch(cfg))
        kind = ((1,), np.dtype(np.float32))
        for i in range(n_q):
            queue.entries.append(Query(i, 1.0, "", np.array([rng.integers(1, 500)], np.float32), -0.01 * rng.random(), kind))
        for j, w in enumerate(workers[::2]):
            w.inflight[j] = Inflight([queue.entries[j % n_q]], 1, -0.001)
        queries = list(queue.entries)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            solve(policy.cost_matrix(queries, workers, 0.0), policy.resolution_ms)
            times.append((time.perf_counter() - t0) * 1000.0)
        out[f"{n_q}x{n_w}"] = {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}
    return out
