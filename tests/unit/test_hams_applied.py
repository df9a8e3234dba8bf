"""The table of requests a stateful operator's state applied (exactly-once effects): its
bounds, its round trip in a joining backup's whole state, a roll-back; and, with a real
primary and backup (GraphOperators on real ZeroMQ sockets, ticked here), that the backup's
table is the primary's as of the state it applied, past the bound included."""
from __future__ import annotations

import numpy as np
import orjson
import pytest
import zmq

from keel.chaos.graph_trials import gru_chain
from keel.common import protocol, transport
from keel.common.config import GraphOperatorConfig
from keel.common.protocol.codec import decode
from keel.common.protocol.messages import GraphRequest
from keel.services.graph import applied as applied_module
from keel.services.graph.applied import AppliedRequests
from keel.services.graph.operator import GraphOperator, source_of
from tests.support.graphs import g1_in_process


def out(v: float) -> np.ndarray:
    return np.full(3, v, np.float32)


def test_the_table_forgets_the_oldest_past_its_count_and_age():
    table = AppliedRequests(limit=3, max_age_s=10.0)
    for i in range(4):
        table.record(f"k{i}", i, 100 + i, out(i), t=float(i))
    assert list(table.entries) == ["k1", "k2", "k3"]  # past the count: the oldest went
    table.record("k1", 9, 109, out(9), t=4.0)  # recorded already: the first entry stays
    assert table.get("k1").seq == 1 and np.array_equal(table.get("k1").output, out(1))
    table.record("k4", 4, 104, out(4), t=12.5)  # past the age: k1 (t=1) and k2 (t=2) are older than 12.5 - 10
    assert list(table.entries) == ["k3", "k4"]
    assert table.get(None) is None and table.get("k0") is None


def test_the_table_round_trips_in_json_and_a_rollback_forgets_what_came_after():
    table = AppliedRequests()
    for i in range(5):
        table.record(protocol.request_key("c", f"r{i}"), i, i, out(i) * 0.1, t=1.0)
    again = AppliedRequests.from_json(orjson.loads(orjson.dumps(table.to_json())))  # as a header carries it
    assert list(again.entries) == list(table.entries)
    assert all(np.array_equal(again.get(k).output, a.output) and again.get(k).output.dtype == np.float32
               for k, a in table.entries.items())
    again.forget_after(2)
    assert [a.seq for a in again.entries.values()] == [0, 1, 2]


def test_origins_are_taken_per_frontend_incarnation():
    assert source_of("frontend", 5) == "frontend"  # a frontend numbering from 0 (no incarnation bits)
    assert source_of("frontend", (7 << 32) | 5) == "frontend#7"
    assert source_of("g1", (7 << 32) | 5) == "g1"  # an operator's seqs are its own


def test_the_backup_table_is_the_primarys_as_of_the_applied_state(monkeypatch):
    monkeypatch.setattr(applied_module, "LIMIT", 8)  # small, so the bound forgets keys on both sides
    with g1_in_process(gru_chain()) as g:
        primary, backup = g.primary, g.backup
        rng = np.random.default_rng(1)
        origin = 3 << 32
        sent = []
        for key in [f"k{i}" for i in range(12)] + [f"k{i}" for i in range(0, 12, 2)]:  # retries, some past the bound
            origin += 1
            sent.append(key)
            transport.send(g.push, GraphRequest("frontend", origin, origin, int(rng.integers(0, 3)), [],
                                                rng.normal(size=4).astype(np.float32), request=key, reply_to=g.sink_endpoint))
        g.tick_until(lambda: backup.backup_side.max_applied_seq >= len(sent) - 1)
        assert backup.backup_side.max_applied_seq == len(sent) - 1
        assert len(primary.tables.applied) == 8 and primary.batcher.duplicates > 0
        assert list(backup.tables.applied.entries) == list(primary.tables.applied.entries)
        assert all(a.seq == backup.tables.applied.get(k).seq and np.array_equal(a.output, backup.tables.applied.get(k).output)
                   for k, a in primary.tables.applied.entries.items())
        outputs = g.outputs(200)
        assert [m.request for m in outputs] == sent  # every input answered, in order, with its key


