"""One frontend, the one front door, with real processes: a spec holding a plain model, an
application and a stateful HAMS graph comes up and one frontend answers all three; a
graph request retried (same client, same request id, another connection) changes the
graph's state once; a frontend restarted under graph load answers new requests (its
origins, of a new incarnation, are not confused with the old ones)."""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.protocol import Source
from keel.common.protocol.messages import Predict
from keel.common.spec import load_spec
from keel.common.spec.graph import read_graph
from keel.deploy.local import free_port_block
from keel.services.graph.models import run_offline
from tests.support.graphs import gru_chain

pytestmark = pytest.mark.timeout(240)

DIM = 4


@pytest.fixture(scope="module")
def cluster(module_launcher, tmp_path_factory):
    launcher = module_launcher("front-door")
    noop = {"builtin": "noop", "input_shape": [DIM], "output_size": 3}
    spec = load_spec({
        "cluster": {"name": "front-door", "base_port": free_port_block(), "run_dir": str(tmp_path_factory.mktemp("run"))},
        "models": {"m": noop, "m2": noop},
        "applications": {"app": {"models": ["m", "m2"], "policy": "exp4"}},
        "graphs": {"chain": gru_chain()},
    })
    launcher.start_spec(spec, timeout_s=120)
    return launcher, spec


def receive(sock: zmq.Socket, n: int, timeout_s: float = 60.0) -> dict:
    """``n`` replies by request id; a second answer to one request fails the test."""
    replies: dict = {}
    deadline = time.monotonic() + timeout_s
    while len(replies) < n and time.monotonic() < deadline:
        if sock.poll(200):
            msg = protocol.decode(sock.recv_multipart())
            assert msg.request_id not in replies, "two answers to one request"
            replies[msg.request_id] = msg
    assert len(replies) == n, f"{n - len(replies)} unanswered"
    return replies


def x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=DIM).astype(np.float32)


def test_one_frontend_answers_a_model_an_application_and_a_graph(cluster, zsock):
    launcher, spec = cluster
    assert [s.name for s in spec.role("frontend")] == ["frontend"] and spec.client_endpoints == [
        spec.service("frontend").config.client_endpoint]
    sock = zsock(zmq.DEALER, connect=spec.client_endpoints[0])
    transport.send(sock, Predict("model", "m", x(1), timeout_ms=10_000))
    transport.send(sock, Predict("app", "app", x(2), key="alice", timeout_ms=10_000))
    transport.send(sock, Predict("graph", "chain", x(3), key="3"))
    replies = receive(sock, 3)
    assert all(r.error is None for r in replies.values()), {k: r.error for k, r in replies.items()}
    assert replies["model"].source == Source.MODEL and replies["model"].model == "m"
    assert replies["app"].source in (Source.ENSEMBLE, Source.PARTIAL) and replies["app"].models
    expected, _ = run_offline(read_graph(gru_chain()), [x(3)], [3])
    np.testing.assert_allclose(replies["graph"].output, expected[0], atol=1e-5)
    info = transport.request_status(spec.client_endpoints[0])
    kinds = {name: t["kind"] for name, t in info["targets"].items()}
    assert kinds == {"m": "model", "m2": "model", "app": "application", "chain": "graph"}
    assert info["targets"]["chain"]["key"] is True and info["targets"]["chain"]["mode"] == "nspb"
    assert info["graphs"]["chain"]["answered"] >= 1


def test_a_retried_graph_request_changes_the_state_once(cluster, zsock):
    """The same request (client id, request id) from a second connection while in flight,
    then once more after its answer: one answer, the same, and the stream's state took it
    once -- the next request's output equals an offline run of the two inputs."""
    launcher, spec = cluster
    first = zsock(zmq.DEALER, connect=spec.client_endpoints[0])
    second = zsock(zmq.DEALER, connect=spec.client_endpoints[0])
    before = transport.request_status(spec.client_endpoints[0])["graphs"]["chain"]["answered"]
    transport.send(first, Predict("once", "chain", x(10), key="5", client="retrier"))
    transport.send(second, Predict("once", "chain", x(10), key="5", client="retrier"))
    a, b = receive(first, 1)["once"], receive(second, 1)["once"]
    transport.send(second, Predict("once", "chain", x(10), key="5", client="retrier"))  # after the answer
    c = receive(second, 1)["once"]
    assert a.error is None and np.array_equal(a.output, b.output) and np.array_equal(a.output, c.output)
    transport.send(first, Predict("next", "chain", x(11), key="5", client="retrier"))
    nxt = receive(first, 1)["next"]
    expected, _ = run_offline(read_graph(gru_chain()), [x(10), x(11)], [5, 5])
    np.testing.assert_allclose(a.output, expected[0], atol=1e-5)
    np.testing.assert_allclose(nxt.output, expected[1], atol=1e-5)  # the retries never reached the state
    info = transport.request_status(spec.client_endpoints[0])
    assert info["graphs"]["chain"]["answered"] == before + 2 and info["answered"]["duplicate"] >= 1


def test_the_only_frontend_restarted_under_graph_load_answers_new_requests(cluster, zsock):
    launcher, spec = cluster
    endpoint = spec.client_endpoints[0]
    old = transport.request_status(endpoint)["graphs"]["chain"]["epoch"]
    load = zsock(zmq.DEALER, connect=endpoint)
    for i in range(30):  # in the graph (or held) when the frontend dies
        transport.send(load, Predict(f"old{i}", "chain", x(100 + i), key="7"))
    time.sleep(0.05)
    launcher.kill("frontend", signal.SIGKILL)
    launcher.start(spec.service("frontend"))
    launcher.wait_status(endpoint, timeout_s=60)
    info = transport.request_status(endpoint)["graphs"]["chain"]
    assert info["epoch"] > old  # a new incarnation: origins the operators have seen are never reused
    sock = zsock(zmq.DEALER, connect=endpoint)
    inputs = [x(200 + i) for i in range(20)]
    for i, row in enumerate(inputs):
        transport.send(sock, Predict(f"new{i}", "chain", row, key="9"))
    replies = receive(sock, 20)
    assert all(r.error is None for r in replies.values()), [r.error for r in replies.values() if r.error][:3]
    expected, _ = run_offline(read_graph(gru_chain()), inputs, [9] * 20)  # a fresh stream: only the new requests
    np.testing.assert_allclose(np.stack([replies[f"new{i}"].output for i in range(20)]), np.stack(expected), atol=1e-5)
