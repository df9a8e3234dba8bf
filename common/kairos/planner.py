"""Kairos's pool planner (§5.2): a throughput upper bound per pool, no online trials.

Reading of §5.2 (the extracted text lost the symbols; the prose fixes each quantity).
For one model, a batch-size mix and a pool of ``n_b`` base instances and ``n_j`` of each
auxiliary type j:

- ``v`` (vio_batch of an auxiliary type): the smallest measured batch size whose service
  time exceeds QoS on that type (the artifact's name: the first *violating* batch; queries
  below it are the type's QoS-respecting region). With several auxiliary types present
  (Eq. 14) every one is assumed to share the region of the type with the largest ``v``
  ("the type with maximum size and fraction"), which makes the bound optimistic.
- ``r`` (small_ratio): the fraction of queries with batch < v.
- ``t`` (time_ratio): the share of base-type time spent on those small queries.
- ``Q_b``: base standalone throughput on the whole mix, times ``n_b`` (Eq. 12-13).
- ``Q_A``: sum over auxiliary types of ``n_j`` times the type's throughput on queries below
  ``v`` (Eq. 14; ``all_batch`` in allocator_profile.json).
- ``Q_b'``: base throughput on the large queries alone, ``Q_b (1 - r) / (1 - t)``.

Base is the bottleneck (Eq. 9) when the large queries the busy auxiliaries leave,
``Q_A (1 - r) / r``, exceed ``Q_b'``: then ``UB = Q_b' / (1 - r) = Q_b / (1 - t)``.
Otherwise the auxiliaries are (Eq. 10-11): ``UB = Q_A / r + Q_b * slack`` with
``slack = 1 - Q_A (1 - r) / (r Q_b')``, which simplifies to ``Q_b + t Q_A / r``. The two
cases are exactly ``UB = min(Q_b / (1 - t), Q_b + t Q_A / r)`` (Eq. 15 as read here). A pool
without a base instance has UB 0: no other type meets QoS for every batch size (§7).

The pick without online trials (§5.2, last paragraph): if the top-3 pools by UB have the same
base count, the top one; else, of the top 10, the pool whose summed squared Euclidean
distance (count vectors) to the other nine is least. Kairos+ (Algorithm 1) evaluates pools
in UB order, skipping any whose UB cannot beat the best measured throughput and any
sub-configuration (every count <=) of an evaluated pool.

Usage::

    plan = plan_pools(Profiles.load(), "rm2", budget=2.5)
    plan.pick.counts, plan.ranked[0].upper_bound
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from keel.common.kairos.profiles import BASE_TYPE, QOS_MS, Profiles, batch_size_pmf


@dataclass(frozen=True)
class TypeProfile:
    """A type's figures on the mix (allocator_profile.json's fields, derived)."""
    qps: float                       # standalone (base) or on its QoS region (auxiliary)
    vio_batch: int | None = None     # first batch size over QoS; None for the base type
    small_ratio: float | None = None
    time_ratio: float | None = None


def derive(prof: Profiles, model: str, qos_ms: float | None = None, pmf: np.ndarray | None = None,
           base: str = BASE_TYPE) -> tuple[dict[str, TypeProfile], Callable[[str, int], float]]:
    """Re-derive allocator_profile.json for ``model`` from the latencies and the mix.

    Returns the per-type figures and ``qps_below(type, v)``: a type's throughput on the
    queries of batch < v (the ``all_batch`` entries)."""
    qos = QOS_MS[model] if qos_ms is None else qos_ms
    pmf = batch_size_pmf() if pmf is None else pmf
    sizes = np.arange(1, len(pmf) + 1)
    lat = {t: prof.latency_ms(t, model, sizes) for t in prof.search_types}
    base_ms = pmf @ lat[base]

    def qps_below(type_: str, v: int) -> float:
        small = sizes < v
        r = pmf[small].sum()
        return 1000.0 * r / (pmf[small] @ lat[type_][small]) if r > 0 else 0.0

    out = {base: TypeProfile(qps=1000.0 / base_ms)}
    for t in prof.search_types:
        if t == base:
            continue
        measured = prof.latency_ms(t, model, prof.batches)
        over = prof.batches[measured > qos]
        v = int(over[0]) if len(over) else int(prof.batches[-1]) + 1
        small = sizes < v
        out[t] = TypeProfile(qps=qps_below(t, v), vio_batch=v, small_ratio=float(pmf[small].sum()),
                             time_ratio=float(pmf[small] @ lat[base][small] / base_ms))
    return out, qps_below


@dataclass(frozen=True)
class Pool:
    counts: tuple[int, ...]          # per type, in ``Plan.types`` order (base first)
    cost: float                      # $/h
    upper_bound: float               # qps (Eq. 15)


@dataclass
class Plan:
    model: str
    budget: float
    types: list[str]
    ranked: list[Pool]               # every pool within budget, highest UB first
    pick: Pool                       # Kairos's choice without online trials
    pick_rule: str                   # "top-3 agree on base count" or "similarity"
    argmax: Pool
    homogeneous: Pool                # best single-type pool within budget
    plan_ms: float = 0.0
    kairos_plus: dict = field(default_factory=dict)

    def to_json(self, top: int = 10) -> dict:
        def pool(p: Pool) -> dict:
            return {"counts": dict(zip(self.types, p.counts)), "cost": round(p.cost, 4),
                    "upper_bound": round(p.upper_bound, 3)}
        return {"model": self.model, "budget": self.budget, "types": self.types,
                "pools": len(self.ranked), "plan_ms": round(self.plan_ms, 3),
                "top": [pool(p) for p in self.ranked[:top]], "pick": pool(self.pick),
                "pick_rule": self.pick_rule, "argmax": pool(self.argmax),
                "homogeneous": pool(self.homogeneous), "kairos_plus": self.kairos_plus}


def enumerate_pools(prices: list[float], max_counts: list[int], budget: float) -> np.ndarray:
    """Every count vector (0..max per type, not all zero) whose cost is within budget."""
    grids = np.indices([m + 1 for m in max_counts]).reshape(len(max_counts), -1).T  # itertools.product's order
    cost = grids @ np.asarray(prices, float)
    keep = (cost <= budget + 1e-9) & (grids.sum(axis=1) > 0)
    return grids[keep]


def upper_bounds(counts: np.ndarray, figures: dict[str, TypeProfile], qps_below: Callable[[str, int], float],
                 types: list[str]) -> np.ndarray:
    """Eq. 12-15 for every pool (rows of ``counts``, columns in ``types`` order, base first)."""
    counts = np.asarray(counts)
    aux = types[1:]
    q_b = counts[:, 0] * figures[types[0]].qps
    # the pool's region: the largest vio_batch among the auxiliary types present (Eq. 14)
    vios = np.array([figures[t].vio_batch for t in aux])
    present = counts[:, 1:] > 0
    region = np.where(present, vios, 0).max(axis=1) if aux else np.zeros(len(counts), int)
    ub = q_b.astype(float).copy()
    for v in np.unique(region[region > 0]):
        rows = region == v
        owner = aux[int(np.argmax(vios == v))]
        r, t = figures[owner].small_ratio, figures[owner].time_ratio
        q_a = counts[rows][:, 1:] @ np.array([qps_below(a, int(v)) for a in aux])
        ub[rows] = np.minimum(q_b[rows] / (1.0 - t), q_b[rows] + t * q_a / r)
    return ub


def pick_without_trials(ranked: list[Pool]) -> tuple[Pool, str]:
    """§5.2: top-3 agree on the base count -> the top pool; else the similarity rule."""
    top3 = ranked[:3]
    if len({p.counts[0] for p in top3}) == 1:
        return ranked[0], "top-3 agree on base count"
    top = ranked[:10]
    x = np.array([p.counts for p in top], float)
    dist = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=2).sum(axis=1)
    return top[int(np.argmin(dist))], "similarity"


def kairos_plus(ranked: list[Pool], evaluate: Callable[[Pool], float]) -> dict:
    """Algorithm 1: evaluate pools in upper-bound order; prune by UB and sub-configuration.

    ``evaluate(pool) -> qps`` is an online trial (or a simulation). Returns the best pool,
    its measured throughput and how many pools were evaluated."""
    best, best_qps, evaluated, done = None, -1.0, 0, []
    for p in ranked:
        if p.upper_bound <= best_qps:
            break                     # ranked: no later pool can beat the best either
        c = np.array(p.counts)
        if any((c <= d).all() for d in done):
            continue                  # a sub-configuration of an evaluated pool
        qps = float(evaluate(p))
        evaluated += 1
        done.append(c)
        if qps > best_qps:
            best, best_qps = p, qps
    return {"best": best, "qps": best_qps, "evaluated": evaluated, "space": len(ranked)}


def plan_pools(prof: Profiles, model: str, budget: float | None = None, qos_ms: float | None = None,
               evaluate: Callable[[Pool], float] | None = None) -> Plan:
    """Rank every pool of the search space (instance.json) within ``budget`` by Eq. 15."""
    import time

    start = time.perf_counter()
    budget = prof.budget if budget is None else budget
    types = prof.search_types
    prices = [prof.price(t) for t in types]
    figures, qps_below = derive(prof, model, qos_ms)
    counts = enumerate_pools(prices, prof.max_counts, budget)
    if len(counts) == 0:
        raise ValueError(f"no pool fits a budget of ${budget}/h")
    ub = upper_bounds(counts, figures, qps_below, types)
    cost = counts @ np.asarray(prices)
    order = np.lexsort((cost, -ub))   # highest bound first, cheaper first on ties
    ranked = [Pool(tuple(c), k, u) for c, k, u in zip(counts[order].tolist(), cost[order].tolist(), ub[order].tolist())]
    pick, rule = pick_without_trials(ranked)
    single = ((counts[order] > 0).sum(axis=1) == 1).nonzero()[0]
    homogeneous = [ranked[i] for i in single]
    plan = Plan(model, budget, types, ranked, pick, rule, ranked[0], homogeneous[0])
    plan.plan_ms = (time.perf_counter() - start) * 1000.0
    if evaluate is not None:
        plan.kairos_plus = kairos_plus(ranked, evaluate)
    return plan
