"""Keel serving end to end: real frontend, dispatcher and worker processes on free loopback
ports (a cluster spec started by deploy.local.Launcher), builtin models, the client library and raw DEALERs.

The builtin ``sleep`` model answers the first ``output_size`` input features (after its
fixed cost), so every output can be checked against its input; ``noop`` answers zeros.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter

import numpy as np
import orjson
import pytest
import zmq

from keel.common import loadgen, protocol
from keel.common.async_client import AsyncClient
from keel.common.protocol import ErrorCode, Heartbeat, Predict, Reply, Source
from keel.common.spec import ClusterSpec, load_spec
from keel.common.transport import request_status
from keel.deploy.local import Launcher, free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 64, 10
DEFAULT = [-1.0] * OUT
PATIENT_MS = 10_000  # deadlines far beyond what a loaded 2-core machine needs


def head(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).reshape(-1)[:OUT]


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, DIM), dtype=np.float32)


def sleep_model(fixed_ms: float = 0.0, **options) -> dict:
    """A ``[models.NAME]`` table: the builtin sleep model, one worker."""
    return {"builtin": "sleep", "fixed_ms": fixed_ms, "input_shape": [DIM], "output_size": OUT, **options}


def start(launcher: Launcher, models: dict, **tables) -> ClusterSpec:
    """A spec of ``models`` (plus [frontend], [dispatcher], [worker] ``tables``) on free
    loopback ports, started and ready (every worker registered)."""
    spec = load_spec({"cluster": {"name": "itest", "base_port": free_port_block(), "run_dir": str(launcher.log_dir)},
                      "models": models, **tables})
    return launcher.start_spec(spec)


def dispatcher_endpoint(cluster: ClusterSpec) -> str:
    return cluster.service("dispatcher").config.worker_endpoint


@pytest.fixture(scope="module")
def serving(module_launcher):
    """One cluster for the tests that do not change its configuration."""
    launcher = module_launcher("serving")
    cluster = start(
        launcher,
        models={
            "echo": sleep_model(),
            "noop": {"builtin": "noop", "input_shape": [8], "output_size": 3},
            "shared": sleep_model(fixed_ms=300.0),
            "slow": sleep_model(fixed_ms=1000.0, default_output=DEFAULT),
            "slow-nodefault": sleep_model(fixed_ms=1000.0),
        },
        frontend={"max_payload_bytes": 4096},
    )
    return launcher, cluster


def frontend_status(cluster) -> dict:
    info = request_status(cluster.client_endpoints[0], 5.0)
    assert info is not None, "the frontend did not answer a status request"
    return info


def worker_batches(cluster, worker: str) -> int:
    info = request_status(dispatcher_endpoint(cluster), 5.0)
    assert info is not None, "the dispatcher did not answer a status request"
    return info["workers"][worker]["batches"]


def assert_serving(client, cluster, seed: int = 0) -> None:
    """The frontend still answers a good query correctly."""
    x = rows(1, 10_000 + seed)[0]
    result = client(cluster.client_endpoints[0], timeout_ms=PATIENT_MS).predict("echo", x)
    assert result.source in (Source.MODEL, Source.CACHE) and result.error is None
    np.testing.assert_array_equal(result.output, head(x))


def collect_all(c, rids: list[str], timeout_s: float = 30.0) -> dict:
    """Results of the submitted ``rids``, each exactly once; fails on anything else."""
    got: dict = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(rids):
        assert time.monotonic() < deadline, f"{len(rids) - len(got)} of {len(rids)} calls unanswered"
        for result in c.collect(50.0):
            assert result.request_id in rids and result.request_id not in got, result
            got[result.request_id] = result
    return got


def ask(sock: zmq.Socket, frames: list, timeout_s: float = 10.0) -> Reply:
    """Send raw frames on a DEALER and return the Reply that comes back."""
    sock.send_multipart(frames)
    assert sock.poll(int(timeout_s * 1000)), f"no reply within {timeout_s} s"
    reply = protocol.decode(sock.recv_multipart())
    assert isinstance(reply, Reply)
    return reply


# --------------------------------------------------------------------------- answers


def test_single_predict(serving, client):
    _, cluster = serving
    x = rows(1, 1)[0]
    result = client(cluster.client_endpoints[0]).predict("echo", x, timeout_ms=PATIENT_MS)
    assert result.source == Source.MODEL and result.ok
    assert result.model == "echo" and result.version == "1" and result.error_code is None
    np.testing.assert_array_equal(result.output, head(x))


def test_both_client_endpoints_answer_and_the_hops_are_ipc(serving, client):
    """A cluster on one machine: its own hops over ipc, its client ROUTER on TCP and on
    the ipc twin clients on this machine use (the gateway, ``keel predict``)."""
    _, cluster = serving
    assert cluster.service("dispatcher").config.query_endpoint.startswith("ipc://@keel-itest-")
    tcp, local = cluster.client_endpoints[0], cluster.local_client_endpoints[0]
    assert tcp.startswith("tcp://") and local.startswith("ipc://@keel-itest-")
    xs = rows(2, 11)
    for endpoint, x in zip((tcp, local), xs):
        result = client(endpoint).predict("echo", x, timeout_ms=PATIENT_MS)
        assert result.source == Source.MODEL and result.ok
        np.testing.assert_array_equal(result.output, head(x))
    assert request_status(local, 5.0)["role"] == "frontend"


def test_noop_answers_zeros(serving, client):
    _, cluster = serving
    result = client(cluster.client_endpoints[0]).predict("noop", np.arange(8, dtype=np.float32), timeout_ms=PATIENT_MS)
    assert result.source == Source.MODEL
    np.testing.assert_array_equal(result.output, np.zeros(3, np.float32))


def test_batch_predict_answers_each_once(serving, client):
    _, cluster = serving
    xs = rows(300, 2)
    c = client(cluster.client_endpoints[0], timeout_ms=PATIENT_MS)
    results = c.predict_batch("echo", xs)
    assert len(results) == 300
    assert len({r.request_id for r in results}) == 300
    for x, result in zip(xs, results):
        assert result.source == Source.MODEL, result.error
        np.testing.assert_array_equal(result.output, head(x))
    assert c.collect(0) == []  # nothing else came


def test_async_client(serving):
    _, cluster = serving
    xs = rows(20, 3)

    async def run():
        ac = AsyncClient(cluster.client_endpoints[0], timeout_ms=PATIENT_MS)
        try:
            one = await ac.predict("echo", xs[0])
            many = await ac.predict_batch("echo", xs[1:])
            return [one, *many]
        finally:
            await ac.close()

    results = asyncio.run(run())
    assert [r.source for r in results] == [Source.MODEL] * 20
    for x, result in zip(xs, results):
        np.testing.assert_array_equal(result.output, head(x))


# --------------------------------------------------------------------------- cache, sharing, retries


def test_repeated_input_is_a_cache_hit(serving, client):
    _, cluster = serving
    c = client(cluster.client_endpoints[0], timeout_ms=PATIENT_MS)
    x = rows(1, 4)[0]
    first = c.predict("echo", x)
    hits = frontend_status(cluster)["cache"]["hits"]
    second = c.predict("echo", x.copy())
    assert (first.source, second.source) == (Source.MODEL, Source.CACHE)
    assert first.request_id != second.request_id
    np.testing.assert_array_equal(second.output, head(x))
    assert frontend_status(cluster)["cache"]["hits"] == hits + 1


def test_concurrent_identical_requests_share_one_computation(serving, client, wait):
    _, cluster = serving
    c = client(cluster.client_endpoints[0], timeout_ms=PATIENT_MS)
    x = rows(1, 5)[0]
    before = worker_batches(cluster, "worker-shared-0")
    rids = [c.submit("shared", x) for _ in range(6)]
    results = collect_all(c, rids)
    assert {r.source for r in results.values()} == {Source.MODEL}
    for result in results.values():
        np.testing.assert_array_equal(result.output, head(x))
    # Every answer was delivered after the one computation finished, and its Done follows
    # its predictions; six computations would show up as six batches.
    wait(lambda: worker_batches(cluster, "worker-shared-0") > before, what="the batch counted")
    assert worker_batches(cluster, "worker-shared-0") == before + 1


def test_retried_request_id_is_answered_the_same(serving, client):
    _, cluster = serving
    c = client(cluster.client_endpoints[0], timeout_ms=PATIENT_MS)
    x = rows(1, 6)[0]
    rid = f"retry-{uuid.uuid4().hex}"
    duplicates = frontend_status(cluster)["answered"].get("duplicate", 0)
    first = c.predict("echo", x, request_id=rid)
    again = c.predict("echo", x, request_id=rid)
    assert first.request_id == again.request_id == rid
    # the remembered answer, not a cache lookup: same source, same output
    assert (first.source, again.source) == (Source.MODEL, Source.MODEL)
    np.testing.assert_array_equal(again.output, first.output)
    assert frontend_status(cluster)["answered"]["duplicate"] == duplicates + 1


def test_retry_while_pending_is_computed_once(serving, zsock, wait):
    _, cluster = serving
    dealer = zsock(zmq.DEALER, connect=cluster.client_endpoints[0])
    x = rows(1, 7)[0]
    rid = f"pending-{uuid.uuid4().hex}"
    before = worker_batches(cluster, "worker-shared-0")
    frames = protocol.encode(Predict(request_id=rid, model="shared", input=x, timeout_ms=PATIENT_MS))
    dealer.send_multipart(frames)
    dealer.send_multipart(frames)  # the retry, while the first is still computing
    replies = []
    for _ in range(2):
        assert dealer.poll(PATIENT_MS), "no reply"
        replies.append(protocol.decode(dealer.recv_multipart()))
    assert [r.request_id for r in replies] == [rid, rid]
    assert [r.source for r in replies] == [Source.MODEL, Source.MODEL]
    for r in replies:
        np.testing.assert_array_equal(r.output, head(x))
    # The worker answers the frontend before it tells the dispatcher the batch is done.
    wait(lambda: worker_batches(cluster, "worker-shared-0") > before, what="the batch counted")
    assert worker_batches(cluster, "worker-shared-0") == before + 1


# --------------------------------------------------------------------------- deadlines


def test_deadline_answers_the_default_output(serving, client):
    _, cluster = serving
    c = client(cluster.client_endpoints[0])
    result = c.predict("slow", rows(1, 8)[0], timeout_ms=100)
    assert result.source == Source.DEFAULT and result.error_code is None
    np.testing.assert_array_equal(result.output, np.asarray(DEFAULT, np.float32))


def test_deadline_without_default_is_a_deadline_error(serving, client):
    _, cluster = serving
    c = client(cluster.client_endpoints[0])
    result = c.predict("slow-nodefault", rows(1, 9)[0], timeout_ms=100)
    assert result.source == Source.DEFAULT
    assert result.output is None and result.error_code == ErrorCode.DEADLINE and result.error


# --------------------------------------------------------------------------- bad input


def good_header(**overrides) -> dict:
    frames = protocol.encode(Predict(request_id="raw-1", model="echo", input=np.zeros(DIM, np.float32)))
    head_ = orjson.loads(bytes(frames[0]))
    head_.update(overrides)
    return head_


RAW_CASES = {
    "random bytes": lambda: [os.urandom(40), os.urandom(7)],
    "one random frame": lambda: [b"\x01" + os.urandom(100)],
    "non-JSON header": lambda: [b"{this is not json", bytes(DIM * 4)],
    "header not an object": lambda: [b"[1, 2, 3]", bytes(DIM * 4)],
    "wrong protocol version": lambda: [orjson.dumps(good_header(v=protocol.PROTOCOL_VERSION + 1)), bytes(DIM * 4)],
    "unknown kind": lambda: [orjson.dumps(good_header(kind="predictt")), bytes(DIM * 4)],
    "kind not a string": lambda: [orjson.dumps(good_header(kind=["predict"])), bytes(DIM * 4)],
    "missing request id": lambda: [orjson.dumps({k: v for k, v in good_header().items() if k != "request_id"}), bytes(DIM * 4)],
    "short tensor frame": lambda: [orjson.dumps(good_header()), bytes(DIM * 4 - 1)],
    "no tensor at all": lambda: [orjson.dumps(good_header(tensors=[None]))],
    "disallowed dtype": lambda: [orjson.dumps(good_header(tensors=[{"dtype": "complex64", "shape": [DIM]}])), bytes(DIM * 8)],
    "not a client message": lambda: protocol.encode(Heartbeat(sender="me")),
}


@pytest.mark.parametrize("case", sorted(RAW_CASES))
def test_garbage_frames_get_bad_request(serving, zsock, client, case):
    _, cluster = serving
    dealer = zsock(zmq.DEALER, connect=cluster.client_endpoints[0])
    reply = ask(dealer, RAW_CASES[case]())
    assert reply.source == Source.ERROR and reply.error_code == ErrorCode.BAD_REQUEST, reply
    assert reply.output is None and reply.error
    assert_serving(client, cluster, seed=hash(case) % 1000)


def test_wrong_version_error_says_so(serving, zsock):
    _, cluster = serving
    dealer = zsock(zmq.DEALER, connect=cluster.client_endpoints[0])
    reply = ask(dealer, RAW_CASES["wrong protocol version"]())
    assert "version" in reply.error


def test_malformed_request_keeps_its_request_id(serving, zsock):
    """The error of a decodable header with a bad tensor reaches the call that made it."""
    _, cluster = serving
    dealer = zsock(zmq.DEALER, connect=cluster.client_endpoints[0])
    reply = ask(dealer, [orjson.dumps(good_header(request_id="mine")), b"short"])
    assert reply.request_id == "mine" and reply.error_code == ErrorCode.BAD_REQUEST


BAD_INPUTS = {
    "wrong dtype": ("echo", lambda: np.zeros(DIM, np.float64), ErrorCode.BAD_REQUEST, "float32"),
    "wrong shape": ("echo", lambda: np.zeros(DIM - 1, np.float32), ErrorCode.BAD_REQUEST, "shape"),
    "extra axis": ("echo", lambda: np.zeros((1, DIM), np.float32), ErrorCode.BAD_REQUEST, "shape"),
    "NaN": ("echo", lambda: np.where(np.arange(DIM) == 3, np.nan, 0).astype(np.float32), ErrorCode.BAD_REQUEST, "NaN"),
    "infinity": ("echo", lambda: np.full(DIM, np.inf, np.float32), ErrorCode.BAD_REQUEST, "infinity"),
    "oversized": ("echo", lambda: np.zeros(2048, np.float32), ErrorCode.BAD_REQUEST, "exceeds"),
    "unknown model": ("no-such-model", lambda: np.zeros(DIM, np.float32), ErrorCode.UNKNOWN_MODEL, "no-such-model"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gets_a_clear_error(serving, client, case):
    _, cluster = serving
    model, make, code, words = BAD_INPUTS[case]
    c = client(cluster.client_endpoints[0], timeout_ms=PATIENT_MS)
    result = c.predict(model, make())
    assert result.source == Source.ERROR and result.error_code == code, result
    assert result.output is None and words in result.error
    assert_serving(client, cluster, seed=len(case))


def test_columns_of_queries_are_each_answered_and_bad_ones_refused_clearly(serving, zsock, client):
    """Queries as columns (``Predicts``) on the client port: each row answered on its own, a
    bad row (NaN) refused alone, a column of the wrong dtype or of an unknown model refused a
    row at a time, a column over 64 KiB refused under its first id; the frontend serves on."""
    _, cluster = serving
    dealer = zsock(zmq.DEALER, connect=cluster.client_endpoints[0])

    def send(rids: list[str], model: str, inputs: np.ndarray) -> dict:
        dealer.send_multipart(protocol.encode(protocol.Predicts(request_ids=rids, model=model, inputs=inputs,
                                                                timeouts_ms=[float(PATIENT_MS)] * len(rids))))
        got = {}
        while len(got) < len(rids):
            assert dealer.poll(10_000), f"no reply for {sorted(set(rids) - set(got))}"
            for reply in protocol.decode_all(dealer.recv_multipart()):
                assert isinstance(reply, Reply)
                got[reply.request_id] = reply
        return got

    xs = rows(4, 77)
    xs[1, 5] = np.nan
    got = send([f"col-{i}" for i in range(4)], "echo", xs)
    assert got["col-1"].error_code == ErrorCode.BAD_REQUEST and "NaN" in got["col-1"].error
    for i in (0, 2, 3):
        assert got[f"col-{i}"].source in (Source.MODEL, Source.CACHE)
        np.testing.assert_array_equal(got[f"col-{i}"].output, head(xs[i]))
    wrong = send(["dt-0", "dt-1"], "echo", np.zeros((2, DIM), np.float64))
    assert all(r.error_code == ErrorCode.BAD_REQUEST and "float32" in r.error for r in wrong.values())
    unknown = send(["um-0", "um-1"], "no-such-model", rows(2, 78))
    assert all(r.error_code == ErrorCode.UNKNOWN_MODEL for r in unknown.values())
    too_big = np.zeros((2, protocol.MAX_COLUMN_BYTES // 8 + 1), np.float32)  # within a frame's bound, over a column's
    refused = ask(dealer, protocol.encode(protocol.Predicts(request_ids=["big-0", "big-1"], model="echo", inputs=too_big)))
    assert refused.request_id == "big-0" and refused.error_code == ErrorCode.BAD_REQUEST
    assert str(protocol.MAX_COLUMN_BYTES) in refused.error
    assert_serving(client, cluster, seed=77)


# --------------------------------------------------------------------------- status


def test_status_of_frontend_and_dispatcher(serving):
    _, cluster = serving
    fe = frontend_status(cluster)
    assert fe["role"] == "frontend" and fe["models"] == ["echo", "noop", "shared", "slow", "slow-nodefault"]
    assert fe["cache"] is not None and fe["pending"] >= 0
    dp = request_status(dispatcher_endpoint(cluster), 5.0)
    assert dp is not None and dp["role"] == "dispatcher"
    assert set(dp["workers"]) == {"worker-echo-0", "worker-noop-0", "worker-shared-0", "worker-slow-0",
                                  "worker-slow-nodefault-0"}
    assert dp["workers"]["worker-echo-0"]["model"] == "echo"
    assert set(dp["queues"]) == {"echo", "noop", "shared", "slow", "slow-nodefault"}


# --------------------------------------------------------------------------- own clusters


def test_overload_is_refused_not_queued(launcher, client):
    cluster = start(
        launcher("overload"),
        models={"slow": sleep_model(fixed_ms=300.0, fixed_batch=1)},
        frontend={"admission_limit": 2, "cache_size": 0},
    )
    c = client(cluster.client_endpoints[0], timeout_ms=PATIENT_MS)
    xs = rows(8, 11)
    results = c.predict_batch("slow", xs)
    codes = Counter(r.error_code for r in results)
    assert codes[ErrorCode.OVERLOADED] >= 1 and codes[None] >= 2, codes  # both admission places used
    assert codes[ErrorCode.OVERLOADED] + codes[None] == 8, codes
    for x, r in zip(xs, results):
        if r.error_code is None:
            assert r.source == Source.MODEL
            np.testing.assert_array_equal(r.output, head(x))
        else:
            assert r.source == Source.ERROR and r.output is None
    # load gone: admitted again
    assert c.predict("slow", xs[0]).source == Source.MODEL


class RecordingClient:
    """A Client for loadgen.open_loop that keeps every result and, once ``kill_after``
    results are in, SIGKILLs ``victim`` while the dispatcher shows it holding a batch."""

    def __init__(self, inner, kill_after: int, kill) -> None:
        self.inner, self.kill_after, self.kill = inner, kill_after, kill
        self.results: list = []
        self.killed_at: int | None = None  # results received when the kill happened

    def submit(self, *args, **kwargs) -> str:
        return self.inner.submit(*args, **kwargs)

    def collect(self, timeout_ms: float = 0.0) -> list:
        got = self.inner.collect(timeout_ms)
        self.results.extend(got)
        if self.killed_at is None and len(self.results) >= self.kill_after and self.kill():
            self.killed_at = len(self.results)
        return got


def test_worker_killed_under_open_loop_load_loses_nothing(launcher, client):
    run = launcher("kill")
    cluster = start(
        run,
        models={"sleep": sleep_model(fixed_ms=15.0, fixed_batch=1, workers=3)},
        frontend={"cache_size": 0},
        worker={"heartbeat_interval_s": 0.1},
        dispatcher={"heartbeat_interval_s": 0.1, "heartbeat_liveness": 4},
    )
    victim = "worker-sleep-1"

    def kill_when_busy() -> bool:
        info = request_status(dispatcher_endpoint(cluster), 1.0)
        if info is None or info["workers"].get(victim, {}).get("inflight", 0) == 0:
            return False
        run.kill(victim, signal.SIGKILL)
        return True

    count = 300
    inputs = rows(count, 12)
    recorder = RecordingClient(client(cluster.client_endpoints[0], timeout_ms=PATIENT_MS), count // 4, kill_when_busy)
    records = loadgen.open_loop(recorder, "sleep", inputs, rate=300.0, count=count, seed=5,
                                timeout_ms=PATIENT_MS, drain_s=30.0, keep_outputs=True)

    assert recorder.killed_at is not None and recorder.killed_at < count, "the worker was not killed mid-run"
    assert run.procs[victim].poll() is not None
    assert len(records) == count
    ids = Counter(r.request_id for r in recorder.results)
    assert len(ids) == count and set(ids.values()) == {1}, "lost or duplicated answers"
    assert {r.request_id for r in records} == set(ids)
    for rec in records:
        assert rec.source == Source.MODEL, (rec.request_id, rec.source, rec.error_code)
        np.testing.assert_array_equal(rec.output, head(inputs[rec.index]))
    fe = frontend_status(cluster)
    assert fe["answered"].get(Source.MODEL) == count and "duplicate" not in fe["answered"]
    dp = request_status(dispatcher_endpoint(cluster), 5.0)
    assert victim not in dp["workers"] and set(dp["workers"]) == {"worker-sleep-0", "worker-sleep-2"}
    assert dp["requeued"] >= 1  # the victim held a batch when it died; it was served elsewhere
