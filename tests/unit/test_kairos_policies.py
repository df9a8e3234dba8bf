"""Kairos §5.1 query distribution and the §6 baselines, on the dispatcher's view objects."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common.config import BatchPolicy
from keel.services.scheduling.batching import FixedBatch
from keel.services.scheduling.distribution import policy_class
from keel.services.scheduling.kairos import (
    ClockworkPolicy, DrsPolicy, FcfsBase, KairosPolicy, LatencyPredictor, feature_size, make_policy, solve,
    solve_timing,
)
from keel.services.scheduling.view import Inflight, ModelQueue, Query, WorkerState

KIND = ((1,), np.dtype(np.float32))


def latency(instance: str, size: int) -> float:
    """A fast GPU (fixed cost, small per item) and a slow, cheap CPU (larger per item)."""
    return 8.0 + 0.05 * size if instance == "gpu" else 0.5 * size


def worker(name: str, instance: str) -> WorkerState:
    return WorkerState(identity=name.encode(), name=name, model="m", role="deployed", slots=1, max_batch=1,
                       batch_size=1, last_seen=0.0, instance=instance)


def make_queue(sizes, enqueued: float = 0.0, qos_ms: float = 100.0) -> ModelQueue:
    cfg = BatchPolicy(fixed_batch=1)
    q = ModelQueue("m", cfg, FixedBatch(cfg))
    for i, s in enumerate(sizes):
        q.entries.append(Query(i, enqueued + qos_ms / 1000.0, "", np.array([s], np.float32), enqueued, KIND))
    return q


def busy(w: WorkerState, size: int, sent_at: float = 0.0) -> WorkerState:
    w.inflight[len(w.inflight) + 1] = Inflight([make_queue([size]).entries[0]], 1, sent_at)
    return w


def chunks(plan, queue):
    """Which query each assignment takes, as the dispatcher takes them: qid -> worker name."""
    out, i = {}, 0
    for a in plan:
        if a.worker is not None and a.worker.free_slots <= 0:
            continue  # the dispatcher skips it and takes nothing
        for _ in range(a.count or 1):
            out[queue.entries[i].qid] = a.worker.name if a.worker else None
            i += 1
    return out


def test_kairos_puts_large_queries_on_the_gpu_and_small_on_the_cpu():
    p = KairosPolicy(latency, feature_size)
    for sizes in ([4, 600], [600, 4]):
        q = make_queue(sizes, qos_ms=1000.0)  # no QoS pressure: Eq. 2's weighted usage decides
        taken = chunks(p.assign(q, [worker("c", "cpu"), worker("g", "gpu")], 0.0), q)
        assert {q.entries[i].input[0]: w for i, w in taken.items()} == {600: "g", 4: "c"}
    assert all(a.count == 1 for a in p.assign(q, [worker("c", "cpu"), worker("g", "gpu")], 0.0))


def test_kairos_with_more_queries_than_instances_starts_the_cheapest_set():
    # Eq. 2 with Eq. 7 (every instance matched): the two small queries cost least in all,
    # so the large ones wait for the next round, though they are ahead in the queue
    q = make_queue([4, 600, 10, 300])
    taken = chunks(KairosPolicy(latency, feature_size).assign(q, [worker("c", "cpu"), worker("g", "gpu")], 0.0), q)
    assert {i: w for i, w in taken.items() if w} == {0: "c", 2: "g"} and taken[1] is None


def test_kairos_never_starts_a_query_on_a_busy_instance_and_keeps_queue_order():
    q = make_queue([500, 5, 400, 3])
    gpu, cpu = busy(worker("g", "gpu"), 500, sent_at=0.0), worker("c", "cpu")
    p = KairosPolicy(latency, feature_size)
    plan = p.assign(q, [gpu, cpu], 0.001)
    assert all(a.worker is None or a.worker.free_slots > 0 for a in plan)
    taken = chunks(plan, q)
    assert [v for v in taken.values() if v] == ["c"]
    assert q.entries[[k for k, v in taken.items() if v][0]].input[0] < 10  # the CPU gets a small one
    assert taken[0] is None  # the large head waits for the busy GPU rather than the CPU
    assert not p.assign(make_queue([5]), [busy(worker("x", "gpu"), 5)], 0.0)  # nothing free: no plan


def test_kairos_penalises_pairs_that_would_miss_qos():
    p = KairosPolicy(latency, feature_size)
    q = make_queue([150], qos_ms=50.0)  # the CPU takes 75 ms: over QoS; the GPU 15.5 ms
    cost = p.cost_matrix(list(q.entries), [worker("c", "cpu"), worker("g", "gpu")], 0.0)
    assert cost[0, 0] > 10 * 50.0 > cost[0, 1]
    taken = chunks(p.assign(q, [worker("c", "cpu"), worker("g", "gpu")], 0.0), q)
    assert taken == {0: "g"}


def test_kairos_window_is_twice_the_instances():
    q = make_queue([5] * 50)
    workers = [worker("g", "gpu"), worker("c", "cpu"), worker("d", "cpu")]
    plan = KairosPolicy(latency, feature_size).assign(q, workers, 0.0)
    assert sum(a.count for a in plan) <= 6 and sum(a.worker is not None for a in plan) == 3


def test_coefficient_is_base_latency_over_type_latency_on_the_largest_query():
    pred = LatencyPredictor(latency, ref_size=1000)
    assert pred.coefficient("m", "gpu", ["gpu", "cpu"]) == 1.0
    assert pred.coefficient("m", "cpu", ["gpu", "cpu"]) == pytest.approx(58.0 / 500.0)


def test_predictor_learns_from_observed_service_times():
    pred = LatencyPredictor(latency)
    pred.observe("m", "cpu", 10, 10.0)  # twice the profile's 5 ms
    assert pred.predict("m", "cpu", 10) == 10.0
    assert pred.predict("m", "cpu", 20) == pytest.approx(20.0)  # the profile's shape, the measured level
    blind = LatencyPredictor()
    blind.observe("m", "cpu", 10, 5.0)
    blind.observe("m", "cpu", 30, 15.0)
    assert blind.predict("m", "cpu", 20) == pytest.approx(10.0)  # a line through what was seen
    p = KairosPolicy(latency, feature_size)
    p.observe(worker("c", "cpu"), 10, 10.0)
    assert p.predictor.predict("m", "cpu", 10) == 10.0


def test_kairos_with_defaults_uses_each_workers_measured_profile():
    slow, fast = worker("s", "cpu"), worker("f", "gpu")
    slow.profile.observe(1, 50.0)
    fast.profile.observe(1, 5.0)
    q = make_queue([1], qos_ms=30.0)
    assert chunks(policy_class("kairos")().assign(q, [slow, fast], 0.0), q) == {0: "f"}


def test_fcfs_base_prefers_the_base_type_whatever_the_size():
    q = make_queue([3, 900])
    plan = FcfsBase(latency, feature_size).assign(q, [worker("c", "cpu"), worker("g", "gpu")], 0.0)
    assert chunks(plan, q) == {0: "g", 1: "c"}


def test_drs_splits_by_threshold_and_waits_for_its_class():
    q = make_queue([600, 5, 700, 8])
    p = DrsPolicy(50, latency, feature_size)
    assert chunks(p.assign(q, [worker("c", "cpu"), worker("g", "gpu")], 0.0), q) == {0: "g", 1: "c"}
    taken = chunks(p.assign(q, [worker("c", "cpu"), busy(worker("g", "gpu"), 5)], 0.0), q)
    assert taken == {0: None, 1: "c"}  # the large head waits for the base type


def test_clockwork_sends_each_query_where_it_finishes_first():
    q = make_queue([600, 5])
    p = ClockworkPolicy(latency, feature_size)
    assert chunks(p.assign(q, [worker("c", "cpu"), worker("g", "gpu")], 0.0), q) == {0: "g", 1: "c"}
    # the GPU is busy for ~38 ms more; 600 items still finish there first (38 + 38 < 300)
    gpu = busy(worker("g", "gpu"), 600, sent_at=0.0)
    taken = chunks(p.assign(q, [worker("c", "cpu"), gpu], 0.0), q)
    assert taken == {0: None, 1: "c"}


def test_registered_policies_build_with_defaults_and_make_policy_builds_drs():
    for name in ("kairos", "fcfs_base", "clockwork"):
        assert policy_class(name)().assign(make_queue([1]), [worker("g", "gpu")], 0.0)[0].worker.name == "g"
    assert make_policy("drs", threshold=10).threshold == 10
    with pytest.raises(ValueError):
        make_policy("nope")


def test_solve_is_the_optimal_assignment():
    rng = np.random.default_rng(1)
    from scipy.optimize import linear_sum_assignment
    for shape in ((6, 6), (8, 4), (4, 8)):
        c = np.round(rng.random(shape) * 100, 1)
        r, k = solve(c, resolution_ms=0.1)
        r0, k0 = linear_sum_assignment(c)
        assert c[r, k].sum() == pytest.approx(c[r0, k0].sum())


def test_solve_timing_reports_p99s(capsys):
    timing = solve_timing(reps=50)
    with capsys.disabled():
        print("\nKairos matrix build + solve:", {k: f"p99 {v['p99_ms']:.3f} ms" for k, v in timing.items()})
    assert set(timing) == {"28x14", "200x200"} and all(v["p99_ms"] >= v["p50_ms"] > 0 for v in timing.values())


def test_kairos_sends_a_query_late_everywhere_where_it_finishes_soonest():
    # 100 items: GPU 13 ms, CPU 50 ms; the query has already waited past its 10 ms QoS, so
    # both pairs are late. Weighted usage would pick the CPU (0.116 x 50 < 13), holding it
    # 50 ms for a query that misses QoS anyway; penalty + real time picks the GPU
    p = KairosPolicy(latency, feature_size)
    q = make_queue([100], qos_ms=10.0)
    cost = p.cost_matrix(list(q.entries), [worker("c", "cpu"), worker("g", "gpu")], 0.02)
    assert (cost > 10 * 10.0).all() and cost[0, 1] < cost[0, 0]
    assert chunks(p.assign(q, [worker("c", "cpu"), worker("g", "gpu")], 0.02), q) == {0: "g"}
    # the GPU busy for 20 ms more (finish 33 ms) still beats the free CPU (50 ms): it waits
    gpu = busy(worker("g", "gpu"), 400, sent_at=0.0)  # 28 ms, sent at 0: 8 ms left at 20 ms
    assert not [a for a in p.assign(q, [worker("c", "cpu"), gpu], 0.02) if a.worker is not None]


def test_kairos_on_time_pairs_cost_less_than_late_ones():
    p = KairosPolicy(latency, feature_size)
    q = make_queue([100, 100], qos_ms=40.0)  # the GPU on time (13 ms), the CPU late (50 ms)
    q.entries[1].enqueued = q.entries[1].deadline = 0.0  # a zero budget: late everywhere
    q.entries[1].deadline = 0.005
    cost = p.cost_matrix(list(q.entries), [worker("c", "cpu"), worker("g", "gpu")], 0.0)
    assert cost[0, 1] < cost[1, 1] and cost[0, 1] < cost[0, 0]


def test_predictor_learns_a_fixed_overhead_as_an_offset_not_a_ratio():
    # a live instance: the profile + 3 ms on every query (transport, the sleep's wake-up)
    pred = LatencyPredictor(latency)
    for size in (10, 400, 10, 400):
        pred.observe("m", "cpu", size, latency("cpu", size) + 3.0)
    assert pred.predict("m", "cpu", 800) == pytest.approx(403.0)  # not 800 x 0.5 x the small ones' 1.6
    assert pred.predict_many("m", "cpu", np.array([800, 10, 100])).tolist() == pytest.approx([403.0, 8.0, 53.0])
    assert pred.predict("m", "gpu", 800) == latency("gpu", 800)  # another type: the profile as is
