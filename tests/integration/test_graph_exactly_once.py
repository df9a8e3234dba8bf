"""Exactly-once effects in a HAMS graph, with real operator processes (GRU -> GRU, each a
primary and a backup) and this test process as the graph's frontends: a PUSH of
``GraphRequest``s into g1 and a PULL per frontend for the outputs (``reply_to``) and the
durability notices. Every request key is sent again under a new origin (a client's retry:
after its first output left, interleaved from two frontend incarnations, back to back
before the first was applied, and after g2's primary was killed and its backup took
over): each GRU's state applies each key once, so every output equals an offline run that
applies each request once, and a retry gets the very output the first got."""
from __future__ import annotations

import dataclasses
import signal
import time

import numpy as np
import pytest
import zmq

from keel.chaos.graph_trials import gru_chain, start_graph
from keel.chaos.invariants import CheckContext, EachRequestAppliedOnce, load_graph_traces
from keel.common import protocol, transport
from keel.common.protocol.messages import GraphDurable, GraphRequest
from keel.common.spec.graph import FRONTEND, read_graph
from keel.common.waiting import wait_until
from keel.services.graph.models import run_offline
from tests.support.graphs import graph_spec, interleave_join, start, status

pytestmark = [pytest.mark.timeout(180)]


class FakeFrontend:
    """One frontend incarnation: numbers origins ``incarnation << 32 | n`` (keel.common.ids)
    and collects what comes back on its own graph endpoint."""

    def __init__(self, zsock, incarnation: int):
        self.pull = zsock(zmq.PULL, bind="tcp://127.0.0.1:*")
        self.endpoint = transport.endpoint_of(self.pull)
        self.pushes: list[zmq.Socket] = []  # one per operator the frontend feeds
        self.base, self.n = incarnation << 32, 0
        self.outputs: dict[int, GraphRequest] = {}  # origin -> the graph's output
        self.key_of: dict[int, str] = {}  # origin -> request key
        self.notices: list[GraphDurable] = []

    def connect(self, zsock, *endpoints: str) -> None:
        self.pushes = [zsock(zmq.PUSH, connect=e) for e in endpoints]

    def send(self, key: str, x: np.ndarray, stream: int) -> int:
        self.n += 1
        origin = self.base | self.n
        self.key_of[origin] = key
        for push in self.pushes:
            transport.send(push, GraphRequest(FRONTEND, origin, origin, stream, [], np.asarray(x, np.float32),
                                              request=key, reply_to=self.endpoint))
        return origin

    def drain(self, wait_ms: int = 0) -> None:
        while self.pull.poll(wait_ms):
            msg = protocol.decode(self.pull.recv_multipart())
            if isinstance(msg, GraphRequest):
                assert msg.error is None, msg.error
                assert msg.reply_to == self.endpoint and msg.request == self.key_of[msg.origin]
                self.outputs.setdefault(msg.origin, msg)
            elif isinstance(msg, GraphDurable):
                self.notices.append(msg)
            wait_ms = 0