def test_a_takeover_tells_every_frontend_what_its_state_holds_of_each_incarnation():
    """A promoted backup whose state holds inputs of two frontend incarnations sends each
    frontend one ack per incarnation (the highest origin of it the state holds) and its
    durability note; a saved output goes back to the frontend its request came from."""
    from keel.common.protocol.fields import LineageEntry
    from keel.common.protocol.messages import GraphAck, GraphDurable

    ctx = zmq.Context.instance()
    pulls = [ctx.socket(zmq.PULL) for _ in range(3)]  # frontends a and b, and g2
    a, b, g2 = (f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in pulls)
    cfg = GraphOperatorConfig(name="op-g2-backup", operator="g2", role="backup", epoch=1, endpoint="tcp://127.0.0.1:*",
                              graph=gru_chain(), frontends=[a, b],
                              peers={"frontend": a, "g1": g2, "g1.backup": g2, "g2": g2, "g2.backup": g2})
    op = GraphOperator(cfg)
    try:
        op.tables.consumed = {"g1": 4}
        op.backup_side.kept[4] = GraphRequest("g2", 4, (9 << 32) | 2, 0, [LineageEntry("g1", 4, "g2", 4)], np.zeros(3, np.float32),
                                  request="1:c/r2", reply_to=b)
        op.backup_side.algorithm2.max_applied_seq = 4
        op.recovery.take_over(2)
        got = {a: [], b: [], g2: []}
        for endpoint, sock in zip((a, b, g2), pulls):
            while sock.poll(300):
                got[endpoint].append(decode(sock.recv_multipart()))
        for endpoint in (a, b):
            assert any(isinstance(m, GraphDurable) and m.operator == "g2" and m.seq == 4 for m in got[endpoint])
        assert [m.request for m in got[b] if isinstance(m, GraphRequest)] == ["1:c/r2"]  # its reply_to
        assert not any(isinstance(m, GraphRequest) for m in got[a])
        assert [m.seq for m in got[g2] if isinstance(m, GraphAck)] == [4]  # g1: an operator's own seqs

        # g1 (stateful, fed by the frontends) promoted with inputs of incarnations 7 and 9 in its state
        cfg1 = GraphOperatorConfig(name="op-g1-backup", operator="g1", role="backup", epoch=1,
                                   endpoint="tcp://127.0.0.1:*", graph=gru_chain(), frontends=[a, b],
                                   peers={"frontend": a, "g1": g2, "g1.backup": g2, "g2": g2, "g2.backup": g2})
        op1 = GraphOperator(cfg1)
        try:
            op1.tables.consumed = {"frontend#7": (7 << 32) | 5, "frontend#9": (9 << 32) | 3}
            op1.recovery.take_over(2)
            for endpoint, sock in zip((a, b), pulls):
                acks = []
                while sock.poll(300):
                    m = decode(sock.recv_multipart())
                    if isinstance(m, GraphAck):
                        acks.append(m.seq)
                assert sorted(acks) == [(7 << 32) | 5, (9 << 32) | 3], endpoint
        finally:
            op1.shutdown()
    finally:
        op.shutdown()
        for s in pulls:
            s.close(0)


def test_a_state_too_large_for_one_message_refuses_to_start_and_says_why():
    """A primary whose state cannot reach its backup in one message would make nothing
    durable (every reply waits for its deadline): it refuses to start instead."""
    from types import SimpleNamespace

    from keel.services.graph.operator import STATE_MAX_BYTES

    def op_with(nbytes: int):
        state = {"w": np.zeros(nbytes // 4, np.float32)}
        return SimpleNamespace(op="ol", serving=SimpleNamespace(model=SimpleNamespace(state_arrays=lambda: state)))

    GraphOperator._check_state_fits(op_with(STATE_MAX_BYTES))  # the largest that fits
    with pytest.raises(ValueError, match=r"operator 'ol': its state is 64\.0 MiB, over the 63 MiB"):
        GraphOperator._check_state_fits(op_with(64 << 20))


def test_a_hot_backup_is_promoted_with_the_model_it_built_while_backing():
    cfg = GraphOperatorConfig(name="op-g2-backup", operator="g2", role="backup", epoch=1, endpoint="tcp://127.0.0.1:*",
                              graph=gru_chain(), frontends=["tcp://127.0.0.1:1"],
                              peers={"frontend": "tcp://127.0.0.1:1", "g1": "tcp://127.0.0.1:2", "g1.backup": "tcp://127.0.0.1:2",
                                     "g2": "tcp://127.0.0.1:3", "g2.backup": "tcp://127.0.0.1:3"})
    op = GraphOperator(cfg)
    try:
        built = op.recovery.standby_for["g2"]
        assert op.recovery.status()["ready"]
        op.recovery.take_over(2)
        assert op.serving.model is built and "g2" not in op.recovery.standby_for
    finally:
        op.shutdown()
