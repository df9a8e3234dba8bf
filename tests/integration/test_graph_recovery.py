"""HAMS II with real processes: three manager replicas and a GRU -> GRU graph (NSPB, W=2),
every process traced. Under open load the stateful primary of g2 is SIGKILLed: its backup's
socket monitor reports it, the manager promotes the backup (a new epoch in the Raft log),
g1 resends by lineage what the applied state does not hold, the new primary re-runs it and
resends its saved outputs; every request is answered exactly once, from the model, and the
traces pass the HAMS invariants (one output per (operator, seq), durable before release)."""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import zmq

from chaos.invariants import CheckContext, Checker, graph_invariants, load_graph_traces
from common import protocol, transport
from common.protocol.messages import Predict
from common.spec.graph import graph_services, read_graph
from common.waiting import wait_until
from deploy.local import free_port_block
from deploy.manager_cli import LocalGroup
from tests.integration.test_graph import gru_chain, offline

pytestmark = pytest.mark.timeout(180)

N, KILL_AT = 240, 80


def start_graph(launcher, tmp_path, table, trace_dir):
    managers = LocalGroup(launcher("managers"), tmp_path / "journal")
    managers.start()
    managers.leader(timeout_s=30.0)
    graph = read_graph(table)
    services, client = graph_services(graph, free_port_block(64), trace_dir=str(trace_dir),
                                      manager=(managers.endpoints, managers.publish_endpoints))
    run = launcher("graph")
    probe = managers.client()
    by_name = {s.name: s for s in services}
    for svc in services:  # each primary before its backup: the manager makes it the holder
        run.start(svc)
        if svc.role == "graph_operator" and svc.config.role == "primary" and svc.config.operator in graph.stateful:
            group = f"graph/{svc.config.operator}"
            wait_until(lambda: probe.call("snapshot")["groups"].get(group, {}).get("holder") == svc.name, timeout_s=30.0)
    for svc in services:
        run.wait_status(svc.config.status_endpoint if svc.role == "graph_operator" else svc.config.client_endpoint)
    wait_until(lambda: all(s in probe.call("snapshot")["services"] for s in ("op-g1-backup", "op-g2-backup")),
               timeout_s=30.0)
    return managers, graph, run, by_name, client, probe


def open_load(zsock, client, inputs, streams, on_sent, gap_s=0.004, timeout_s=60.0):
    """Send at a fixed rate (open loop), calling ``on_sent(i)`` after each; the replies by index."""
    sock = zsock(zmq.DEALER, connect=client)
    replies: dict[str, list] = {}

    def drain(wait_ms: int) -> None:
        while sock.poll(wait_ms):
            msg = protocol.decode(sock.recv_multipart())
            replies.setdefault(msg.request_id, []).append(msg)
            wait_ms = 0

    for i, (x, s) in enumerate(zip(inputs, streams)):
        transport.send(sock, Predict(f"r{i}", "graph", np.asarray(x, np.float32), stream=int(s)))
        on_sent(i)
        drain(int(gap_s * 1000))
    deadline = time.monotonic() + timeout_s
    while sum(map(len, replies.values())) < len(inputs) and time.monotonic() < deadline:
        drain(200)
    drain(300)  # a second answer to anything would show up here
    return replies


def test_stateful_primary_sigkill_loses_nothing_and_conflicts_nothing(launcher, zsock, tmp_path):
    table = dict(gru_chain(max_batch=4), window=2)
    managers, graph, run, by_name, client, probe = start_graph(launcher, tmp_path, table, tmp_path / "trace")
    try:
        epoch_before = probe.call("snapshot")["groups"]["graph/g2"]["epoch"]
        rng = np.random.default_rng(11)
        inputs, streams = rng.normal(size=(N, 4)), rng.integers(0, 4, size=N)

        def on_sent(i):
            if i == KILL_AT:
                run.kill("op-g2", signal.SIGKILL)

        replies = open_load(zsock, client, inputs, streams, on_sent)
        assert len(replies) == N, f"{N - len(replies)} requests unanswered"
        assert all(len(r) == 1 for r in replies.values()), "a request got two answers"
        errors = [r[0].error for r in replies.values() if r[0].error]
        assert not errors, errors[:3]
        # the GRU is deterministic: the re-run gives what an offline run gives
        expected, _ = offline(graph, inputs, streams)
        got = np.stack([replies[f"r{i}"][0].output for i in range(N)])
        np.testing.assert_allclose(got, np.stack(expected), atol=1e-5)
        group = probe.call("snapshot")["groups"]["graph/g2"]
        assert group["holder"] == "op-g2-backup" and group["epoch"] > epoch_before
        st = transport.request_status(by_name["op-g2-backup"].config.status_endpoint)
        assert st["assignment"] == "primary" and st["takeovers"] == 1 and st["degraded"]
    finally:
        run.stop()
        managers.close()
    streams_ = load_graph_traces(str(tmp_path / "trace"))
    results = Checker(graph_invariants(graph.stateful)).run([], CheckContext(streams=streams_))
    assert all(r.ok for r in results), [r.to_dict() for r in results]
    takeovers = streams_.get("graph_takeover", [])
    assert [t["operator"] for t in takeovers] == ["g2"]
