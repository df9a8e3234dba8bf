"""Cancellation end to end, with real processes (gateway with HTTP and gRPC, frontend,
dispatcher, workers of the builtin ``sleep`` model, slow enough that requests really wait):
a client cancelling 1,000 queued requests under load frees the frontend's and the
dispatcher's state for them and no worker runs them; an asyncio task and a future
cancelled, an HTTP client that hangs up mid-request and a gRPC call cancelled each reach
the frontend as a cancel (its ``answered.cancelled``).

How long after the hang-up or the cancel the frontend saw it is printed (the frontend's
``cancelled`` log line's timestamp against the test's clock when it closed or cancelled),
not asserted: tests assert behaviour, never speed."""
from __future__ import annotations

import asyncio
import datetime
import socket
import threading
import time

import numpy as np
import orjson
import pytest

from keel.common.async_client import AsyncClient
from keel.common.client import Client
from keel.common.futures_client import FuturesClient
from keel.common.protocol import ErrorCode, Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port, free_port_block

pytestmark = pytest.mark.slow

DIM, OUT = 4, 2


@pytest.fixture(scope="module")
def cluster(module_launcher):
    run = module_launcher("cancel")
    http, grpc_port = free_port(), free_port()
    spec = load_spec({
        "cluster": {"name": "cancel", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": http, "grpc_port": grpc_port},
        "frontend": {"cache_size": 0},
        "models": {
            # one query a batch, 20 ms each: a thousand wait ~20 s in the dispatcher's queue
            "slow": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "fixed_ms": 20.0,
                     "fixed_batch": 1, "max_batch": 1, "workers": 1},
            # a request here is in flight for seconds: long enough to hang up on
            "stuck": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "fixed_ms": 3000.0,
                      "fixed_batch": 1, "max_batch": 1, "workers": 1, "deadline_ms": 30_000},
        },
    })
    run.start_spec(spec)
    return run, spec, http, grpc_port


def status(spec, name: str) -> dict:
    info = request_status(spec.status_endpoints()[name], 2.0)
    assert info is not None, f"{name} did not answer its status"
    return info


def wait_for(condition, timeout_s: float = 20.0, what: str = "condition"):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"{what} did not hold within {timeout_s} s")


def cancelled(spec) -> int:
    return status(spec, "frontend")["answered"].get("cancelled", 0)


def idle(spec) -> bool:
    """Nothing held for any request: the frontend's and the dispatcher's counts at zero."""
    front, disp = status(spec, "frontend"), status(spec, "dispatcher")
    return (front["pending"] == front["in_flight"] == 0 and not any(disp["queues"].values())
            and not any(w["inflight"] for w in disp["workers"].values()))


def ran(spec, model: str) -> int:
    """Queries the model's worker ran (one a batch): its batches less the queries it skipped."""
    info = status(spec, f"worker-{model}-0")
    return info["batches"] - info["skipped_cancelled"]


def seen_after(run, request_id: str, at: float) -> float:
    """Milliseconds from ``at`` (the test's wall clock) to the frontend's ``cancelled`` line
    for ``request_id`` (a prefix of it)."""
    def line() -> dict | None:
        for text in run.log_path("frontend").read_text(errors="replace").splitlines():
            if '"cancelled"' in text and request_id in text:
                entry = orjson.loads(text)
                if entry.get("event") == "cancelled" and entry.get("request_id", "").startswith(request_id):
                    return entry
        return None

    entry = wait_for(line, what=f"the frontend's cancelled line for {request_id}")
    return (datetime.datetime.fromisoformat(entry["timestamp"]).timestamp() - at) * 1000.0


def in_flight_at_frontend(spec) -> None:
    wait_for(lambda: status(spec, "frontend")["in_flight"] >= 1, what="the request in flight at the frontend")


