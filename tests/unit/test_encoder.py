"""A real Encoder, stepped with ``tick``: the test plays the dispatcher (a PUSH of batch
copies into the encoder, a PULL for the parity batches it sends back). ParM §4.1: full and
partial coding groups; hardening: bounded open groups, refused batches; incarnations."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import EncoderConfig
from keel.common.protocol import Batch, CodingTag, ModelRole
from keel.services.encoder import Encoder

ANY = "tcp://127.0.0.1:*"
FE = "tcp://127.0.0.1:1"


@pytest.fixture
def make(zsock):
    made = []

    def build(**overrides):
        parity_in = zsock(zmq.PULL, bind=ANY)
        cfg = EncoderConfig(name="enc", batch_endpoint=ANY, dispatcher_query_endpoint=transport.endpoint_of(parity_in),
                            parity_models={"m": "m-parity"}, **overrides)
        enc = Encoder(cfg)
        made.append(enc)
        push = zsock(zmq.PUSH, connect=transport.endpoint_of(enc.pull))
        return enc, push, parity_in

    yield build
    for enc in made:
        enc.shutdown()


def send(enc, push, batch: Batch, ticks: int = 3) -> None:
    transport.send(push, batch)
    for _ in range(ticks):
        enc.tick(0.02)


def member(group: int, index: int, k: int, n: int = 2, model: str = "m", dim: int = 4, budgets=None, value: float = 1.0) -> Batch:
    qids = [(group % 1000) * 100 + index * 10 + i for i in range(n)]
    return Batch(batch_id=index + 1, model=model, qids=qids, reply_to=[FE] * n,
                 inputs=np.full((n, dim), value, np.float32) + np.arange(n, dtype=np.float32)[:, None],
                 group=CodingTag(group, index, k), budgets_ms=budgets)


def parity_batch(sock, timeout_s: float = 2.0) -> Batch | None:
    if not sock.poll(int(timeout_s * 1000)):
        return None
    return protocol.decode(sock.recv_multipart())


def test_full_group_is_summed(make):
    enc, push, out = make(partial_group_ms=10_000)
    a, b = member(7, 0, 2, value=1.0), member(7, 1, 2, n=1, value=10.0)
    send(enc, push, a)
    send(enc, push, b)
    p = parity_batch(out)
    assert p.role == ModelRole.PARITY and p.model == "m-parity" and p.group == CodingTag(7, 2, 2)
    assert p.qids == [0, 1]  # parity queries are numbered by row
    np.testing.assert_array_equal(p.inputs, a.inputs + np.vstack([b.inputs, np.zeros((1, 4), np.float32)]))
    assert [m.qids for m in p.members.batches] == [a.qids, b.qids]
    assert enc.status()["encoded"] == 1 and enc.status()["partial"] == 0


def test_partial_group_is_encoded_after_its_timeout(make):
    """ParM §4.1 gap: a group that never fills used to be dropped unencoded."""
    enc, push, out = make(partial_group_ms=30)
    only = member(3, 1, 3, budgets=[60_000.0, -10.0])
    send(enc, push, only)
    deadline = time.monotonic() + 2
    while not out.poll(0) and time.monotonic() < deadline:
        enc.tick(0.01)
    p = parity_batch(out, 0.1)
    assert p is not None, "partial group not encoded"
    np.testing.assert_array_equal(p.inputs, only.inputs)  # absent members are zero queries
    assert p.members.batches[0] is None and p.members.batches[2] is None
    assert p.members.batches[1].qids == only.qids and p.group == CodingTag(3, 3, 3)
    assert p.budgets_ms[0] > 50_000 and p.budgets_ms[1] < 0  # the member's deadlines, on this clock
    assert enc.status()["partial"] == 1 and enc.status()["groups_open"] == 0
    send(enc, push, member(3, 0, 3))  # a member after its group was encoded: dropped
    assert parity_batch(out, 0.1) is None and enc.counts["late"] == 1 and not enc.groups


def test_open_groups_are_bounded(make):
    """Hardening 7: every coding tag opened a group of k slots, without bound."""
    enc, push, out = make(partial_group_ms=60_000, max_open_groups=4)
    for g in range(40):
        transport.send(push, member(g, 0, 64, n=1))
    for _ in range(10):
        enc.tick(0.02)
    assert len(enc.groups) == 4
    assert enc.counts["dropped_full"] == 36
    assert sorted(g for _, g in enc.groups) == [36, 37, 38, 39]  # the oldest went first


def test_refuses_unknown_model_k_mismatch_duplicates_and_odd_rows(make):
    enc, push, out = make(partial_group_ms=60_000)
    send(enc, push, member(1, 0, 2, model="no-parity"))
    assert not enc.groups
    send(enc, push, member(1, 0, 2))
    send(enc, push, member(1, 1, 3))  # k differs from its group's
    send(enc, push, member(1, 0, 2))  # index already there
    send(enc, push, member(1, 1, 2, dim=5))  # rows of another shape
    assert enc.counts["refused"] == 4
    assert list(enc.groups) == [("m", 1)] and sum(m is not None for m in enc.groups[("m", 1)].members) == 1
    assert parity_batch(out, 0.1) is None
    send(enc, push, member(1, 1, 2))  # the right one still completes the group
    assert parity_batch(out) is not None


def test_older_dispatcher_epochs_are_stale(make):
    enc, push, out = make(partial_group_ms=60_000)
    old, new = (5 << 32) | 1, (6 << 32) | 1
    send(enc, push, member(old, 0, 2))
    send(enc, push, member(old + 1, 0, 2))
    assert len(enc.groups) == 2
    send(enc, push, member(new, 0, 2))  # a restarted dispatcher: its old groups can never fill
    assert list(enc.groups) == [("m", new)] and enc.counts["stale"] == 2
    send(enc, push, member(old, 1, 2))  # a late copy from the old incarnation
    assert list(enc.groups) == [("m", new)] and enc.counts["stale"] == 3
    send(enc, push, member((1 << 30) << 32, 0, 2))  # an epoch no IdSpace makes: it would shadow all
    assert list(enc.groups) == [("m", new)] and enc.counts["stale"] == 4 and enc.epochs.newest["m"] == 6
    assert parity_batch(out, 0.1) is None


def named_member(group: int, index: int, k: int, lengths: list[int], model: str = "m") -> Batch:
    """A named model's batch: per query a fixed ``dense`` float32[3] and a variable ``seq`` float32[L]."""
    rng = np.random.default_rng(100 * group + index)
    n = len(lengths)
    rows = [{"dense": rng.random(3, dtype=np.float32), "seq": rng.random(L, dtype=np.float32)} for L in lengths]
    return Batch(batch_id=index + 1, model=model, qids=[group * 100 + index * 10 + i for i in range(n)],
                 reply_to=[FE] * n, inputs=None, rows=rows, group=CodingTag(group, index, k))


