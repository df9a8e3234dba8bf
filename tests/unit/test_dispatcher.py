"""A real Dispatcher, stepped with ``tick``, talked to over real sockets: the test plays the
frontend (PUSH of Queries), the workers (DEALERs that register, heartbeat and send Done)
and the encoder (a PULL for batch copies)."""
from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import BatchPolicy, ConfigError, DispatcherConfig
from keel.common.ids import IdSpace
from keel.common.protocol import (
    Answered, Batch, CodingTag, Configure, Done, Heartbeat, Leave, MemberBatch, ParityMembers, Queries, Register, ModelRole,
)
from keel.services.dispatcher import Dispatcher
from keel.services.scheduling import POLICIES, Assignment

ANY_PORT = "tcp://127.0.0.1:*"
REPLY_TO = "tcp://127.0.0.1:1"  # never connected to: the dispatcher only passes it on


class Harness:
    """The dispatcher plus the sockets the test plays its peers with."""

    def __init__(self, dispatcher: Dispatcher, zsock):
        self.d = dispatcher
        self.zsock = zsock
        self.query_endpoint = transport.endpoint_of(dispatcher.pull)
        self.worker_endpoint = transport.endpoint_of(dispatcher.router)
        self.frontend = zsock(zmq.PUSH, connect=self.query_endpoint)
        self.next_qid = 1

    # -- the frontend
    def send_queries(self, model: str, n: int, deadline_s: float = 60.0, dim: int = 4, dtype=np.float32) -> list[int]:
        qids = list(range(self.next_qid, self.next_qid + n))
        self.next_qid += n
        inputs = np.array([[q] * dim for q in qids], dtype)
        transport.send(self.frontend, Queries(model=model, qids=qids, budgets_ms=[deadline_s * 1000.0] * n,
                                              reply_to=REPLY_TO, inputs=inputs))
        return qids

    # -- a worker
    def worker(self, name: str, model: str = "m", slots: int = 1, max_batch: int = 64, role: str = ModelRole.DEPLOYED,
               **declared) -> zmq.Socket:
        sock = self.zsock(zmq.DEALER, connect=self.worker_endpoint, identity=name.encode())
        transport.send(sock, Register(worker=name, model=model, role=role, slots=slots, max_batch=max_batch, **declared))
        self.pump(lambda: name.encode() in self.d.workers, what=f"{name} registered")
        return sock

    def done(self, sock: zmq.Socket, batch: Batch, service_ms: float, ok: bool = True) -> None:
        name = sock.getsockopt(zmq.IDENTITY).decode()
        transport.send(sock, Done(worker=name, batch_id=batch.batch_id, batch_size=len(batch.qids), service_ms=service_ms, ok=ok))
        self.pump(lambda: batch.batch_id not in self.d.workers[name.encode()].inflight, what="Done processed")

    def state(self, name: str):
        return self.d.workers[name.encode()]

    # -- driving
    def pump(self, condition, timeout_s: float = 3.0, what: str = "condition", also=None):
        """tick(0.01) until ``condition()`` is truthy; ``also()`` runs every round (heartbeats)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s} s")
            if also is not None:
                also()
            self.d.tick(0.01)

    def batches(self, sock: zmq.Socket) -> list[Batch]:
        """Batches waiting on a test socket now (heartbeats skipped)."""
        out = []
        while sock.poll(0):
            msg = protocol.decode(sock.recv_multipart(copy=False))
            if isinstance(msg, Batch):
                out.append(msg)
        return out

    def next_batch(self, sock: zmq.Socket, what: str = "a batch", also=None) -> Batch:
        got: list[Batch] = []
        self.pump(lambda: got.extend(self.batches(sock)) or got, what=what, also=also)
        assert len(got) == 1, f"expected one batch, got {len(got)}"
        return got[0]

    def settle(self, rounds: int = 10) -> None:
        """A few ticks so that anything the dispatcher would send now has been sent."""
        for _ in range(rounds):
            self.d.tick(0.005)


@pytest.fixture
def harness(zsock):
    made = []

    def make(models: dict[str, BatchPolicy], **options) -> Harness:
        options.setdefault("heartbeat_interval_s", 30.0)  # no heartbeat chores unless a test wants them
        cfg = DispatcherConfig(name="dispatcher", query_endpoint=ANY_PORT, worker_endpoint=ANY_PORT, models=models, **options)
        cfg.validate()
        dispatcher = Dispatcher(cfg)
        made.append(dispatcher)
        return Harness(dispatcher, zsock)

    yield make
    for dispatcher in made:
        dispatcher.shutdown()


def qids_of(batches: list[Batch]) -> list[int]:
    return [q for b in batches for q in b.qids]


# --------------------------------------------------------------------------- credits


def test_batch_only_for_a_free_slot(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)})
    w = h.worker("w0", slots=1)
    sent = h.send_queries("m", 6)
    first = h.next_batch(w)
    assert first.qids == sent[:2]
    np.testing.assert_array_equal(first.inputs, np.array([[q] * 4 for q in sent[:2]], np.float32))
    assert first.reply_to == [REPLY_TO] * 2 and first.model == "m" and first.group is None
    h.send_queries("m", 2)  # more queries: still no slot
    h.settle()
    assert h.batches(w) == []
    assert h.d.status()["queues"]["m"] == 6
    h.done(w, first, 1.0)
    assert h.next_batch(w).qids == sent[2:4]


def test_every_slot_is_used_and_never_more(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    w = h.worker("w0", slots=3)
    sent = h.send_queries("m", 5)
    got: list[Batch] = []
    h.pump(lambda: got.extend(h.batches(w)) or len(got) >= 3, what="three batches for three slots")
    h.settle()
    got.extend(h.batches(w))
    assert qids_of(got) == sent[:3]
    assert h.state("w0").free_slots == 0
    h.done(w, got[1], 1.0)
    assert h.next_batch(w).qids == [sent[3]]


def test_workers_of_another_model_get_nothing(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1), "other": BatchPolicy(fixed_batch=1)})
    w_other = h.worker("w-other", model="other")
    w = h.worker("w-m", model="m")
    sent = h.send_queries("m", 1)
    assert h.next_batch(w).qids == sent
    h.settle()
    assert h.batches(w_other) == []


# --------------------------------------------------------------------------- AIMD


def test_aimd_grows_on_full_batches_and_backs_off_over_slo(harness):
    h = harness({"m": BatchPolicy(batch_budget_ms=20.0, aimd_step=2, aimd_backoff=0.9, max_batch=64)})
    w = h.worker("w0")
    h.send_queries("m", 200)
    sizes, batch = [], h.next_batch(w)
    for service_ms in (5.0, 5.0, 5.0, 5.0, 50.0, 50.0, 5.0):
        sizes.append(len(batch.qids))
        h.done(w, batch, service_ms)
        batch = h.next_batch(w)
    sizes.append(len(batch.qids))
    # +2 per full batch under the SLO; floor(0.9 x) over it: 9 -> 8 -> 7; then +2 again
    assert sizes == [1, 3, 5, 7, 9, 8, 7, 9]
    assert h.state("w0").batch_size == 9


def test_aimd_backs_off_no_lower_than_one(harness):
    h = harness({"m": BatchPolicy(batch_budget_ms=20.0)})
    w = h.worker("w0")
    h.send_queries("m", 5)
    for _ in range(3):
        batch = h.next_batch(w)
        assert len(batch.qids) == 1
        h.done(w, batch, 500.0)
        assert h.state("w0").batch_size == 1


def test_aimd_ignores_partial_batches_and_failures(harness):
    h = harness({"m": BatchPolicy(batch_budget_ms=20.0, aimd_step=4)})
    w = h.worker("w0")
    h.send_queries("m", 1)
    h.done(w, h.next_batch(w), 1.0)
    assert h.state("w0").batch_size == 5
    h.send_queries("m", 2)  # a batch of 2 < 5 under the SLO says nothing about size 9
    h.done(w, h.next_batch(w), 1.0)
    assert h.state("w0").batch_size == 5
    h.send_queries("m", 5)
    h.done(w, h.next_batch(w), 1.0, ok=False)  # a failed batch neither
    assert h.state("w0").batch_size == 5


def test_aimd_is_capped_by_max_batch_of_policy_and_worker(harness):
    h = harness({"m": BatchPolicy(batch_budget_ms=20.0, aimd_step=8, max_batch=16)})
    w = h.worker("w0", max_batch=10)
    h.send_queries("m", 100)
    for _ in range(4):
        h.done(w, h.next_batch(w), 1.0)
    assert h.state("w0").batch_size == 10
    assert len(h.next_batch(w).qids) == 10


def test_fixed_batch_disables_aimd(harness):
    h = harness({"m": BatchPolicy(batch_budget_ms=20.0, fixed_batch=4)})
    w = h.worker("w0")
    h.send_queries("m", 20)
    for service_ms in (1.0, 1.0, 500.0, 1.0):
        batch = h.next_batch(w)
        assert len(batch.qids) == 4
        h.done(w, batch, service_ms)
        assert h.state("w0").batch_size == 4


# --------------------------------------------------------------------------- delayed batching


def test_delayed_batching_waits_for_a_fuller_batch(harness):
    delay_s = 5.0  # far longer than this test runs: a partial batch must not leave at all
    h = harness({"m": BatchPolicy(fixed_batch=4, batch_delay_ms=delay_s * 1000)})
    w = h.worker("w0")
    first = h.send_queries("m", 1)
    h.pump(lambda: h.d.status()["queues"]["m"] == 1, what="the query queued")
    h.settle()
    assert h.batches(w) == [], "a partial batch left before batch_delay_ms"
    assert h.d.wake_at is not None  # it will look again when the delay is up
    more = h.send_queries("m", 3)
    batch = h.next_batch(w, what="the full batch, before the delay is up")
    assert batch.qids == first + more


def test_delayed_batching_sends_a_partial_batch_after_the_delay(harness):
    delay_s = 0.15
    h = harness({"m": BatchPolicy(fixed_batch=4, batch_delay_ms=delay_s * 1000)})
    w = h.worker("w0")
    sent_at = time.time()
    sent = h.send_queries("m", 2)
    batch = h.next_batch(w, what="the partial batch after the delay")
    assert time.time() - sent_at >= delay_s
    assert batch.qids == sent


def test_no_delay_sends_partial_batches_at_once(harness):
    h = harness({"m": BatchPolicy(fixed_batch=4, batch_delay_ms=0)})
    w = h.worker("w0")
    sent = h.send_queries("m", 1)
    assert h.next_batch(w).qids == sent


# --------------------------------------------------------------------------- deadlines


def test_expired_queries_are_never_dispatched(harness):
    h = harness({"m": BatchPolicy(fixed_batch=8)})
    w = h.worker("w0")
    expired = h.send_queries("m", 3, deadline_s=-1.0)
    live = h.send_queries("m", 2)
    late = h.send_queries("m", 2, deadline_s=-0.5)
    batch = h.next_batch(w)
    assert batch.qids == live
    assert not set(batch.qids) & set(expired + late)
    h.pump(lambda: h.d.expired == 5, what="5 expired queries counted")


def test_budgets_count_from_when_the_frontend_sent_them(harness):
    """Queries that waited in the dispatcher's socket buffer (it was frozen) past their
    budget are dropped at receipt and counted expired; the rest keep what is left."""
    h = harness({"m": BatchPolicy(fixed_batch=8)})
    w = h.worker("w0")
    x = np.ones((2, 4), np.float32)
    transport.send(h.frontend, Queries(model="m", qids=[701, 702], budgets_ms=[2_000.0, 2_000.0], reply_to=REPLY_TO,
                                       inputs=x, sent_at=time.time() - 3.0))
    transport.send(h.frontend, Queries(model="m", qids=[703], budgets_ms=[10_000.0], reply_to=REPLY_TO,
                                       inputs=x[:1], sent_at=time.time() - 3.0))
    batch = h.next_batch(w)
    assert batch.qids == [703] and 5_000 < batch.budgets_ms[0] <= 7_000
    assert batch.sent_at is not None and abs(batch.sent_at - time.time()) < 5
    h.pump(lambda: h.d.expired == 2, what="2 expired queries counted")


def test_a_queue_of_only_expired_queries_dispatches_nothing(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)})
    w = h.worker("w0")
    h.send_queries("m", 4, deadline_s=-1.0)
    h.pump(lambda: h.d.expired == 4, what="expired counted")
    h.settle()
    assert h.batches(w) == []
    assert h.state("w0").free_slots == 1  # the slot was not spent on nothing
    live = h.send_queries("m", 1)
    assert h.next_batch(w).qids == live


# --------------------------------------------------------------------------- liveness


def beats(sock: zmq.Socket):
    name = sock.getsockopt(zmq.IDENTITY).decode()
    return lambda: transport.send(sock, Heartbeat(sender=name))


def test_silent_worker_is_dropped_and_its_queries_go_to_another(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)}, heartbeat_interval_s=0.05, heartbeat_liveness=3)
    silent = h.worker("silent")
    sent = h.send_queries("m", 2)
    held = h.next_batch(silent, also=beats(silent))  # from here on it says nothing
    assert held.qids == sent
    alive = h.worker("alive")
    rescued = h.next_batch(alive, what="the silent worker's batch, re-dispatched", also=beats(alive))
    assert b"silent" not in h.d.workers and b"alive" in h.d.workers
    assert rescued.qids == held.qids
    np.testing.assert_array_equal(rescued.inputs, held.inputs)
    assert rescued.batch_id != held.batch_id
    assert h.d.requeued == 2


def test_requeued_queries_go_first(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)}, heartbeat_interval_s=0.05, heartbeat_liveness=3)
    silent = h.worker("silent")
    h.send_queries("m", 2)
    held = h.next_batch(silent, also=beats(silent))  # and then it says nothing
    alive = h.worker("alive")
    h.send_queries("m", 2)
    busy = h.next_batch(alive, also=beats(alive))
    later = h.send_queries("m", 2)  # both workers are busy: these wait in the queue
    h.pump(lambda: b"silent" not in h.d.workers, what="the silent worker dropped", also=beats(alive))
    assert h.d.status()["queues"]["m"] == 4
    transport.send(alive, Done(worker="alive", batch_id=busy.batch_id, batch_size=2, service_ms=1.0))
    rescued = h.next_batch(alive, also=beats(alive))
    assert rescued.qids == held.qids, "re-queued queries did not go back to the head of the queue"
    transport.send(alive, Done(worker="alive", batch_id=rescued.batch_id, batch_size=2, service_ms=1.0))
    assert h.next_batch(alive, also=beats(alive)).qids == later


def test_heartbeating_worker_is_kept(harness):
    h = harness({"m": BatchPolicy()}, heartbeat_interval_s=0.05, heartbeat_liveness=2)
    w = h.worker("w0")
    beat = lambda: transport.send(w, Heartbeat(sender="w0"))  # noqa: E731
    replies = []

    def heartbeats_back():
        while w.poll(0):
            replies.append(protocol.decode(w.recv_multipart()))
        return len(replies) >= 5

    h.pump(heartbeats_back, what="five heartbeats from the dispatcher", also=beat)
    assert b"w0" in h.d.workers
    assert all(isinstance(r, Heartbeat) and r.known for r in replies)


def test_unknown_worker_is_told_to_register(harness):
    h = harness({"m": BatchPolicy()})
    stranger = h.zsock(zmq.DEALER, connect=h.worker_endpoint, identity=b"stranger")
    transport.send(stranger, Heartbeat(sender="stranger"))
    h.pump(lambda: stranger.poll(0), what="an answer to the stranger")
    reply = protocol.decode(stranger.recv_multipart())
    assert isinstance(reply, Heartbeat) and reply.known is False


# --------------------------------------------------------------------------- ParM coding


def test_coding_groups_tag_consecutive_batches_and_copy_to_the_encoder(harness, zsock):
    encoder = zsock(zmq.PULL, bind=ANY_PORT)
    h = harness({"m": BatchPolicy(fixed_batch=1, k=2, parity_model="m-parity"), "plain": BatchPolicy(fixed_batch=1)},
                encoder_endpoint=transport.endpoint_of(encoder))
    w = h.worker("w0", slots=8)
    wp = h.worker("wp", model="plain")
    sent = h.send_queries("m", 5)
    got: list[Batch] = []
    h.pump(lambda: got.extend(h.batches(w)) or len(got) >= 5, what="five batches")
    assert [b.qids for b in got] == [[q] for q in sent]
    g = got[0].group.group  # group ids come from the dispatcher's IdSpace: this incarnation's, consecutive
    assert h.d.group_ids.owns(g)
    assert [b.group for b in got] == [CodingTag(g, 0, 2), CodingTag(g, 1, 2), CodingTag(g + 1, 0, 2), CodingTag(g + 1, 1, 2),
                                      CodingTag(g + 2, 0, 2)]
    copies: list[Batch] = []
    h.pump(lambda: copies.extend(h.batches(encoder)) or len(copies) >= 5, what="five copies at the encoder")
    assert [(c.batch_id, c.qids, c.group) for c in copies] == [(b.batch_id, b.qids, b.group) for b in got]
    np.testing.assert_array_equal(copies[3].inputs, got[3].inputs)
    # an uncoded model: no tag and no copy
    h.send_queries("plain", 1)
    assert h.next_batch(wp).group is None
    h.settle()
    assert h.batches(encoder) == []


def test_parity_batches_go_to_parity_workers(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1, k=2, parity_model="m-parity")})
    deployed = h.worker("w0")
    parity = h.worker("p0", model="m-parity", role=ModelRole.PARITY)
    members = ParityMembers("m", "add", [MemberBatch([1], [REPLY_TO]), MemberBatch([2], [REPLY_TO])])
    transport.send(h.frontend, Batch(batch_id=0, model="m-parity", qids=[0], reply_to=[""], role=ModelRole.PARITY,
                                     inputs=np.ones((1, 4), np.float32), group=CodingTag(0, 2, 2), members=members))
    got = h.next_batch(parity, what="the parity batch")
    assert got.role == ModelRole.PARITY and got.members == members and got.group == CodingTag(0, 2, 2)
    assert got.batch_id > 0
    h.settle()
    assert h.batches(deployed) == []


def test_status_over_the_worker_socket(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    h.worker("w0")
    asker = h.zsock(zmq.DEALER, connect=h.worker_endpoint, identity=b"asker")
    transport.send(asker, protocol.Status(service="?"))
    h.pump(lambda: asker.poll(0), what="a status answer")
    info = protocol.decode(asker.recv_multipart()).info
    assert info["role"] == "dispatcher" and info["workers"]["w0"]["model"] == "m"
    assert info["queues"] == {"m": 0}


# --------------------------------------------------------------------------- distribution plug-ins


def test_round_robin_rotates_over_free_workers(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)}, policy="round_robin")
    socks = {name: h.worker(name) for name in ("w0", "w1", "w2")}
    order = []
    for _ in range(6):
        h.send_queries("m", 1)
        got: list = []
        h.pump(lambda: got.extend((n, b) for n, s in socks.items() for b in h.batches(s)) or got, what="a batch")
        name, batch = got[0]
        order.append(name)
        h.done(socks[name], batch, 1.0)
        # w1 is chatty: single_queue would serve it last (longest quiet first); round robin keeps its turn
        transport.send(socks["w1"], Heartbeat(sender="w1"))
        h.pump(lambda: h.state("w1").last_seen > h.state("w2").last_seen, what="w1's heartbeat")
    assert order == ["w0", "w1", "w2", "w0", "w1", "w2"]


class Recording:
    """A policy that records what it sees and keeps the head query queued (as Kairos would
    for a query that waits for a busy, faster worker)."""

    def __init__(self):
        self.seen = []

    def assign(self, queue, workers, now):
        self.seen.append(([(q.qid, q.size, now - q.enqueued, q.deadline - now) for q in queue.entries],
                          [(w.name, w.instance, w.price, w.threads, w.free_slots) for w in workers]))
        by_name = {w.name: w for w in workers}
        return [Assignment(None, 1), Assignment(by_name["fast"], 2), Assignment(by_name["slow"])]


def test_a_policy_sees_the_queue_and_every_worker_and_its_plan_is_followed(harness, monkeypatch):
    monkeypatch.setitem(POLICIES, "recording", Recording)
    h = harness({"m": BatchPolicy(fixed_batch=1)}, policy="recording")
    slow = h.worker("slow", instance="cpu", price=0.1, threads=2)
    fast = h.worker("fast", instance="gpu", price=0.9)
    sent = h.send_queries("m", 4, deadline_s=30.0)
    assert h.next_batch(fast).qids == sent[1:3]  # a chunk of 2 though the batching says 1
    assert h.next_batch(slow).qids == sent[3:]
    h.settle()
    assert h.d.status()["queues"]["m"] == 1 and h.d.queues["m"].entries[0].qid == sent[0]  # kept queued
    queries, workers = h.d.policy.seen[0]
    assert [q[0] for q in queries] == sent and all(q[1] == 1 and q[2] >= 0 and 29_000 < q[3] * 1000 <= 30_000 for q in queries)
    assert workers == [("slow", "cpu", 0.1, 2, 1), ("fast", "gpu", 0.9, 1, 1)]
    assert h.d.policy.seen[-1][1] == [("slow", "cpu", 0.1, 2, 0), ("fast", "gpu", 0.9, 1, 0)]  # busy workers too


def test_an_unknown_policy_is_a_config_error(harness):
    with pytest.raises(ConfigError, match="policy"):
        harness({"m": BatchPolicy()}, policy="nope")


# --------------------------------------------------------------------------- run-time reconfiguration


def received(sock: zmq.Socket) -> list:
    out = []
    while sock.poll(0):
        out.append(protocol.decode(sock.recv_multipart(copy=False)))
    return out


def test_configure_reaches_the_worker_and_dispatch_fills_the_new_slots(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    w = h.worker("w0", slots=1)
    sent = h.send_queries("m", 5)
    first = h.next_batch(w)
    h.settle()
    assert h.batches(w) == []
    assert h.d.configure("w0", slots=3, threads=2)
    msgs: list = []
    h.pump(lambda: msgs.extend(received(w)) or sum(isinstance(m, Batch) for m in msgs) >= 2, what="two more batches")
    assert isinstance(msgs[0], Configure) and (msgs[0].slots, msgs[0].threads) == (3, 2)  # before the batches it allows
    more = [m for m in msgs if isinstance(m, Batch)]
    assert qids_of(more) == sent[1:3]
    h.settle()
    assert h.batches(w) == []  # three slots, three batches
    assert (h.state("w0").slots, h.state("w0").threads, h.state("w0").free_slots) == (3, 2, 0)
    # fewer slots: batches in flight finish, and no new one leaves until one is free under the new count
    assert h.d.configure("w0", slots=2)
    h.done(w, first, 1.0)
    h.settle()
    assert [m for m in received(w) if isinstance(m, Batch)] == []
    h.done(w, more[0], 1.0)
    assert h.next_batch(w).qids == [sent[3]]
    assert not h.d.configure("nobody", slots=2)


# --------------------------------------------------------------------------- Leave and Answered


def test_leave_drops_the_worker_at_once_and_requeues_its_batch(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)})  # heartbeats every 30 s: only Leave can drop it in time
    leaving = h.worker("leaving")
    h.send_queries("m", 2)
    held = h.next_batch(leaving)
    other = h.worker("other")
    transport.send(leaving, Leave(worker="leaving"))
    rescued = h.next_batch(other, what="the leaving worker's batch, without waiting for heartbeats")
    assert rescued.qids == held.qids and b"leaving" not in h.d.workers
    assert h.d.requeued == 2


def test_leave_naming_another_worker_drops_nobody(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    h.worker("w0")
    impostor = h.worker("impostor")
    transport.send(impostor, Leave(worker="w0"))
    stranger = h.zsock(zmq.DEALER, connect=h.worker_endpoint, identity=b"stranger")
    transport.send(stranger, Leave(worker="w0"))
    h.pump(lambda: h.d.unexpected == 1, what="the impostor's Leave counted")
    h.settle()
    assert set(h.d.workers) == {b"w0", b"impostor"}


def test_answered_queries_are_not_run_again_when_their_worker_leaves(harness):
    h = harness({"m": BatchPolicy(fixed_batch=4)})
    dying = h.worker("dying")
    sent = h.send_queries("m", 4)
    h.next_batch(dying)
    transport.send(h.frontend, Answered(model="m", qids=sent[:3]))  # reconstructions answered three of them
    transport.send(h.frontend, Answered(model="other", qids=[sent[3]]))  # another model's query of that id
    h.pump(lambda: len(h.d.answered) == 4, what="Answered remembered")
    other = h.worker("other")
    transport.send(dying, Leave(worker="dying"))
    assert h.next_batch(other).qids == [sent[3]]
    assert (h.d.answered_skipped, h.d.requeued) == (3, 1)


def test_answered_after_the_requeue_still_skips_them(harness):
    h = harness({"m": BatchPolicy(fixed_batch=4)})
    dying = h.worker("dying")
    sent = h.send_queries("m", 4)
    h.next_batch(dying)
    transport.send(dying, Leave(worker="dying"))
    h.pump(lambda: h.d.status()["queues"]["m"] == 4, what="re-queued, no worker to take them")
    transport.send(h.frontend, Answered(model="m", qids=sent[1:3]))
    h.pump(lambda: len(h.d.answered) == 2, what="Answered remembered")
    assert h.next_batch(h.worker("other")).qids == [sent[0], sent[3]]
    assert h.d.answered_skipped == 2


def test_answered_memory_is_bounded_oldest_first(harness):
    h = harness({"m": BatchPolicy()}, answered_limit=100)
    transport.send(h.frontend, Answered(model="m", qids=list(range(1000))))
    h.pump(lambda: h.d.status()["answered_known"] == 100, what="100 remembered")
    assert ("m", 999) in h.d.answered and ("m", 899) not in h.d.answered


# --------------------------------------------------------------------------- incarnations and budgets


def test_a_restarted_dispatcher_never_reuses_batch_or_group_ids(harness, zsock):
    incarnations = []
    for i in range(2):
        encoder = zsock(zmq.PULL, bind=ANY_PORT)
        h = harness({"m": BatchPolicy(fixed_batch=1, k=2, parity_model="m-parity")}, encoder_endpoint=transport.endpoint_of(encoder))
        w = h.worker(f"w{i}", slots=4)
        h.send_queries("m", 4)
        got: list[Batch] = []
        h.pump(lambda: got.extend(h.batches(w)) or len(got) >= 4, what="four batches")
        incarnations.append(({b.batch_id for b in got}, {b.group.group for b in got}))
        h.d.shutdown()
        time.sleep(0.02)  # a restart takes longer than one 10 ms tick of the epoch clock
    (batches0, groups0), (batches1, groups1) = incarnations
    assert not batches0 & batches1 and not groups0 & groups1
    assert min(batches1) > max(batches0) and min(groups1) > max(groups0)


def test_done_for_another_incarnations_batch_is_ignored_and_counted_stale(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    w = h.worker("w0")
    h.send_queries("m", 2)
    batch = h.next_batch(w)
    old = IdSpace(epoch=h.d.ids.epoch - 1).next()  # the same sequence number, the previous incarnation
    assert old & 0xFFFFFFFF == batch.batch_id & 0xFFFFFFFF
    transport.send(w, Done(worker="w0", batch_id=old, batch_size=1, service_ms=1.0))
    h.pump(lambda: h.d.status()["stale"] == 1, what="a stale Done counted")
    assert batch.batch_id in h.state("w0").inflight
    h.settle()
    assert h.batches(w) == []  # the slot is still taken


def test_deadlines_are_on_the_monotonic_clock(harness, monkeypatch):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    sent = h.send_queries("m", 1, deadline_s=5.0)
    h.pump(lambda: h.d.status()["queues"]["m"] == 1, what="queued")
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + 3600.0)  # the wall clock steps an hour (NTP)
    w = h.worker("w0")
    assert h.next_batch(w).qids == sent
    assert h.d.expired == 0


def test_batch_budgets_are_the_ms_left_when_sent(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2, batch_delay_ms=200)})
    w = h.worker("w0")
    h.send_queries("m", 1, deadline_s=10.0)
    batch = h.next_batch(w)  # after the 200 ms delay
    assert 5_000 < batch.budgets_ms[0] <= 10_000 - 200


# --------------------------------------------------------------------------- hardening


def raw(msg, drop: tuple[str, ...] = (), **header) -> list[bytes]:
    """``msg``'s frames with header fields replaced or dropped: what a buggy peer sends."""
    frames = protocol.encode(msg)
    fields = {**orjson.loads(frames[0]), **header}
    for key in drop:
        del fields[key]
    return [orjson.dumps(fields)] + [bytes(f) for f in frames[1:]]


