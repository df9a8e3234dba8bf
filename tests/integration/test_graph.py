"""HAMS service graphs with real processes over ZeroMQ, one cluster per graph shape: every
request gets one answer, replies of stateful graphs leave only once durable, backups end
with the primaries' state, and a deterministic graph's replies equal an offline run."""
from __future__ import annotations

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.protocol.messages import Predict
from keel.common.spec.graph import read_graph
from keel.services.graph.models import GRU, run_offline
from tests.support.graphs import ask, gru_chain, interleave_join, start, status

pytestmark = pytest.mark.timeout(180)


def test_gru_chain_durable_and_equal_to_run_offline(launcher, zsock, wait):
    graph, services, client = start(launcher("gru"), gru_chain())
    rng = np.random.default_rng(1)
    inputs, streams = rng.normal(size=(120, 4)), rng.integers(0, 5, size=120)
    replies = ask(zsock, client, inputs, streams)
    assert all(r.error is None for r in replies), [r.error for r in replies if r.error][:3]
    expected, models = run_offline(graph, inputs, streams)
    np.testing.assert_allclose(np.stack([r.output for r in replies]), np.stack(expected), atol=1e-5)
    fe = status(services[0])
    assert fe["held"] > 0 and fe["held_now"] == 0 and fe["answered"] == 120
    by_name = {s.name: s for s in services}
    for op in ("g1", "g2"):  # each backup applied the primary's last state, equal to the offline state
        primary = wait(lambda: (st := status(by_name[f"op-{op}"]))["durable_seq"] == 119 and st, what=f"{op} durable")
        backup = status(by_name[f"op-{op}-backup"])
        assert backup["max_applied_seq"] == 119 and primary["saved_states"] <= 1
    assert fe["durable"] == {"g1": 119, "g2": 119}


def test_stateless_graph_holds_nothing(launcher, zsock):
    table = {"mode": "nspb", "input_shape": [4], "edges": [["frontend", "m"], ["m", "frontend"]],
             "operators": {"m": {"kind": "mlp", "input_shape": [4], "output_shape": [2]}}}
    graph, services, client = start(launcher("mlp"), table)
    inputs = np.random.default_rng(2).normal(size=(30, 4))
    replies = ask(zsock, client, inputs, [0] * 30)
    expected, _ = run_offline(graph, inputs, [0] * 30)
    np.testing.assert_allclose(np.stack([r.output for r in replies]), np.stack(expected), atol=1e-5)
    fe = status(services[0])
    assert fe["held"] == 0 and fe["answered"] == 30
    assert [s.config.role for s in services[1:]] == ["stateless", "standby"]  # no backup; one hot standby (§II-B)
    standby = status(services[2])
    assert standby["standby_for"] == ["m"] and standby["ready"] and standby["rows"] == 0


def test_online_learning_every_mode_answers_and_backup_has_primary_state(launcher, zsock, wait):
    """OL (stateful learning): the backup ends with the primary's trained weights in every
    mode; with batch 1 the trained model's replies equal an offline run."""
    for mode in ("nspb", "s1", "s2", "remus"):
        table = {"mode": mode, "window": 2, "input_shape": [6], "edges": [["frontend", "ol"], ["ol", "frontend"]],
                 "operators": {"ol": {"kind": "online_mlp", "input_shape": [6], "output_shape": [2], "max_batch": 1}}}
        graph, services, client = start(launcher(f"ol-{mode}"), table)
        inputs = np.random.default_rng(3).normal(size=(40, 6))
        replies = ask(zsock, client, inputs, [0] * 40)
        expected, models = run_offline(graph, inputs, [0] * 40)
        np.testing.assert_allclose(np.stack([r.output for r in replies]), np.stack(expected), atol=1e-5, err_msg=mode)
        by_name = {s.name: s for s in services}
        wait(lambda: status(by_name["op-ol-backup"])["max_applied_seq"] == 39, what=f"{mode}: backup applied all")
        fe = status(services[0])
        assert fe["answered"] == 40 and fe["held_now"] == 0
        if mode in ("nspb", "s2"):  # early release: outputs reach the frontend before their state is durable
            assert fe["held"] > 0


def test_fan_out_join_and_stateful_last(launcher, zsock, wait):
    """frontend -> (g1 stateful, m stateless) -> combine join (stateful GRU, last)."""
    table = {"mode": "nspb", "input_shape": [4], "edges": [["frontend", "g1"], ["frontend", "m"], ["g1", "j"],
                                                          ["m", "j"], ["j", "frontend"]],
             "operators": {"g1": {"kind": "gru", "input_shape": [4], "output_shape": [3], "max_batch": 4},
                           "m": {"kind": "mlp", "input_shape": [4], "output_shape": [2], "max_batch": 4},
                           "j": {"kind": "gru", "input_shape": [5], "output_shape": [2], "max_batch": 4}}}
    graph, services, client = start(launcher("join"), table)
    rng = np.random.default_rng(4)
    inputs, streams = rng.normal(size=(60, 4)), rng.integers(0, 3, size=60)
    replies = ask(zsock, client, inputs, streams)
    expected, _ = run_offline(graph, inputs, streams)
    np.testing.assert_allclose(np.stack([r.output for r in replies]), np.stack(expected), atol=1e-5)
    fe = status(services[0])
    assert fe["durable"] == {"g1": 59, "j": 59} and fe["held_now"] == 0


