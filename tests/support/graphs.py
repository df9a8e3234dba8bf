"""Service graphs for the tests: a graph table, its processes (a frontend serving it as
``graph``, and its operators) started and answering, and every request's reply."""
from __future__ import annotations

import time

import numpy as np
import zmq

from keel.common import protocol, transport
from keel.common.protocol.messages import Predict
from keel.common.spec.graph import graph_services, read_graph
from keel.deploy.local import free_port_block


def gru_chain(mode="nspb", max_batch=8):
    """GRU -> GRU, the graph most tests run."""
    return {"mode": mode, "input_shape": [4], "edges": [["frontend", "g1"], ["g1", "g2"], ["g2", "frontend"]],
            "operators": {"g1": {"kind": "gru", "input_shape": [4], "output_shape": [6], "max_batch": max_batch},
                          "g2": {"kind": "gru", "input_shape": [6], "output_shape": [3], "max_batch": max_batch}}}


def interleave_join():
    """frontend -> (g1 stateful, m stateless) -> j, an interleaving join (a stateful GRU, last)."""
    return {"mode": "nspb", "input_shape": [4], "edges": [["frontend", "g1"], ["frontend", "m"], ["g1", "j"],
                                                          ["m", "j"], ["j", "frontend"]],
            "operators": {"g1": {"kind": "gru", "input_shape": [4], "output_shape": [3], "max_batch": 4},
                          "m": {"kind": "mlp", "input_shape": [4], "output_shape": [3], "max_batch": 4},
                          "j": {"kind": "gru", "input_shape": [3], "output_shape": [2], "max_batch": 4,
                                "join": "interleave"}}}


def start(launcher, table):
    """The graph's processes started by ``launcher`` and answering; -> (graph, services, client endpoint)."""
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
        transport.send(sock, Predict(f"r{i}", "graph", np.asarray(x, np.float32), key=str(int(s))))
    replies = {}
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while len(replies) < len(inputs) and time.monotonic() < deadline:
        if poller.poll(200):
            msg = protocol.decode(sock.recv_multipart())
            assert msg.request_id not in replies, "two answers to one request"
            replies[msg.request_id] = msg
    assert len(replies) == len(inputs), f"{len(inputs) - len(replies)} requests unanswered"
    return [replies[f"r{i}"] for i in range(len(inputs))]


def status(svc, graph="graph"):
    """A graph process's status: an operator's, or the frontend's route to ``graph``."""
    if svc.role == "graph_operator":
        return transport.request_status(svc.config.status_endpoint)
    return transport.request_status(svc.config.client_endpoint)["graphs"][graph]