def test_queries_with_null_or_short_budgets_are_refused_and_serving_goes_on(harness):
    h = harness({"m": BatchPolicy(fixed_batch=8)})
    w = h.worker("w0")
    bad = Queries(model="m", qids=[901, 902], budgets_ms=[60_000.0] * 2, reply_to=REPLY_TO, inputs=np.ones((2, 4), np.float32))
    h.frontend.send_multipart(raw(bad, budgets_ms=None))
    h.frontend.send_multipart(raw(bad, budgets_ms=[60_000.0]))
    h.frontend.send_multipart(raw(bad, drop=("budgets_ms",)))
    h.frontend.send_multipart(raw(bad, budgets_ms=[60_000.0, None]))
    good = h.send_queries("m", 2)
    assert h.next_batch(w).qids == good
    h.settle()
    assert h.batches(w) == [] and h.d.status()["queues"]["m"] == 0


def test_a_failing_chore_or_handler_does_not_stop_the_dispatcher(harness, monkeypatch):
    h = harness({"m": BatchPolicy(fixed_batch=1)}, heartbeat_interval_s=0.02)
    w = h.worker("w0")
    calls = []

    def broken(queue, workers, now):
        calls.append(now)
        raise RuntimeError("a bug in a policy")

    monkeypatch.setattr(h.d.policy, "assign", broken)
    sent = h.send_queries("m", 1)
    h.pump(lambda: len(calls) >= 5, what="the heartbeat chore hitting the bug again and again", also=beats(w))
    monkeypatch.undo()
    assert h.next_batch(w, also=beats(w)).qids == sent


