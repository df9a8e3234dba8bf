"""The dispatcher's plug-ins on their own: service profiles, batching (Clipper §4.3),
distribution policies, coding groups (ParM §4.1)."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common.config import BatchPolicy
from keel.common.ids import IdSpace, epoch_of
from keel.common.protocol import CodingTag
from keel.services.scheduling import (
    AIMD, Assignment, CodingGroups, FixedBatch, Inflight, ModelQueue, Query, RoundRobin, ServiceProfile, SingleQueue,
    WorkerState, batching_for,
)


def worker(name: str = "w", slots: int = 1, batch_size: int = 1, max_batch: int = 64, last_seen: float = 0.0) -> WorkerState:
    return WorkerState(identity=name.encode(), name=name, model="m", role="deployed", slots=slots, max_batch=max_batch,
                       batch_size=batch_size, last_seen=last_seen)


def queue(n: int = 0, policy: BatchPolicy | None = None, enqueued: float = 0.0) -> ModelQueue:
    policy = policy or BatchPolicy()
    q = ModelQueue("m", policy, batching_for(policy))
    kind = ((4,), np.dtype(np.float32))
    for i in range(n):
        q.entries.append(Query(i, 100.0, "r", np.zeros(4, np.float32), enqueued, kind))
    return q


# --------------------------------------------------------------------------- service profile


def test_profile_is_an_ewma_per_batch_size():
    p = ServiceProfile(alpha=0.5)
    assert p.estimate(4) is None
    p.observe(4, 10.0)
    p.observe(4, 20.0)
    assert p.estimate(4) == 15.0 and p.count == 2


def test_profile_interpolates_and_extrapolates_linearly():
    p = ServiceProfile()
    p.observe(2, 4.0)
    assert p.estimate(4) == 8.0  # one point: proportional to the batch size
    p.observe(10, 12.0)  # 3 ms fixed + 1 ms per query... through (2, 4) and (10, 12)
    assert p.estimate(6) == 8.0
    assert p.estimate(20) == 22.0
    assert p.estimate(1) == 3.0
    assert p.to_json() == {"2": 4.0, "10": 12.0}


def test_profile_never_extrapolates_below_zero_or_downhill():
    p = ServiceProfile()
    p.observe(2, 10.0)
    p.observe(4, 5.0)  # noise: a bigger batch measured faster
    assert p.estimate(100) == 10.0 and p.estimate(1) == 10.0


def test_a_worker_keeps_one_profile_per_configuration():
    w = worker(slots=1)
    w.profile.observe(1, 5.0)
    w.slots, w.threads = 2, 4
    assert w.profile.estimate(1) is None
    w.profile.observe(1, 9.0)
    assert set(w.profiles) == {(1, 1), (2, 4)} and w.profiles[(1, 1)].estimate(1) == 5.0


def test_expected_free_at_uses_the_profile_of_what_is_in_flight():
    w = worker(slots=2)
    assert w.expected_free_at(10.0) == 10.0
    w.profile.observe(4, 500.0)
    w.inflight[1] = Inflight([], 4, sent_at=10.0)
    assert w.expected_free_at(10.2) == 10.2  # a slot is free
    w.inflight[2] = Inflight([], 4, sent_at=10.1)
    assert w.expected_free_at(10.2) == pytest.approx(10.5)  # the earlier of the two ends
    assert w.expected_free_at(11.0) == 11.0  # overdue: now


# --------------------------------------------------------------------------- batching


def test_batching_is_fixed_when_fixed_batch_is_set_else_aimd():
    assert isinstance(batching_for(BatchPolicy(fixed_batch=3)), FixedBatch)
    assert isinstance(batching_for(BatchPolicy()), AIMD)
    assert batching_for(BatchPolicy(fixed_batch=8, max_batch=64)).start_size(4) == 4
    assert batching_for(BatchPolicy()).start_size(64) == 1


def test_aimd_adds_under_the_budget_and_backs_off_over_it():
    aimd, w = AIMD(BatchPolicy(batch_budget_ms=20.0, aimd_step=2, aimd_backoff=0.9)), worker(batch_size=10, max_batch=13)
    aimd.observe(w, 10, 5.0, True)
    assert w.batch_size == 12
    aimd.observe(w, 12, 5.0, True)
    assert w.batch_size == 13  # capped by the worker's max_batch
    aimd.observe(w, 5, 5.0, True)
    assert w.batch_size == 13  # a partial batch says nothing about a larger one
    aimd.observe(w, 13, 50.0, False)
    assert w.batch_size == 13  # nor a failed one
    aimd.observe(w, 13, 50.0, True)
    assert w.batch_size == 11


def test_fixed_batch_ignores_service_times():
    fixed, w = FixedBatch(BatchPolicy(fixed_batch=4)), worker(batch_size=4)
    fixed.observe(w, 4, 1e6, True)
    assert fixed.size(w) == 4


def test_delayed_batching_holds_a_partial_batch_until_its_oldest_query_waited_the_delay():
    q = queue(2, BatchPolicy(batch_delay_ms=100.0), enqueued=5.0)
    assert q.batching.hold_until(q, want=4, now=5.05) == pytest.approx(5.1)
    assert q.batching.hold_until(q, want=4, now=5.1) is None
    assert q.batching.hold_until(q, want=2, now=5.0) is None  # full: no wait
    nodelay = queue(1)
    assert nodelay.batching.hold_until(nodelay, want=4, now=5.0) is None


# --------------------------------------------------------------------------- distribution


def test_single_queue_serves_free_workers_longest_quiet_first():
    a, b, c = worker("a", last_seen=3.0), worker("b", last_seen=1.0), worker("c", last_seen=2.0)
    c.inflight[1] = Inflight([], 1, 0.0)
    plan = SingleQueue().assign(queue(5), [a, b, c], 10.0)
    assert plan == [Assignment(b), Assignment(a)]


def test_round_robin_takes_turns_and_skips_busy_workers():
    rr = RoundRobin()
    a, b, c = worker("a"), worker("b"), worker("c")
    q = queue(10)
    turns = []
    for _ in range(4):
        (chosen,) = rr.assign(q, [a, b, c], 0.0)
        turns.append(chosen.worker.name)
    assert turns == ["a", "b", "c", "a"]
    b.inflight[1] = Inflight([], 1, 0.0)
    assert [rr.assign(q, [a, b, c], 0.0)[0].worker.name for _ in range(3)] == ["c", "a", "c"]
    for w in (a, c):
        w.inflight[1] = Inflight([], 1, 0.0)
    assert rr.assign(q, [a, b, c], 0.0) == []


# --------------------------------------------------------------------------- coding groups


def test_coding_groups_are_k_consecutive_batches_with_ids_of_this_incarnation():
    ids = IdSpace(epoch=7)
    groups = CodingGroups(3, ids)
    tags = [groups.tag() for _ in range(7)]
    g = tags[0].group
    assert epoch_of(g) == 7
    assert tags == [CodingTag(g, 0, 3), CodingTag(g, 1, 3), CodingTag(g, 2, 3), CodingTag(g + 1, 0, 3),
                    CodingTag(g + 1, 1, 3), CodingTag(g + 1, 2, 3), CodingTag(g + 2, 0, 3)]


def test_coded_models_share_one_id_space_so_group_ids_never_repeat():
    ids = IdSpace(epoch=7)
    m, n = CodingGroups(2, ids), CodingGroups(2, ids)
    assert m.tag().group != n.tag().group
