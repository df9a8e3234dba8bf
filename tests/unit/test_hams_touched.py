"""States shipped as the rows an update touched: the blob, the whole state a backup and a
primary fold from them, and the models that say what they touched."""
from __future__ import annotations

import numpy as np
import pytest

from keel.bench.hams_graphs import OnlineHashedLinear
from keel.services.graph.models import GRU, GraphBatch, OnlineMLP
from keel.services.graph.statemgr import Folded, StateManager, header_of, outputs_of, pack, unpack
from tests.support.graphs import threaded_statemgr


def test_touched_rows_travel_alone_with_their_indices():
    w = np.arange(40, dtype=np.float32).reshape(10, 4)
    b = np.ones(3, np.float32)
    blob = pack({"w": w, "b": b}, {5: np.zeros(2, np.float32)}, touched={"w": np.array([7, 2])})
    got, outs = unpack(blob)
    assert header_of(blob)["rows"] == ["w"]
    assert np.array_equal(got["w"], w[[7, 2]]) and got["w@rows"].tolist() == [7, 2]
    assert np.array_equal(got["b"], b)  # a tensor the model did not name travels whole
    assert list(outs) == [5] and list(outputs_of(blob)) == [5]
    assert blob.nbytes < pack({"w": w, "b": b}, {5: np.zeros(2, np.float32)}).nbytes


def test_folding_writes_touched_rows_into_the_whole_state():
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(10, 4)).astype(np.float32)
    w1 = w0.copy()
    w1[[1, 3]] += 1
    w2 = w1.copy()
    w2[[3, 9]] -= 2
    whole, first, second = pack({"w": w0}, {}), pack({"w": w1}, {}, touched={"w": [1, 3]}), \
        pack({"w": w2}, {}, touched={"w": [3, 9]})
    f = Folded()
    with pytest.raises(ValueError):
        Folded().fold(first)  # touched rows with no whole state before them: a broken chain, never applied
    f.fold(whole)
    assert np.array_equal(f.at()["w"], w0)
    assert np.array_equal(f.at([first, second])["w"], w2)
    assert np.array_equal(f.at()["w"], w0)  # asking for a later state leaves the folded one as it was
    f.fold(first)
    assert np.array_equal(f.at()["w"], w1) and np.array_equal(f.at([second])["w"], w2)
    assert np.array_equal(f.at()["w"], w1)
    f.fold(second)
    assert np.array_equal(f.at()["w"], w2)
    f.fold(whole)  # a whole state replaces what was folded (a new primary's first state)
    assert np.array_equal(f.at()["w"], w0)


def test_the_first_state_is_whole_then_touched_rows_and_a_roll_back_is_whole():
    sent = []
    mgr = StateManager("g", 1, window=8, in_background=False, send=sent.append)
    w = np.zeros((6, 2), np.float32)
    states = []
    for seq, rows in enumerate([[0], [2, 4], [4], [5]]):
        w[rows] += seq + 1  # the update of batch seq
        states.append(w.copy())
        mgr.start(lambda: {"w": w}, {seq: np.zeros(1, np.float32)}, seq, seq, [], touched={"w": np.array(rows)})
    assert [header_of(m.blob).get("rows") for m in sent] == [None, ["w"], ["w"], ["w"]]
    backup = Folded()
    for m in sent:
        backup.fold(m.blob)
    assert np.array_equal(backup.at()["w"], states[-1])  # the backup holds the whole state
    mgr.on_durable(2)  # states 0 and 1 folded at the primary, 2 and 3 still saved
    assert list(mgr.saved) == [2, 3]
    for seq in (2, 3):
        assert np.array_equal(mgr.state_at(seq)["w"], states[seq])



def test_a_state_no_reply_waits_on_is_copied_and_folded_on_the_thread():
    """Where only operators' batches wait on a state (its outputs go on to operators) every
    copy goes to the thread however cheap; the primary's fold of the states it lets go is
    there too, and a roll-back's whole state sees every fold handed to it."""
    from keel.common import protocol

    with threaded_statemgr() as (mgr, sent, backup):
        w = np.zeros((6, 2), np.float32)
        states = []
        mgr.handoff_ms = 1e6  # a hand-off dearer than any copy: a waited-on state would be copied in place
        for seq, rows in enumerate([[0], [2, 4], [4], [5]]):
            w[rows] += seq + 1
            states.append(w.copy())
            mgr.start(lambda: {"w": w}, {seq: np.zeros(1, np.float32)}, seq, seq, [], touched={"w": np.array(rows)},
                      waited_on=seq == 0)
            mgr.wait_copy()  # as the next update does
        assert [m.last_seq for m in sent] == [0] and mgr.in_background == 3
        shipped = []
        while len(shipped) < 3 and backup.poll(5000):
            shipped.append(protocol.decode(backup.recv_multipart()).last_seq)
        assert sorted(shipped) == [1, 2, 3]
        mgr.on_durable(2)  # states 0 and 1 folded, on the thread
        assert list(mgr.saved) == [2, 3]
        for seq in (2, 3):
            assert np.array_equal(mgr.state_at(seq)["w"], states[seq])


def test_models_name_the_rows_their_update_touched():
    gru = GRU((4,), (3,), streams=16)
    gru.start()
    batch = GraphBatch(np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32), [5, 9, 5])
    before = gru.state["hidden"].clone().numpy()
    gru.update(batch, gru.compute(batch))
    rows = gru.touched()["hidden"]
    assert sorted(rows.tolist()) == [5, 9]
    changed = np.flatnonzero((gru.state["hidden"].numpy() != before).any(1))
    assert set(changed) <= set(rows.tolist())

    ol = OnlineHashedLinear((6,), (2,), buckets=1 << 10)
    ol.start()
    batch = GraphBatch(np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32), [0, 1, 2, 3])
    before = ol.state["w"].clone().numpy()
    ol.update(batch, ol.compute(batch) + 1.0)
    changed = np.flatnonzero((ol.state["w"].numpy() != before).any(1))
    assert len(changed) and set(changed) <= set(ol.touched()["w"].tolist())

    mlp = OnlineMLP((5,), (2,))
    assert mlp.touched() is None  # a dense step: the whole state ships


def test_weight_decay_changes_the_whole_state_and_names_no_rows():
    """The large-state graph's model under weight decay: every weight moves every step, so
    the whole state ships (``touched`` None), as an online-learned model's does in HAMS."""
    ol = OnlineHashedLinear((6,), (2,), buckets=1 << 10, decay=1e-2)
    ol.start()
    ol.state["w"].fill_(1.0)
    batch = GraphBatch(np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32), [0, 1, 2, 3])
    ol.update(batch, ol.compute(batch) + 1.0)
    assert ol.touched() is None
    assert (ol.state["w"].numpy() != 1.0).all()