def test_queries_of_another_shape_or_dtype_wait_for_their_own_batch(harness):
    h = harness({"m": BatchPolicy(fixed_batch=8)})
    a = h.send_queries("m", 2, dim=4)
    b = h.send_queries("m", 1, dim=5)
    c = h.send_queries("m", 1, dim=4, dtype=np.float64)
    d = h.send_queries("m", 2, dim=4)
    h.pump(lambda: h.d.status()["queues"]["m"] == 6, what="all queued")
    w = h.worker("w0", slots=8)
    got: list[Batch] = []
    h.pump(lambda: got.extend(h.batches(w)) or len(got) >= 4, what="four batches")
    assert [g.qids for g in got] == [a, b, c, d]
    assert [(g.inputs.shape, g.inputs.dtype) for g in got] == [((2, 4), np.float32), ((1, 5), np.float32),
                                                               ((1, 4), np.float64), ((2, 4), np.float32)]
    assert h.d.shape_splits == 3


def test_register_with_zero_slots_or_max_batch_is_refused_and_others_are_served(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    bad = h.zsock(zmq.DEALER, connect=h.worker_endpoint, identity=b"bad")
    # the wire refuses every one of them (0, and null for a field not typed optional)
    for change in ({"slots": 0}, {"max_batch": 0}, {"slots": None}, {"max_batch": None}, {"threads": None}):
        bad.send_multipart(raw(Register(worker="bad", model="m"), **change))
    good = h.worker("good")
    sent = h.send_queries("m", 3)
    for qid in sent:
        batch = h.next_batch(good)
        assert batch.qids == [qid]
        h.done(good, batch, 1.0)
    assert set(h.d.workers) == {b"good"} and b"bad" not in h.d.workers


def test_the_dispatcher_refuses_registers_that_would_stall_or_misroute(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1, k=2, parity_model="m-parity")})
    refused = [  # well-formed on the wire (bounds are checked there), wrong for this dispatcher
        Register(worker="b2", model="m", role=ModelRole.PARITY),  # parity role, not a parity model
        Register(worker="b3", model="m-parity", role=ModelRole.DEPLOYED),  # a parity model's worker must be parity
        Register(worker="b4", model="unknown"),
    ]
    for msg in refused:
        h.d._on_register(msg.worker.encode(), msg)
    assert h.d.workers == {} and h.d.refused_registers == 3
    assert all(ws == [] for ws in h.d.by_model.values())
    good = h.worker("good")
    sent = h.send_queries("m", 1)
    assert h.next_batch(good).qids == sent


