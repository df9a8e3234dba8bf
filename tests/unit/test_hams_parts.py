"""The small parts of HAMS graphs: the role/epoch seam, the statemgr's packing and NSPB
window, and the stateful operators' compute/update split."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from keel.common import protocol
from keel.common.protocol.fields import LineageEntry
from keel.common.protocol.messages import GraphAck, GraphDurable, GraphRequest, GraphState
from keel.common.spec.operators import operator_class
from keel.services.graph.models import GRU, GraphBatch, OnlineMLP, StatefulOperator
from keel.services.graph.statemgr import PROBE_EVERY, StateManager, outputs_of, pack, unpack
from tests.support.graphs import threaded_statemgr


def test_state_round_trips_without_pickle_and_on_the_wire():
    state, outs = {"hidden": np.arange(6, dtype=np.float32).reshape(2, 3)}, {4: np.ones(2, np.float32)}
    blob = pack(state, outs)
    msg = protocol.decode(protocol.encode(GraphState("g", 1, 3, 4, [LineageEntry("frontend", 0, "g", 3)], blob)))
    got_state, got_outs = unpack(msg.blob)
    assert np.array_equal(got_state["hidden"], state["hidden"]) and list(got_outs) == [4]
    assert msg.lineage == [LineageEntry("frontend", 0, "g", 3)]


def test_graph_request_fields_are_checked_at_the_edge():
    good = protocol.encode(GraphRequest("a", 1, 1, 0, [], np.zeros(2, np.float32)))
    assert protocol.decode(good).seq == 1
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(protocol.encode(GraphRequest("a", -1, 1, 0, [], np.zeros(2, np.float32))))


def test_a_takeover_may_say_it_holds_no_seq_yet():
    """-1 (a backup that applied no state) travels as itself: sent as 0 it hid seq 0 from the
    resend and the void (a request lost when a primary failed before its first state)."""
    for cls in (GraphAck, GraphDurable):
        assert protocol.decode(protocol.encode(cls("g1", 2, -1))).seq == -1
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(protocol.encode(cls("g1", 2, -2)))


def test_window_counts_states_in_flight():
    sent = []
    mgr = StateManager("g", 1, window=2, in_background=False, send=sent.append)
    for seq in (0, 1):
        mgr.start(lambda: {"x": np.zeros(1)}, {}, seq, seq, [])
    assert len(sent) == 2 and not mgr.ready_for_update()
    mgr.on_ack(0)
    assert mgr.ready_for_update() and len(mgr.saved) == 2
    mgr.on_durable(1)
    assert list(mgr.saved) == [1]  # the newest durable state is kept until the next one (§IV-C)


def test_nspb_copies_in_place_when_that_costs_less_than_the_hand_off():
    with threaded_statemgr() as (mgr, sent, backup):
        state = lambda: {"x": np.zeros(4)}  # noqa: E731
        mgr.start(state, {}, 0, 0, [])  # nothing measured yet: in place
        mgr.start(state, {}, 1, 1, [])  # a copy's cost known, the hand-off's not: to the thread
        mgr.wait_copy()
        assert [m.last_seq for m in sent] == [0] and mgr.in_background == 1 and mgr.handoff_ms > 0
        assert backup.poll(5000) and protocol.decode(backup.recv_multipart()).last_seq == 1
        mgr.handoff_ms = 1e6  # a hand-off dearer than any copy: in place, but one in PROBE_EVERY
        for seq in range(2, 2 + PROBE_EVERY):
            mgr.start(state, {}, seq, seq, [])
            mgr.wait_copy()
        assert mgr.in_background == 2 and len(sent) == 1 + PROBE_EVERY - 1
        mgr.handoff_ms, mgr.copy_ms_avg = 0.0, 1.0  # copies dearer than the hand-off: the thread
        mgr.start(state, {}, 99, 99, [])
        mgr.wait_copy()
        assert mgr.in_background == 3
        mgr.start(state, {}, 100, 100, [], idle=True)  # no batch waiting: in place whatever the costs
        assert sent[-1].last_seq == 100


def test_compute_reads_state_update_writes_it():
    for op in (GRU((4,), (3,)), OnlineMLP((5,), (2,))):
        op.start()
        batch = GraphBatch(np.random.default_rng(0).normal(size=(3, op.input_shape[0])).astype(np.float32), [0, 1, 0])
        before = op.copy_state()
        out = op.compute(batch)
        assert all(np.array_equal(before[k], v) for k, v in op.copy_state().items())
        op.update(batch, out)
        assert any(not np.array_equal(before[k], v) for k, v in op.copy_state().items())


@pytest.mark.parametrize("computed_first", [False, True])
def test_online_mlp_update_is_autograds_sgd_step(computed_first):
    """Alone, and after the batch's compute (whose forward pass the update reuses)."""
    op = OnlineMLP((7,), (2,), hidden=16)
    op.start()
    ref = {k: v.clone().requires_grad_() for k, v in op.state.items()}
    batch = GraphBatch(np.random.default_rng(1).normal(size=(3, 7)).astype(np.float32), [0, 1, 2])
    if computed_first:
        op.compute(GraphBatch(batch.inputs[:2], [0, 1]))  # another batch's forward pass is not reused
        op.update(batch, op.compute(batch))
    else:
        op.update(batch, None)
    x, y = (torch.from_numpy(batch.inputs[:, :5]), torch.from_numpy(batch.inputs[:, 5:]))
    out = torch.relu(x @ ref["0.weight"].T + ref["0.bias"]) @ ref["2.weight"].T + ref["2.bias"]
    torch.nn.functional.mse_loss(out, y).backward()
    for k, v in ref.items():
        assert torch.allclose(op.state[k], v.detach() - op.lr * v.grad, atol=1e-6), k