def test_interleaving_join_answers_each_request_once_after_all_its_inputs(launcher, zsock, wait):
    """frontend -> (g1 stateful, m stateless) -> interleaving join j (stateful GRU, last):
    j takes both inputs of every request in arrival order (HAMS S1 non-determinism)."""
    table = interleave_join()
    graph, services, client = start(launcher("interleave"), table)
    rng = np.random.default_rng(6)
    replies = ask(zsock, client, rng.normal(size=(50, 4)), rng.integers(0, 3, size=50))
    assert all(r.error is None and r.output.shape == (2,) for r in replies)
    by_name = {s.name: s for s in services}
    assert status(by_name["op-j"])["rows"] == 100  # both inputs of every request
    fe = status(services[0])
    assert fe["answered"] == 50 and fe["held_now"] == 0 and fe["durable"]["j"] == 99


class PoisonGRU(GRU):
    """A GRU whose model raises on an input whose first feature is above 100 (a user's bug)."""

    def compute(self, batch):
        if (batch.inputs[:, 0] > 100).any():
            raise ValueError("poisoned input")
        return super().compute(batch)


def test_a_model_error_is_answered_at_once_and_only_for_its_request(launcher, zsock):
    """The model raises inside g1: that request gets a model_error reply (not the graph's
    timeout), its batch-mates are answered normally and the state never saw it."""
    table = gru_chain(max_batch=8)
    table["operators"]["g1"]["kind"] = "tests.integration.test_graph:PoisonGRU"
    graph, services, client = start(launcher("poison"), table)
    rng = np.random.default_rng(8)
    inputs, streams = rng.normal(size=(40, 4)), rng.integers(0, 3, size=40)
    poisoned = [5, 17, 30]
    inputs[poisoned, 0] = 1000.0
    replies = ask(zsock, client, inputs, streams, timeout_s=8.0)  # the graph's own timeout is 10 s
    for i in poisoned:
        assert replies[i].error_code == "model_error" and "ValueError: poisoned input" in replies[i].error
    good = [i for i in range(40) if i not in poisoned]
    assert all(replies[i].error is None for i in good)
    expected, _ = run_offline(read_graph(gru_chain()), inputs[good], streams[good])
    np.testing.assert_allclose(np.stack([replies[i].output for i in good]), np.stack(expected), atol=1e-5)
    fe = status(services[0])
    assert fe["errors"] == 3 and fe["answered"] == 37 and fe["in_graph"] == 0
    assert status(next(s for s in services if s.name == "op-g1"))["errors"] == 3


def test_bad_input_gets_an_error_and_service_goes_on(launcher, zsock):
    graph, services, client = start(launcher("bad"), gru_chain())
    sock = zsock(zmq.DEALER, connect=client)
    transport.send(sock, Predict("bad", "graph", np.zeros(7, np.float32)))
    assert sock.poll(10_000)
    reply = protocol.decode(sock.recv_multipart())
    assert reply.error_code == "bad_request" and "shape" in reply.error
    assert all(r.error is None for r in ask(zsock, client, np.zeros((5, 4)), [0] * 5))


def test_state_gc_keeps_memory_bounded(launcher, zsock, wait):
    """A long run: every per-request table of every process (saved outputs and states, held
    replies, lineages, pending states, ...) stays bounded while requests flow and drains
    once the replies have left the graph."""
    graph, services, client = start(launcher("gc"), gru_chain(max_batch=4))
    by_name = {s.name: s for s in services}
    rng = np.random.default_rng(5)
    peaks: dict[tuple[str, str], int] = {}
    for _ in range(6):
        ask(zsock, client, rng.normal(size=(150, 4)), rng.integers(0, 8, size=150))
        for svc in services:
            for table, n in status(svc)["tables"].items():
                peaks[svc.name, table] = max(peaks.get((svc.name, table), 0), n)
    assert status(by_name["op-g1"])["rows"] == 900
    for svc in services:  # everything drains (a primary keeps its newest state until the next is durable, §IV-C)
        wait(lambda: all(n <= (1 if t == "saved_states" else 0) for t, n in status(svc)["tables"].items()),
             what=f"{svc.name}'s tables drained")
    for (name, table), peak in peaks.items():  # one round's worth at most, never the run's 900
        assert peak <= (2 * graph.window + 2 if table in ("saved_states", "in_flight", "pending_states") else 150), (
            name, table, peak)


def test_garbage_and_stray_requests_do_not_stop_the_graph(launcher, zsock):
    graph, services, client = start(launcher("fuzz"), gru_chain())
    g1 = next(s for s in services if s.name == "op-g1")
    push = zsock(zmq.PUSH, connect=g1.config.endpoint)
    push.send_multipart([b"not json"])
    push.send_multipart([b'{"v": 1, "kind": "graph_request", "sender": "g2", "seq": -5}'])
    from keel.common.protocol.messages import GraphRequest
    transport.send(push, GraphRequest("frontend", 0, 0, 0, [], np.zeros(99, np.float32)))  # wrong shape
    transport.send(push, GraphRequest("nobody", 0, 0, 0, [], np.zeros(4, np.float32)))  # not a predecessor
    replies = ask(zsock, client, np.random.default_rng(9).normal(size=(20, 4)), [1] * 20)
    assert all(r.error is None for r in replies)