def test_a_parity_role_worker_for_a_deployed_model_is_refused_over_the_wire(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    bad = h.zsock(zmq.DEALER, connect=h.worker_endpoint, identity=b"p0")
    transport.send(bad, Register(worker="p0", model="m", role=ModelRole.PARITY))
    h.pump(lambda: h.d.refused_registers == 1, what="refused")
    good = h.worker("good")
    sent = h.send_queries("m", 1)
    assert h.next_batch(good).qids == sent
    h.settle()
    assert h.batches(bad) == [] and b"p0" not in h.d.workers


def test_reregistering_under_another_model_leaves_nothing_of_the_old(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1), "other": BatchPolicy(fixed_batch=1)})
    w = h.worker("w0", model="m")
    h.send_queries("m", 1)
    h.next_batch(w)
    transport.send(w, Register(worker="w0", model="other"))
    h.pump(lambda: h.state("w0").model == "other", what="registered again")
    assert h.d.by_model["m"] == [] and [x.name for x in h.d.by_model["other"]] == ["w0"]
    assert h.d.requeued == 1 and h.d.status()["queues"]["m"] == 1  # what it held waits for an m worker
    sent = h.send_queries("other", 1)
    assert h.next_batch(w).qids == sent
    h.settle()
    assert h.batches(w) == []


