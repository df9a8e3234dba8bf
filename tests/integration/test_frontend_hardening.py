"""Frontend defects found by hostile or careless clients, each against a live cluster
(frontend, dispatcher, builtin-model workers) started from a spec dict.

- a client that stops reading its replies costs only itself (non-blocking sends, a
  per-client queue of ``client_hwm`` replies), and the frontend still stops on SIGTERM;
- a large ``predict_batch`` completes (the client keeps a bounded window in flight);
- de-duplication is by (sender, request id): a reused id with another input is refused,
  another client's same id is its own request, errors are never remembered;
- a frame far above ``max_payload_bytes`` is refused before it is read.
"""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.client import WINDOW, Client
from keel.common.protocol import ErrorCode, Predict, Reply, Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 64, 10
PATIENT_MS = 10_000


def start(launcher, tmp_path, name: str, frontend: dict | None = None, models: dict | None = None):
    data = {
        "cluster": {"name": name, "base_port": free_port_block(), "run_dir": str(tmp_path / name)},
        "frontend": frontend or {},
        "models": models or {"echo": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT}},
    }
    spec = load_spec(data)
    run = launcher(name)
    run.start_spec(spec)
    return run, spec, spec.client_endpoints[0]


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, DIM), dtype=np.float32)


def head(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).reshape(-1)[:OUT]


def test_a_client_that_stops_reading_costs_only_itself(tmp_path, launcher, client, zsock):
    big = 1000  # 4 KB replies: the stuck client's kernel buffers fill quickly
    run, spec, endpoint = start(launcher, tmp_path, "stuck", frontend={"client_hwm": 20, "cache_size": 0},
                                models={"big": {"builtin": "noop", "input_shape": [8], "output_size": big}})
    stuck = zsock(zmq.DEALER)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.SNDHWM, 0)
    stuck.connect(endpoint)
    x = np.zeros(8, np.float32)
    for i in range(6000):  # ~24 MB of replies it never reads
        transport.send(stuck, Predict(request_id=f"s{i}", model="big", input=x, timeout_ms=PATIENT_MS))
    c = client(endpoint, timeout_ms=5000, retries=0)
    for i in range(20):
        result = c.predict("big", np.full(8, i, np.float32))
        assert result.source == Source.MODEL and result.output.shape == (big,), (result.source, result.error)
    deadline = time.monotonic() + 30
    while True:
        info = request_status(endpoint, 5.0)
        assert info is not None, "the frontend stopped answering"
        if info["answered"].get("reply_dropped", 0) > 0:
            break
        assert time.monotonic() < deadline, f"no reply to the stuck client was dropped: {info['answered']}"
        time.sleep(0.1)
    run.kill("frontend", signal.SIGTERM)  # waits up to 10 s for it to exit
    assert run.procs["frontend"].returncode == 0


class CountingClient(Client):
    """Records the most calls it ever had in flight."""

    most = 0

    def submit(self, *args, **kwargs) -> str:
        rid = super().submit(*args, **kwargs)
        self.most = max(self.most, len(self.calls))
        return rid


def test_large_predict_batch_completes(tmp_path, launcher):
    _, _, endpoint = start(launcher, tmp_path, "batch", frontend={"cache_size": 0},
                           models={"noop": {"builtin": "noop", "input_shape": [4], "output_size": 2}})
    xs = np.random.default_rng(1).random((50_000, 4), dtype=np.float32)
    with CountingClient(endpoint, timeout_ms=60_000, retries=0) as c:
        results = c.predict_batch("noop", xs)
    assert c.most <= WINDOW  # a bounded window, not 50,000 calls at once
    assert len(results) == 50_000
    assert all(r.source == Source.MODEL for r in results), {r.source for r in results}
    assert len({r.request_id for r in results}) == 50_000


@pytest.fixture(scope="module")
def echo(module_launcher, tmp_path_factory):
    _, spec, endpoint = start(module_launcher, tmp_path_factory.mktemp("echo"), "echo", frontend={"max_payload_bytes": 4096})
    return endpoint