class Counter(StatefulOperator):
    """The docstring's example of a user's own operator."""

    def initialize(self):
        import torch
        return {"count": torch.zeros(1)}

    def compute(self, batch):
        return np.repeat(self.state["count"].numpy()[None], len(batch.inputs), 0)

    def update(self, batch, outputs):
        self.state["count"] += len(batch.inputs)


def test_user_operator_by_module_path():
    cls = operator_class("tests.unit.test_hams_parts:Counter")
    op = cls((1,), (1,))
    op.start()
    b = GraphBatch(np.zeros((2, 1), np.float32), [0, 0])
    op.update(b, op.compute(b))
    assert op.compute(b)[0, 0] == 2
    with pytest.raises(ValueError):
        operator_class("nonsense")


def test_experiment_is_registered_and_overhead_is_relative_to_bare():
    from keel.bench.hams_overhead import table
    from keel.bench.hams_readings import overhead
    from keel.deploy.keel import parse_args

    args = parse_args(["experiment", "hams-overhead", "--quick", "--json", "x.json"])
    assert args.quick and args.json == "x.json"
    assert overhead({"p50_ms": 11.0}, {"p50_ms": 10.0}, "p50_ms") == pytest.approx(0.1)
    row = {"graph": "g", "batch": 1, "mode": "nspb", "p50_ms": 11.0, "p99_ms": 20.0, "throughput_rps": 5.0,
           "p50_overhead": 0.1, "p99_overhead": None, "mean_batch": 1.0}
    assert "+10.0%" in table({"rows": [row]})[1]


def test_a_backup_reads_a_states_outputs_without_the_state():
    state = {"w": np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)}
    outputs = {7: np.arange(3, dtype=np.float32), 8: np.full(3, 2.0, np.float32)}
    blob = pack(state, outputs, {"origins": [1, 2]})
    got = outputs_of(blob)
    assert sorted(got) == [7, 8] and all(np.array_equal(got[s], outputs[s]) for s in outputs)
    assert {s: o.tolist() for s, o in got.items()} == {s: o.tolist() for s, o in unpack(blob)[1].items()}
    assert outputs_of(pack(state, {})) == {}  # a state with no outputs (a whole state shipped to a joiner)


def test_padded_compute_takes_the_pad_and_computes_at_its_end():
    """The overhead experiment's padding: each call takes at least pad_ms, and the wrapped
    model's compute runs after the padding, right before the update that follows it."""
    import time

    from keel.services.graph.hooks import Padded

    class Clocked:
        def __init__(self):
            self.done_at = []

        def compute(self, batch):
            time.sleep(0.002)
            self.done_at.append(time.perf_counter())
            return batch

    model = Clocked()
    padded = Padded(model, pad_ms=30)
    for _ in range(3):
        t0 = time.perf_counter()
        assert padded.compute("rows") == "rows"
        took = time.perf_counter() - t0
        assert took >= 0.030
        assert took - (model.done_at[-1] - t0) < 0.015  # near the call's end (padded after it, it would end ~28 ms before)