# --------------------------------------------------------------------------- status


def test_status_shows_declarations_profile_queues_and_counts(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)})
    w = h.worker("w0", instance="c5.xlarge", price=0.17, threads=4)
    h.send_queries("m", 3)
    h.done(w, h.next_batch(w), 7.0)
    h.next_batch(w)
    asker = h.zsock(zmq.DEALER, connect=h.worker_endpoint, identity=b"asker")
    transport.send(asker, protocol.Status(service="?"))
    h.pump(lambda: asker.poll(0), what="a status answer")
    info = protocol.decode(asker.recv_multipart()).info
    w0 = info["workers"]["w0"]
    assert {k: w0[k] for k in ("instance", "price", "threads", "slots", "max_batch", "inflight", "batches")} == {
        "instance": "c5.xlarge", "price": 0.17, "threads": 4, "slots": 1, "max_batch": 64, "inflight": 1, "batches": 1}
    assert w0["profile"] == {"2": 7.0}
    assert info["queues"] == {"m": 0} and info["epoch"] == h.d.ids.epoch
    for count in ("expired", "requeued", "stale", "late_done", "answered_skipped", "shape_splits", "refused_registers"):
        assert info[count] == 0


# --------------------------------------------------------------------------- epoch fencing


def _fenced_queries(h: Harness, n: int, fence: int) -> list[int]:
    qids = list(range(h.next_qid, h.next_qid + n))
    h.next_qid += n
    transport.send(h.frontend, Queries(model="m", qids=qids, budgets_ms=[60_000.0] * n, reply_to=REPLY_TO,
                                       inputs=np.ones((n, 4), np.float32), fence=fence))
    return qids