def test_reused_request_id_with_another_input_is_refused(echo, client):
    c = client(echo, timeout_ms=PATIENT_MS)
    x, y = rows(2, 2)
    first = c.predict("echo", x, request_id="reused")
    assert first.source == Source.MODEL
    again = c.predict("echo", y, request_id="reused")
    assert again.source == Source.ERROR and again.error_code == ErrorCode.BAD_REQUEST
    assert "request id reused with a different input" in again.error
    retry = c.predict("echo", x, request_id="reused")
    assert retry.source == Source.MODEL
    np.testing.assert_array_equal(retry.output, head(x))


def test_same_request_id_from_another_client_is_its_own(echo, client):
    x, y = rows(2, 3)
    a = client(echo, timeout_ms=PATIENT_MS).predict("echo", x, request_id="shared-id")
    b = client(echo, timeout_ms=PATIENT_MS).predict("echo", y, request_id="shared-id")
    assert (a.source, b.source) == (Source.MODEL, Source.MODEL)
    np.testing.assert_array_equal(a.output, head(x))
    np.testing.assert_array_equal(b.output, head(y))


def test_an_error_reply_is_not_remembered(echo, client):
    c = client(echo, timeout_ms=PATIENT_MS)
    bad = c.predict("echo", np.zeros(DIM + 1, np.float32), request_id="was-bad")
    assert bad.error_code == ErrorCode.BAD_REQUEST
    x = rows(1, 4)[0]
    good = c.predict("echo", x, request_id="was-bad")
    assert good.source == Source.MODEL
    np.testing.assert_array_equal(good.output, head(x))


def test_empty_request_id_is_a_bad_request(echo, zsock):
    dealer = zsock(zmq.DEALER, connect=echo)
    frames = protocol.encode(Predict(request_id="x", model="echo", input=rows(1, 5)[0]))
    header = bytes(frames[0]).replace(b'"request_id":"x"', b'"request_id":""')
    dealer.send_multipart([header, *frames[1:]])
    assert dealer.poll(PATIENT_MS)
    reply = protocol.decode(dealer.recv_multipart())
    assert isinstance(reply, Reply) and reply.error_code == ErrorCode.BAD_REQUEST and "request_id" in reply.error


@pytest.mark.parametrize("mib", [8, 256])
def test_a_huge_frame_is_refused_before_it_is_read(echo, zsock, client, mib):
    """max_payload_bytes is 4096: a frame of ``mib`` MiB disconnects its sender unread (no
    reply comes: the frontend never held it), and everyone else is still served."""
    sender = zsock(zmq.DEALER, connect=echo)
    header = bytes(protocol.encode(Predict(request_id="huge", model="echo", input=np.zeros(DIM, np.float32)))[0])
    sender.send_multipart([header, bytearray(mib << 20)], copy=False)
    assert not sender.poll(1000), "the frame was read and answered"
    for seed in range(3):
        x = rows(1, 10 * mib + seed)[0]
        result = client(echo, timeout_ms=PATIENT_MS).predict("echo", x)
        assert result.source == Source.MODEL
        np.testing.assert_array_equal(result.output, head(x))


def test_a_client_may_not_send_control_messages(echo, zsock, client):
    """Configure (a rollout's control message) on the clients' port is refused and counted,
    and changes nothing: the version replies and cache keys name stays the served one."""
    dealer = zsock(zmq.DEALER, connect=echo)
    for msg in (protocol.Configure(model="echo", version="9"), protocol.Configure(slots=4),
                protocol.Status(service="x", info={"serving": {"echo": "9"}})):
        transport.send(dealer, msg)
        assert dealer.poll(PATIENT_MS)
        reply = protocol.decode(dealer.recv_multipart())
        assert isinstance(reply, Reply) and reply.error_code == ErrorCode.BAD_REQUEST, reply
        assert "may not send" in reply.error
    info = request_status(echo, 5.0)
    assert info["answered"]["refused_kind"] == 3
    assert info["serving"].get("echo", "1") == "1"
    result = client(echo, timeout_ms=PATIENT_MS).predict("echo", rows(1, 30)[0])
    assert result.source == Source.MODEL and result.version == "1"