def test_a_client_cancelling_1000_queued_requests_under_load_frees_their_state(cluster):
    _, spec, _, _ = cluster
    wait_for(lambda: idle(spec), what="an idle cluster")
    endpoint = spec.client_endpoints[0]
    before_cancelled, before_ran = cancelled(spec), ran(spec, "slow")
    before_late = status(spec, "frontend")["answered"].get("late_model", 0)
    disp0 = status(spec, "dispatcher")
    stop, load_results = threading.Event(), []

    def load() -> None:  # another client's steady traffic on the same model, all the while
        with Client(endpoint, timeout_ms=30_000) as other:
            while not stop.is_set():
                load_results.append(other.predict("slow", np.full(DIM, -1.0, np.float32) * len(load_results)))
                time.sleep(0.05)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        with Client(endpoint, timeout_ms=60_000, retries=0) as c:
            rids = [c.submit("slow", np.full(DIM, i, np.float32)) for i in range(1000)]
            time.sleep(0.3)  # a few run; the rest wait in the dispatcher's queue
            assert sum(c.cancel(r) for r in rids) == 1000  # none read yet: every call is in flight here
            results = c.collect(0)
            assert sorted(r.request_id for r in results) == sorted(rids)
            assert {r.error_code for r in results} == {ErrorCode.CANCELLED}
            time.sleep(0.5)
    finally:
        stop.set()
        loader.join(60)
    wait_for(lambda: idle(spec), what="the frontend's and the dispatcher's state freed")
    front, disp = status(spec, "frontend"), status(spec, "dispatcher")
    n_cancelled = front["answered"]["cancelled"] - before_cancelled
    withdrawn = disp["withdrawn"] - disp0["withdrawn"]
    in_worker = disp["withdrawn_in_flight"] - disp0["withdrawn_in_flight"]
    answered_first = 1000 - n_cancelled  # answered before their Cancel came (their answer unread)
    late = front["answered"].get("late_model", 0) - before_late  # run, but their request was cancelled first
    a_ran = ran(spec, "slow") - before_ran - len(load_results)
    print(f"\n1,000 cancelled: frontend cancelled {n_cancelled}, answered first {answered_first}; dispatcher "
          f"withdrew {withdrawn} queued, {in_worker} in flight; the worker ran {a_ran} of them ({late} came late); "
          f"{len(load_results)} load requests")
    assert n_cancelled >= 500 and withdrawn >= 500  # most were still queued
    assert load_results and all(r.source == Source.MODEL for r in load_results)  # the load went on, unharmed
    # no worker ran a withdrawn query (those that ran were dispatched before their Withdraw came)
    assert a_ran + withdrawn <= 1000
    assert a_ran == answered_first + late  # each one run is accounted for: answered, or came after its cancel


def test_a_cancelled_asyncio_task_and_future_reach_the_frontend(cluster):
    _, spec, _, _ = cluster
    endpoint = spec.client_endpoints[0]
    before = cancelled(spec)

    async def run_async() -> None:
        c = AsyncClient(endpoint, timeout_ms=30_000)
        try:
            task = asyncio.ensure_future(c.predict("stuck", np.ones(DIM, np.float32), request_id="task-1"))
            await asyncio.sleep(0)
            await asyncio.get_running_loop().run_in_executor(None, in_flight_at_frontend, spec)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.1)  # the Cancel leaves at the end of the turn
        finally:
            await c.close()

    asyncio.run(run_async())
    wait_for(lambda: cancelled(spec) == before + 1, what="the task's cancel at the frontend")
    with FuturesClient(endpoint, timeout_ms=30_000) as c:
        future = c.predict("stuck", np.full(DIM, 2.0, np.float32), request_id="future-1")
        in_flight_at_frontend(spec)
        assert future.cancel()
        wait_for(lambda: cancelled(spec) == before + 2, what="the future's cancel at the frontend")
    wait_for(lambda: idle(spec), what="state freed")


def test_an_http_client_hanging_up_mid_request_cancels_it(cluster):
    run, spec, http, _ = cluster
    wait_for(lambda: idle(spec), what="an idle cluster")
    before = cancelled(spec)
    body = orjson.dumps({"id": "http-close", "parameters": {"timeout_ms": 30_000},
                         "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, DIM], "data": [3.0] * DIM}]})
    sock = socket.create_connection(("127.0.0.1", http), timeout=10)
    sock.sendall(b"POST /v2/models/stuck/infer HTTP/1.1\r\nHost: keel\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    in_flight_at_frontend(spec)
    closed_at = time.time()
    sock.close()
    wait_for(lambda: cancelled(spec) == before + 1, what="the hang-up's cancel at the frontend")
    print(f"\nHTTP hang-up seen by the frontend {seen_after(run, 'http-close', closed_at):.1f} ms after the close")
    assert status(spec, "gateway")["cancelled"] >= 1
    wait_for(lambda: idle(spec), what="state freed")


def test_a_cancelled_grpc_call_cancels_its_request(cluster):
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    run, spec, _, port = cluster
    wait_for(lambda: idle(spec), what="an idle cluster")
    before = cancelled(spec)
    request = service_pb2.ModelInferRequest(model_name="stuck", id="grpc-cancel")
    request.inputs.add(name="input", datatype="FP32", shape=[1, DIM])
    request.raw_input_contents.append(np.full((1, DIM), 4.0, np.float32).tobytes())
    request.parameters["timeout_ms"].int64_param = 30_000
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(request)
        in_flight_at_frontend(spec)
        cancelled_at = time.time()
        assert call.cancel()
        wait_for(lambda: cancelled(spec) == before + 1, what="the gRPC cancel at the frontend")
    print(f"\ngRPC cancel seen by the frontend {seen_after(run, 'grpc-cancel', cancelled_at):.1f} ms after the cancel")
    assert status(spec, "gateway")["cancelled"] >= 1
    wait_for(lambda: idle(spec), what="state freed")