def test_queries_stamped_with_a_newer_epoch_pause_the_dispatcher_until_the_manager_confirms_it(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    w = h.worker("w0", slots=4)
    h.d._on_role("dispatcher", 3)  # the manager's decision: this dispatcher holds epoch 3
    _fenced_queries(h, 2, fence=4)  # a frontend already follows epoch 4: a decision not heard here yet
    h.pump(lambda: h.d.paused, what="paused")
    h.settle()
    assert h.batches(w) == [] and h.d.status()["queues"]["m"] == 2 and h.d.status()["pauses"] == 1
    h.d._on_role("dispatcher", 4)  # epoch 4 is this dispatcher's again: it resumes with its queue
    got: list[Batch] = []
    h.pump(lambda: got.extend(h.batches(w)) or len(got) == 2, what="both queries dispatched")
    assert [b.fence for b in got] == [4, 4] and not h.d.paused


def test_a_paused_dispatcher_that_lost_the_role_steps_down_and_forgets_its_queue(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    h.worker("w0", slots=1)
    h.d._on_role("dispatcher", 3)
    _fenced_queries(h, 3, fence=5)
    h.pump(lambda: h.d.paused, what="paused")
    h.d._on_role("dispatcher-b", 5)
    assert not h.d.active and not h.d.paused
    assert h.d.status()["queues"]["m"] == 0 and h.d.workers == {}


def test_a_dispatcher_no_manager_named_ignores_fences(harness):
    h = harness({"m": BatchPolicy(fixed_batch=1)})
    w = h.worker("w0", slots=1)
    sent = _fenced_queries(h, 1, fence=9)
    assert h.next_batch(w).qids == sent and h.d.active


def test_serf_runs_for_a_profiled_model_and_a_missing_profile_does_not_stop_the_dispatcher(harness, tmp_path):
    from keel.services.serf import profile as serf_profile
    from keel.services.serf.profile import Profile

    h = harness({"m": BatchPolicy(fixed_batch=1)}, serf={"m": str(tmp_path / "none.json")})
    # served as configured, not switched (held), and its status says why
    assert h.d.serf.models == {} and "no profile for m at" in h.d.status()["serf"]["m"]["held"]
    path = serf_profile.save(Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0}), tmp_path / "p.json")
    h = harness({"m": BatchPolicy(fixed_batch=1)}, serf={"m": str(path)}, serf_hold_s=0.0)
    w = h.worker("w0", slots=1)
    h.d._serf(0.0)  # idle: one request with both threads
    msgs: list = []
    h.pump(lambda: msgs.extend(received(w)) or any(isinstance(m, Configure) for m in msgs), what="a Configure")
    configure = next(m for m in msgs if isinstance(m, Configure))
    assert (configure.slots, configure.threads) == (1, 2) and (h.state("w0").slots, h.state("w0").threads) == (1, 2)
    assert h.d.status()["serf"]["m"]["configuration"] == "1x2"


