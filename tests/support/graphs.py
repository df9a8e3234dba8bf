"""Service graphs for the tests: a graph table, its cluster spec (``[graphs.graph]``, read by
``load_spec``), its processes (a frontend serving it as ``graph``, and its operators) started
and answering, and every request's reply through ``keel.Client``."""
from __future__ import annotations

import contextlib
import time

import numpy as np
import zmq

from keel.common import transport
from keel.common.client import Client
from keel.common.spec import load_spec
from keel.common.spec.graph import read_graph
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


def graph_spec(table: dict, name: str = "graph", **cluster):
    """The cluster spec of one graph, read as ``keel up`` reads it: ``table`` as
    ``[graphs.NAME]``, ports from a free block (``cluster``: more of the ``[cluster]`` table)."""
    return load_spec({"cluster": {"name": "graph-test", "base_port": free_port_block(64), **cluster},
                      "graphs": {name: table}})


def start(launcher, table):
    """The graph's processes (its spec's: a frontend serving it as ``graph``, its operators)
    started by ``launcher`` and answering; -> (graph, services, client endpoint)."""
    spec = launcher.start_spec(graph_spec(table), timeout_s=90.0)
    return read_graph(table), spec.services, spec.client_endpoints[0]


def ask(zsock, client, inputs, streams, timeout_s=60.0):
    """Send every request at once through ``keel.Client`` (its client id; a request not
    answered within half of ``timeout_s`` is sent again, which the frontend de-duplicates);
    the results by request index."""
    with Client([client], timeout_ms=500.0 * timeout_s, retries=1) as c:
        ids = [c.submit("graph", np.asarray(x, np.float32), key=str(int(s))) for x, s in zip(inputs, streams)]
        replies = {}
        deadline = time.monotonic() + timeout_s + 1.0
        while len(replies) < len(ids) and time.monotonic() < deadline:
            for result in c.collect(200):
                assert result.request_id not in replies, "two answers to one request"
                replies[result.request_id] = result
    assert len(replies) == len(ids), f"{len(ids) - len(replies)} requests unanswered"
    return [replies[rid] for rid in ids]


def status(svc, graph="graph"):
    """A graph process's status: an operator's, or the frontend's route to ``graph``."""
    if svc.role == "graph_operator":
        return transport.request_status(svc.config.status_endpoint)
    return transport.request_status(svc.config.client_endpoint)["graphs"][graph]


class InProcessG1:
    """g1's primary and backup of a GRU -> GRU table as GraphOperators in this process, ticked
    by the test; everything else they send (g1's outputs, the frontend's notices) goes to
    ``sink``, a PULL socket bound here, and ``push`` feeds the primary's inbox."""

    def __init__(self, primary, backup, push, sink, sink_endpoint: str):
        self.primary, self.backup, self.push, self.sink, self.sink_endpoint = primary, backup, push, sink, sink_endpoint

    def tick_until(self, done, limit_s: float = 10.0) -> bool:
        """Tick both until ``done()`` or ``limit_s``; whether it is done."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not done():
            self.primary.tick(0.005)
            self.backup.tick(0.001)
        return done()

    def outputs(self, wait_ms: int = 500) -> list:
        """The GraphRequests (g1's outputs) that reached the sink, until it is quiet ``wait_ms``."""
        from keel.common.protocol.codec import decode
        from keel.common.protocol.messages import GraphRequest

        got = []
        while self.sink.poll(wait_ms):
            msg = decode(self.sink.recv_multipart())
            if isinstance(msg, GraphRequest):
                got.append(msg)
        return got


@contextlib.contextmanager
def g1_in_process(table: dict):
    """An ``InProcessG1`` of ``table``, shut down and closed after. The operators' two ports
    come from a free block, not probed with ZeroMQ sockets: their close is finished by the
    I/O thread later, and the operator's bind raced it."""
    from keel.common.config import GraphOperatorConfig
    from keel.services.graph.operator import GraphOperator

    ctx = zmq.Context.instance()
    sink = ctx.socket(zmq.PULL)
    sink_endpoint = f"tcp://127.0.0.1:{sink.bind_to_random_port('tcp://127.0.0.1')}"
    made, push = [], None
    try:
        base = free_port_block(2)
        endpoints = [f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}"]
        peers = {"frontend": sink_endpoint, "g1": endpoints[0], "g1.backup": endpoints[1],
                 "g2": sink_endpoint, "g2.backup": sink_endpoint}
        for name, role, endpoint in (("g1-p", "primary", endpoints[0]), ("g1-b", "backup", endpoints[1])):
            made.append(GraphOperator(GraphOperatorConfig(name=name, operator="g1", role=role, endpoint=endpoint,
                                                          graph=table, peers=peers)))
        push = ctx.socket(zmq.PUSH)
        push.connect(endpoints[0])
        yield InProcessG1(*made, push, sink, sink_endpoint)
    finally:
        if push is not None:
            push.close(0)
        for op in made:
            op.shutdown()
        sink.close(0)


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