def collect(frontends, want: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(len(f.outputs) for f in frontends) < want and time.monotonic() < deadline:
        for f in frontends:
            f.drain(50)
    assert sum(len(f.outputs) for f in frontends) >= want, f"{want - sum(len(f.outputs) for f in frontends)} outputs missing"


def by_key(frontends) -> dict[str, list[np.ndarray]]:
    """Every output that came back, by request key."""
    out: dict[str, list[np.ndarray]] = {}
    for f in frontends:
        for origin, msg in f.outputs.items():
            out.setdefault(f.key_of[origin], []).append(msg.input)
    return out


def start_operators(run, graph, a: FakeFrontend, b: FakeFrontend, roles: tuple[str, ...]) -> dict:
    """The graph's operator processes of ``roles``, sending to the test's two frontends
    (``a`` the first), started by ``run`` and answering; -> by name."""
    services = graph_spec(graph.to_dict()).services
    ops = [dataclasses.replace(s, config=dataclasses.replace(s.config, peers={**s.config.peers, FRONTEND: a.endpoint},
                                                             frontends=[a.endpoint, b.endpoint]))
           for s in services if s.role == "graph_operator" and s.config.role in roles]
    for svc in ops:
        run.start(svc)
    for svc in ops:
        run.wait_status(svc.config.status_endpoint)
    return {s.name: s for s in ops}


def test_every_retry_is_answered_with_the_first_output_and_applied_once(launcher, zsock, wait):
    table = gru_chain(max_batch=4)
    graph = read_graph(table)
    a, b = FakeFrontend(zsock, 7), FakeFrontend(zsock, 9)
    by_name = start_operators(launcher("exactly-once"), graph, a, b, ("primary", "backup"))
    g1 = by_name["op-g1"].config.endpoint
    a.connect(zsock, g1)
    b.connect(zsock, g1)

    rng = np.random.default_rng(3)
    n, m = 24, 12
    inputs, streams = rng.normal(size=(n + m + 4, 4)), rng.integers(0, 4, size=n + m + 4)
    streams[-4:] = range(4)  # the probes: one per stream, after everything
    keys = [protocol.request_key("client-1", f"r{i}") for i in range(n + m + 4)]
    # 1. every key once, through frontend a; its outputs leave
    for i in range(n):
        a.send(keys[i], inputs[i], streams[i])
    collect([a, b], n)
    first = by_key([a])
    # 2. every key again, after its first output left: interleaved from a (a reconnect) and b (a failover)
    for i in range(n):
        (a if i % 2 else b).send(keys[i], inputs[i], streams[i])
        (b if i % 2 else a).send(keys[i], inputs[i], streams[i])
    # 3. new keys, each sent twice back to back before the first was applied, from a and b
    for i in range(n, n + m):
        a.send(keys[i], inputs[i], streams[i])
        b.send(keys[i], inputs[i], streams[i])
    collect([a, b], 3 * n + 2 * m)
    # 4. a probe per stream: the final states equal an offline run's that applied each key once
    for i in range(n + m, n + m + 4):
        a.send(keys[i], inputs[i], streams[i])
    collect([a, b], 3 * n + 2 * m + 4)

    expected = run_offline(graph, inputs, streams)[0]
    got = by_key([a, b])
    for i, key in enumerate(keys):
        assert len(got[key]) == (3 if i < n else 2 if i < n + m else 1), key
        for out in got[key]:
            assert np.allclose(out, expected[i], atol=1e-5), (i, key)
        if i < n:  # the retry got the very output the first did (saved, not recomputed)
            assert all(np.array_equal(out, first[key][0]) for out in got[key]), key
    for op in ("op-g1", "op-g2"):  # each retry answered from the table: none applied
        info = status(by_name[op])
        assert info["duplicates"] == 2 * n + m and info["applied_requests"] == n + m + 4, (op, info)
    # the backups hold the same tables: every key applied once, as the primaries did
    for op in ("op-g1-backup", "op-g2-backup"):
        wait(lambda: status(by_name[op]).get("max_applied_seq") == 3 * n + 2 * m + 4 - 1, what=f"{op} applied all")
        assert status(by_name[op])["applied_requests"] == n + m + 4
    # durability notices reach both frontends
    wait(lambda: a.drain() or b.drain() or ({x.operator for x in a.notices} >= {"g1", "g2"}
                                            and {x.operator for x in b.notices} >= {"g1", "g2"}), what="notices at a and b")

    # GC per frontend incarnation: a's notice frees a's saved outputs only, never b's
    gc = zsock(zmq.PUSH, connect=by_name["op-g2"].config.endpoint)
    transport.send(gc, GraphDurable(FRONTEND, 1, a.base | a.n))
    b_rows = len(b.outputs)
    wait(lambda: status(by_name["op-g2"])["saved_outputs"] == b_rows, what="a's outputs freed, b's kept")
    transport.send(gc, GraphDurable(FRONTEND, 1, b.base | b.n))
    wait(lambda: status(by_name["op-g2"])["saved_outputs"] == 0, what="b's outputs freed")


def test_after_a_takeover_every_retry_is_still_applied_once(launcher, zsock, tmp_path):
    """g2's primary is SIGKILLed with requests in flight, after its backup applied the
    earlier ones; the manager promotes the backup, whose table came with the state it
    applied. Every key sent again is answered from a table (the first ones with their very
    first output) and applied nowhere again; keys in flight at the kill are applied once,
    by the old primary's state if it became durable, else by the new primary; probes show
    final states that hold each request once; the traces pass the at-most-once invariant."""
    table = gru_chain(max_batch=4)
    managers, graph, run, by_name, _, probe = start_graph(launcher, tmp_path / "journal", table, tmp_path / "trace")
    try:
        fe = FakeFrontend(zsock, 5)
        fe.connect(zsock, by_name["op-g1"].config.endpoint)
        rng = np.random.default_rng(4)
        n, m = 20, 12
        inputs, streams = rng.normal(size=(n + m + 4, 4)), rng.integers(0, 4, size=n + m + 4)
        streams[-4:] = range(4)
        keys = [protocol.request_key("client-2", f"r{i}") for i in range(n + m + 4)]
        for i in range(n):
            fe.send(keys[i], inputs[i], streams[i])
        collect([fe], n)
        first = by_key([fe])
        wait_until(lambda: status(by_name["op-g2-backup"]).get("max_applied_seq") == n - 1, timeout_s=20)
        for i in range(n, n + m):  # in flight at the kill
            fe.send(keys[i], inputs[i], streams[i])
        run.kill("op-g2", signal.SIGKILL)
        wait_until(lambda: status(by_name["op-g2-backup"]).get("assignment") == "primary", timeout_s=30)
        for i in range(n + m):  # every key again
            fe.send(keys[i], inputs[i], streams[i])
        collect([fe], n + m + n + m)
        for i in range(n + m, n + m + 4):  # a probe per stream
            fe.send(keys[i], inputs[i], streams[i])
        collect([fe], 2 * (n + m) + 4)
        new_primary = status(by_name["op-g2-backup"])
        assert new_primary["applied_requests"] == n + m + 4 and new_primary["duplicates"] == n + m, new_primary
    finally:
        run.stop()
        managers.close()
        managers.launcher.stop()
    expected = run_offline(graph, inputs, streams)[0]
    got = by_key([fe])
    for i, key in enumerate(keys):
        assert len(got[key]) == (2 if i < n + m else 1), key
        assert all(np.allclose(out, expected[i], atol=1e-5) for out in got[key]), (i, key)
        if i < n:
            assert all(np.array_equal(out, first[key][0]) for out in got[key]), key
    result = EachRequestAppliedOnce().check([], CheckContext(streams=load_graph_traces(tmp_path / "trace")))
    assert result.ok and result.checked >= 2 * (n + m + 4), result.detail


def test_stateless_operators_and_a_join_carry_the_request_key_to_the_stateful_join(launcher, zsock):
    """frontend -> (g1 stateful, m stateless) -> combining join j (stateful GRU): m keeps no
    table but passes each input's key and frontend on, j joins inputs by (frontend, origin)
    (two frontend incarnations interleave) and answers every retry from its table."""
    table = {"mode": "nspb", "input_shape": [4], "edges": [["frontend", "g1"], ["frontend", "m"], ["g1", "j"],
                                                          ["m", "j"], ["j", "frontend"]],
             "operators": {"g1": {"kind": "gru", "input_shape": [4], "output_shape": [3], "max_batch": 4},
                           "m": {"kind": "mlp", "input_shape": [4], "output_shape": [2], "max_batch": 4},
                           "j": {"kind": "gru", "input_shape": [5], "output_shape": [2], "max_batch": 4}}}
    graph = read_graph(table)
    a, b = FakeFrontend(zsock, 3), FakeFrontend(zsock, 4)
    by_name = start_operators(launcher("exactly-once-join"), graph, a, b, ("primary", "backup", "stateless"))
    for f in (a, b):
        f.connect(zsock, by_name["op-g1"].config.endpoint, by_name["op-m"].config.endpoint)
    rng = np.random.default_rng(5)
    n = 16
    inputs, streams = rng.normal(size=(n, 4)), rng.integers(0, 3, size=n)
    keys = [protocol.request_key("client-3", f"r{i}") for i in range(n)]
    for i in range(n // 2):
        a.send(keys[i], inputs[i], streams[i])
    collect([a, b], n // 2)
    for i in range(n // 2):  # the first half again from b, interleaved with the second half from a
        b.send(keys[i], inputs[i], streams[i])
        a.send(keys[n // 2 + i], inputs[n // 2 + i], streams[n // 2 + i])
    collect([a, b], n + n // 2)
    expected = run_offline(graph, inputs, streams)[0]
    got = by_key([a, b])
    for i, key in enumerate(keys):
        assert len(got[key]) == (2 if i < n // 2 else 1), key
        assert all(np.allclose(out, expected[i], atol=1e-5) for out in got[key]), (i, key)
    assert status(by_name["op-j"])["duplicates"] == n // 2 and status(by_name["op-g1"])["duplicates"] == n // 2
    assert status(by_name["op-m"])["applied_requests"] is None  # stateless: no table, re-run


def test_a_clients_retry_through_the_graph_frontend_is_answered_and_applied_once(launcher, zsock):
    """End to end: a client sends every request again with the same (client, request id), on
    a new connection. The frontend answers those retries from its de-duplication; after the
    frontend is SIGKILLed and restarted (its table gone, a new incarnation numbering each
    retry anew), the GRUs answer them from their tables: the same reply each time, and the
    states move once per request."""
    from keel.common.protocol.messages import Predict

    run = launcher("exactly-once-e2e")
    graph, services, client = start(run, gru_chain(max_batch=4))
    rng = np.random.default_rng(6)
    n = 30
    inputs, streams = rng.normal(size=(n + 3, 4)), rng.integers(0, 3, size=n + 3)
    streams[n:] = range(3)

    def ask(ids) -> dict:
        sock = zsock(zmq.DEALER, connect=client)  # a new connection each time, as after a reconnect
        for i in ids:
            transport.send(sock, Predict(f"r{i}", "graph", inputs[i].astype(np.float32), key=str(int(streams[i])),
                                         client="client-4"))
        replies, deadline = {}, time.monotonic() + 60
        while len(replies) < len(ids) and time.monotonic() < deadline:
            if sock.poll(200):
                msg = protocol.decode(sock.recv_multipart())
                replies[int(msg.request_id[1:])] = msg
        assert len(replies) == len(ids)
        assert all(r.error is None for r in replies.values()), [r.error for r in replies.values() if r.error]
        return replies

    first = ask(range(n))
    again = ask(range(n))  # the same frontend: its de-duplication answers, nothing reaches the graph
    assert all(np.array_equal(again[i].output, first[i].output) for i in range(n))
    by_name = {s.name: s for s in services}
    assert status(by_name["op-g1"])["duplicates"] == 0 and status(by_name["op-g2"])["duplicates"] == 0
    run.kill("frontend", signal.SIGKILL)  # its de-duplication table dies with it
    run.start(by_name["frontend"])
    run.wait_status(client, timeout_s=60)
    after = ask(range(n))  # retries the new incarnation sends into the graph: the tables answer
    assert all(np.array_equal(after[i].output, first[i].output) for i in range(n))
    probes = ask(range(n, n + 3))  # one per stream: the states applied each request once
    expected = run_offline(graph, inputs, streams)[0]
    assert all(np.allclose(r.output, expected[i], atol=1e-5) for i, r in {**first, **probes}.items())
    assert status(by_name["op-g1"])["duplicates"] == n and status(by_name["op-g2"])["duplicates"] == n


def test_behind_an_interleaving_join_each_input_of_a_request_is_applied_once(launcher, zsock):
    """An interleaving join takes an input of every request from each predecessor, each
    applied to its state: both are applied once (the table names an input key@predecessor),
    and a client's retry of every request through a restarted frontend is answered from the
    table, applying nothing."""
    from keel.common.protocol.messages import Predict

    table = interleave_join()
    run = launcher("exactly-once-interleave")
    graph, services, client = start(run, table)
    by_name = {s.name: s for s in services}
    rng = np.random.default_rng(8)
    n = 20
    inputs, streams = rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, size=n)
    for attempt in range(2):
        if attempt:  # a restarted frontend forgot the first answers: the retries reach the graph
            run.kill("frontend", signal.SIGKILL)
            run.start(by_name["frontend"])
            run.wait_status(client, timeout_s=60)
        sock = zsock(zmq.DEALER, connect=client)
        for i in range(n):
            transport.send(sock, Predict(f"r{i}", "graph", inputs[i], key=str(int(streams[i])), client="client-5"))
        replies, deadline = set(), time.monotonic() + 60
        while len(replies) < n and time.monotonic() < deadline:
            if sock.poll(200):
                msg = protocol.decode(sock.recv_multipart())
                assert msg.error is None, msg.error
                replies.add(msg.request_id)
        assert len(replies) == n, attempt
    j = status(by_name["op-j"])
    assert j["rows"] == 4 * n and j["applied_requests"] == 2 * n and j["duplicates"] == 2 * n, j