def _ask_while_pumping(h: Harness, msg) -> dict:
    """``transport.ask`` the dispatcher's ROUTER from a thread while the test ticks it."""
    import threading

    got: list = []
    t = threading.Thread(target=lambda: got.append(transport.ask(h.worker_endpoint, msg, 5.0)))
    t.start()
    h.pump(lambda: bool(got), what="an answer")
    t.join()
    assert got[0] is not None
    return got[0]


def test_serf_follows_the_version_a_rollout_brings_and_holds_one_without_a_profile(harness, tmp_path):
    from keel.services.serf import profile as serf_profile
    from keel.services.serf.profile import Profile

    run = tmp_path / "run"
    v1 = serf_profile.save(Profile("m", "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0}),
                           serf_profile.where("m", "1", None, str(run)))
    v2 = {(1, 1): 40.0, (1, 2): 24.0, (2, 1): 42.0}
    serf_profile.save(Profile("m", "2", 2, v2), serf_profile.where("m", "2", None, str(run)))
    h = harness({"m": BatchPolicy(fixed_batch=1)}, serf={"m": str(v1)}, serf_run_dir=str(run), serf_hold_s=0.0)
    w = h.worker("w0", slots=1)
    answer = _ask_while_pumping(h, Configure(model="m", version="2"))
    assert answer["serf"]["version"] == "2" and h.d.serf.models["m"].profile.service_ms == v2
    # version 3 has no profile: held with the command that ends it, and no switch is sent
    answer = _ask_while_pumping(h, Configure(model="m", version="3"))
    assert answer["serf"]["held"].startswith("no profile for m version 3: keel serf profile SPEC --model m")
    assert h.d.status()["serf"]["m"]["held"] == answer["serf"]["held"]
    h.d._serf(0.0)
    h.settle()
    assert not any(isinstance(m, Configure) for m in received(w)) and (h.state("w0").slots, h.state("w0").threads) == (1, 1)


@pytest.mark.parametrize("budget", [None, 3])
def test_serf_keeps_two_models_within_their_hosts_cores(harness, tmp_path, budget):
    """m and n share host h; each alone would take both threads at idle (1x2): with 3 cores
    on h, the first takes 2 and the second keeps the one left."""
    from keel.services.serf import profile as serf_profile
    from keel.services.serf.profile import Profile

    paths = {m: str(serf_profile.save(Profile(m, "1", 2, {(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0}), tmp_path / f"{m}.json"))
             for m in ("m", "n")}
    cores = {"serf_cores": {"h": budget}, "serf_hosts": {"wm": "h", "wn": "h"}} if budget else {}
    h = harness({"m": BatchPolicy(fixed_batch=1), "n": BatchPolicy(fixed_batch=1)}, serf=paths, serf_hold_s=0.0, **cores)
    h.worker("wm", model="m")
    h.worker("wn", model="n")
    h.d._serf(0.0)
    h.d._serf(1.0)
    got = {name: (h.state(name).slots, h.state(name).threads) for name in ("wm", "wn")}
    if budget is None:
        assert got == {"wm": (1, 2), "wn": (1, 2)}
    else:
        assert got == {"wm": (1, 2), "wn": (1, 1)} and sum(s * t for s, t in got.values()) <= budget


def test_a_traced_query_rides_its_batch_with_the_dispatchers_two_stamps_and_others_carry_none(harness):
    h = harness({"m": BatchPolicy(fixed_batch=2)})
    w = h.worker("w0", slots=1)
    sent = h.send_queries("m", 2)  # untraced
    plain = h.next_batch(w)
    assert plain.qids == sent and plain.trace is None and plain.traced is None
    h.done(w, plain, 1.0)
    before = time.time()
    transport.send(h.frontend, Queries(model="m", qids=[50, 51], budgets_ms=[60_000.0] * 2, reply_to=REPLY_TO,
                                       inputs=np.zeros((2, 4), np.float32), traced=51, trace=[before - 0.002, before - 0.001]))
    batch = h.next_batch(w)
    assert batch.qids == [50, 51] and batch.traced == 51
    assert batch.trace[:2] == [before - 0.002, before - 0.001] and len(batch.trace) == 4  # + receipt, + send
    assert before <= batch.trace[2] <= batch.trace[3] <= time.time()
    assert h.d.traces == {}  # nothing kept once it left


def test_a_done_with_a_lower_ceiling_caps_that_workers_batches(harness):
    # out of device memory, the worker reports the largest batch that fits (Done.max_batch)
    h = harness({"m": BatchPolicy(fixed_batch=8)})
    w, other = h.worker("w0"), h.worker("w1")
    h.send_queries("m", 40)
    batch = h.next_batch(w)
    assert len(batch.qids) == 8
    transport.send(w, Done(worker="w0", batch_id=batch.batch_id, batch_size=8, service_ms=1.0, max_batch=3))
    h.pump(lambda: h.state("w0").max_batch == 3, what="ceiling lowered")
    assert len(h.next_batch(w).qids) == 3
    assert h.state("w1").max_batch == 64  # only that worker's
    assert len(h.next_batch(other).qids) == 8
