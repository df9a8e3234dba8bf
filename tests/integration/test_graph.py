"""HAMS service graphs with real processes over ZeroMQ, one cluster per graph shape: every
request gets one answer, replies of stateful graphs leave only once durable, backups end
with the primaries' state, and a deterministic graph's replies equal an offline run."""
from __future__ import annotations

import numpy as np
import pytest
import zmq

from common import protocol, transport
from common.protocol.messages import Predict
from common.spec.graph import graph_services, read_graph
from deploy.local import free_port_block
from services.graph.operators import GraphBatch, operator_class
from services.graph.statemgr import unpack

pytestmark = pytest.mark.timeout(180)


def gru_chain(mode="nspb", max_batch=8):
    return {"mode": mode, "input_shape": [4], "edges": [["frontend", "g1"], ["g1", "g2"], ["g2", "frontend"]],
            "operators": {"g1": {"kind": "gru", "input_shape": [4], "output_shape": [6], "max_batch": max_batch},
                          "g2": {"kind": "gru", "input_shape": [6], "output_shape": [3], "max_batch": max_batch}}}


def start(launcher, table):
    graph = read_graph(table)
    services, client = graph_services(graph, free_port_block(64))
    for svc in services:
        launcher.start(svc)
    for svc in services:
        launcher.wait_status(svc.config.status_endpoint if svc.role == "graph_operator" else svc.config.client_endpoint)
    return graph, services, client


def ask(zsock, client, inputs, streams, timeout_s=60.0):
    """Send every request at once; the replies by request index."""
    sock = zsock(zmq.DEALER, connect=client)
    for i, (x, s) in enumerate(zip(inputs, streams)):
        transport.send(sock, Predict(f"r{i}", "graph", np.asarray(x, np.float32), stream=int(s)))
    replies = {}
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    import time
    deadline = time.monotonic() + timeout_s
    while len(replies) < len(inputs) and time.monotonic() < deadline:
        if poller.poll(200):
            msg = protocol.decode(sock.recv_multipart())
            assert msg.request_id not in replies, "two answers to one request"
            replies[msg.request_id] = msg
    assert len(replies) == len(inputs), f"{len(inputs) - len(replies)} requests unanswered"
    return [replies[f"r{i}"] for i in range(len(inputs))]


def offline(graph, inputs, streams):
    """The graph run in-process one request at a time (the deterministic reference)."""
    models = {}
    for name in graph.order:
        spec = graph.operators[name]
        models[name] = operator_class(spec.kind)(spec.input_shape, spec.output_shape, seed=0, **spec.options)
        if models[name].stateful:
            models[name].start()
    outs = []
    for x, s in zip(inputs, streams):
        vals = {"frontend": np.asarray(x, np.float32)[None]}
        for name in graph.order:
            b = GraphBatch(np.concatenate([vals[p] for p in graph.predecessors(name)], axis=-1), [int(s)])
            vals[name] = models[name].compute(b)
            if models[name].stateful:
                models[name].update(b, vals[name])
        outs.append(vals[graph.predecessors("frontend")[0]][0])
    return outs, models


def status(svc):
    return transport.request_status(svc.config.status_endpoint if svc.role == "graph_operator" else svc.config.client_endpoint)


def test_gru_chain_durable_and_equal_to_offline(launcher, zsock, wait):
    graph, services, client = start(launcher("gru"), gru_chain())
    rng = np.random.default_rng(1)
    inputs, streams = rng.normal(size=(120, 4)), rng.integers(0, 5, size=120)
    replies = ask(zsock, client, inputs, streams)
    assert all(r.error is None for r in replies), [r.error for r in replies if r.error][:3]
    expected, models = offline(graph, inputs, streams)
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
    expected, _ = offline(graph, inputs, [0] * 30)
    np.testing.assert_allclose(np.stack([r.output for r in replies]), np.stack(expected), atol=1e-5)
    fe = status(services[0])
    assert fe["held"] == 0 and fe["answered"] == 30 and len(services) == 2  # no backup for a stateless operator