def test_named_group_encodes_each_input_padded_to_the_largest(make):
    enc, push, out = make(partial_group_ms=10_000)
    a, b = named_member(8, 0, 2, [2, 5]), named_member(8, 1, 2, [4])
    send(enc, push, a)
    send(enc, push, b)
    p = parity_batch(out)
    assert p.inputs is None and p.qids == [0, 1] and p.role == ModelRole.PARITY
    np.testing.assert_allclose(p.rows[0]["dense"], a.rows[0]["dense"] + b.rows[0]["dense"])
    np.testing.assert_allclose(p.rows[0]["seq"], np.pad(a.rows[0]["seq"], (0, 2)) + b.rows[0]["seq"])  # 2 -> 4
    np.testing.assert_allclose(p.rows[1]["seq"], a.rows[1]["seq"])  # b has no row 1: a zero query
    assert p.rows[0]["seq"].dtype == np.float32 and [m.qids for m in p.members.batches] == [a.qids, b.qids]


def test_named_group_refuses_a_member_of_other_inputs(make):
    enc, push, out = make(partial_group_ms=10_000)
    send(enc, push, named_member(9, 0, 2, [2]))
    bad = named_member(9, 1, 2, [2])
    bad.rows[0]["seq"] = bad.rows[0]["seq"].astype(np.float64)
    send(enc, push, bad)
    tensor = member(9, 1, 2)  # one tensor where the group has named ones
    send(enc, push, tensor)
    assert enc.status()["refused"] == 2 and parity_batch(out, 0.1) is None
