"""Service graphs for the tests: a graph table, its processes (a frontend serving it as
``graph``, and its operators) started and answering, and every request's reply."""
from __future__ import annotations

import contextlib
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


def g1_primary_and_backup(table: dict, sink_endpoint: str, made: list) -> list[str]:
    """g1's primary and backup of a GRU -> GRU ``table`` as GraphOperators in this process
    (ticked by the test), everything else they send going to ``sink_endpoint``; both are
    appended to ``made`` as they are made (for the test to shut down). Their inbox endpoints.
    The two ports come from a free block, not probed with ZeroMQ sockets: their close is
    finished by the I/O thread later, and the operator's bind raced it."""
    from keel.common.config import GraphOperatorConfig
    from keel.services.graph.operator import GraphOperator

    base = free_port_block(2)
    endpoints = [f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}"]
    peers = {"frontend": sink_endpoint, "g1": endpoints[0], "g1.backup": endpoints[1],
             "g2": sink_endpoint, "g2.backup": sink_endpoint}
    for name, role, endpoint in (("g1-p", "primary", endpoints[0]), ("g1-b", "backup", endpoints[1])):
        made.append(GraphOperator(GraphOperatorConfig(name=name, operator="g1", role=role, endpoint=endpoint,
                                                      graph=table, peers=peers)))
    return endpoints


@contextlib.contextmanager
def threaded_statemgr(window: int = 8):
    """A primary's StateManager with its copying thread, shipping to a PULL socket bound
    here: (the manager, the states it shipped from the loop, that socket); closed after."""
    from keel.services.graph.statemgr import StateManager

    ctx = zmq.Context()
    backup = ctx.socket(zmq.PULL)
    port = backup.bind_to_random_port("tcp://127.0.0.1")
    sent: list = []
    mgr = StateManager("g", 1, window=window, in_background=True, send=sent.append, ctx=ctx,
                       backup_endpoint=f"tcp://127.0.0.1:{port}")
    try:
        yield mgr, sent, backup
    finally:
        mgr.close()
        backup.close(0)
        ctx.term()
