"""The request path's per-hop breakdown (``keel bench core --breakdown``) and its floor
(``bench.floor``), through real processes: a traced request's parts add up to what its
client measured, an untraced one carries no stamps, and the bare chain answers as Keel's
hops do."""
from __future__ import annotations

import os

import numpy as np
import pytest
import zmq

from keel.bench.breakdown import PARTS, Tracer, _floor_cpu, _groups, summary
from keel.bench.cpu import CPUMeter, combine
from keel.bench.rates import async_predicting, in_turn, predicting
from keel.bench.floor import Floor, FloorClient, templates
from keel.common import loadgen, protocol
from keel.common.client import Client
from keel.common.protocol import Predict, Reply
from keel.common.spec import load_spec
from keel.deploy.local import Launcher, free_port_block

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("breakdown")
    with Launcher(run_dir) as launcher:
        spec = load_spec({"cluster": {"name": "breakdown", "base_port": free_port_block(), "run_dir": str(run_dir)},
                          "frontend": {"log_requests": False},
                          "models": {"m": {"builtin": "noop", "input_shape": [64], "output_size": 10, "workers": 2}}})
        yield launcher, launcher.start_spec(spec)


@pytest.fixture(scope="module")
def cluster(launched):
    return launched[1]


def test_a_traced_requests_parts_add_up_to_its_clients_time(cluster):
    xs = np.random.default_rng(0).random((100, 64), dtype=np.float32)
    with Tracer(cluster.client_endpoints[0], "m") as tracer:
        traces = [tracer.trace(x) for x in xs]
    assert all(t is not None for t in traces)  # every process stamped: nine parts each
    for parts, took_us in traces:
        assert len(parts) == len(PARTS)
        assert min(parts) >= -50.0  # in order on one clock (a few µs of time.time()'s steps allowed)
        # the stamps span the client's own send-to-receipt, less its encode and decode
        assert abs(sum(parts) - took_us) <= 0.05 * took_us + 50.0, (parts, took_us)
    figures = summary(traces)
    assert figures["traced"] == 100 and set(figures["parts"]) == set(PARTS)
    assert abs(figures["sum_of_part_means_us"] - figures["end_to_end_mean_us"]) <= 0.05 * figures["end_to_end_mean_us"] + 50


def test_an_untraced_request_is_answered_without_stamps(cluster):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(cluster.client_endpoints[0])
        sock.send_multipart(protocol.encode(Predict(request_id="plain", model="m", input=np.zeros(64, np.float32))))
        assert sock.poll(10_000)
        reply = protocol.decode(sock.recv_multipart())
        assert isinstance(reply, Reply) and reply.source == "model" and reply.trace is None
    finally:
        sock.close(0)
        ctx.term()


def test_the_floor_chain_answers_every_request_with_keels_reply_size():
    xs = np.random.default_rng(1).random((64, 64), dtype=np.float32)
    with Floor(free_port_block(8), workers=2) as floor, FloorClient(floor.client_endpoint) as client:
        first = client.predict("m", xs[0], timeout_ms=20_000)  # the processes start meanwhile
        assert first.latency_ms > 0
        records = loadgen.open_loop(client, "m", xs, rate=500, count=300, seed=3, duration_s=10)
        stats = loadgen.summarize(records)
        assert stats["lost"] == 0 and stats["sources"] == {"model": 300}
        sock = client.socks[0]
        sock.send_multipart([b"\0" * 8, client.predict_head, xs[0]])
        assert sock.poll(10_000)
        tag, head, output = sock.recv_multipart()
        assert head == templates([64], 10)["reply"] and len(output) == 10 * 4  # Keel's Reply, Keel's output


def test_the_floor_with_two_frontends_answers_through_each():
    xs = np.random.default_rng(1).random((64, 64), dtype=np.float32)
    with Floor(free_port_block(8), workers=2, frontends=2) as floor, FloorClient(floor.client_endpoints) as client:
        assert len(floor.client_endpoints) == 2 and len({p.pid for p in floor.procs}) == 5
        records = loadgen.open_loop(client, "m", xs, rate=500, count=200, seed=3, duration_s=10)
        assert loadgen.summarize(records)["lost"] == 0
        for index, sock in enumerate(client.socks):  # each frontend answers what was sent to it
            sock.send_multipart([(index << 56).to_bytes(8, "little"), client.predict_head, xs[0]])
            assert sock.poll(10_000)
            sock.recv_multipart()


def test_the_floor_gateway_forwards_http_to_the_chain():
    from keel.bench.floor import FloorGateway
    from keel.bench.gateway import DIM, OUTPUT_SIZE, _one_outstanding, _paired
    from keel.deploy.local import free_port

    xs = np.random.default_rng(1).random((70, DIM), dtype=np.float32)
    with Floor(free_port_block(8), workers=2, shape=[DIM], output_size=OUTPUT_SIZE) as floor, \
            FloorGateway(floor, free_port()) as gateway, FloorClient(floor.client_endpoint, [DIM], OUTPUT_SIZE) as client:
        assert len(_one_outstanding(gateway.http_port, xs[:20])) == 20  # every infer answered 200
        gw, zc = _paired(gateway.http_port, client, xs, 10)  # the two in turn: every request of each answered
        assert 0 < gw["p50_us"] <= gw["p99_us"] and 0 < zc["p50_us"] <= zc["p99_us"]


def test_cpu_per_request_is_counted_per_process_and_thread(launched):
    launcher, cluster = launched
    pids = {name: proc.pid for name, proc in launcher.procs.items()}
    meter = CPUMeter({"client": os.getpid(), **pids})
    xs = np.random.default_rng(2).random((300, 64), dtype=np.float32)
    with Tracer(cluster.client_endpoints[0], "m") as tracer:
        meter.start()
        assert all(tracer.trace(x) is not None for x in xs)
        rows = meter.stop(len(xs))
    groups = combine(rows, _groups(list(pids)))
    assert set(groups) == {"client", "frontend", "dispatcher", "workers", "all"}
    for name in ("frontend", "dispatcher", "workers"):  # each process of the path worked for them
        assert groups[name]["main"] > 0 and groups[name]["total"] >= groups[name]["main"]
    assert groups["all"]["total"] == pytest.approx(sum(groups[g]["total"] for g in ("client", "frontend", "dispatcher", "workers")))


def test_the_floors_cpu_is_taken_one_outstanding_and_at_a_load_it_carries():
    xs = np.random.default_rng(4).random((64, 64), dtype=np.float32)
    one, p50, at_load, load = _floor_cpu(xs, 600, 1000.0, 2.0)  # CPU is counted in 10 ms ticks
    assert p50 > 0 and load["lost"] == 0 and load["ok"]
    for groups in (one, at_load):
        for name in ("frontend", "dispatcher", "workers"):  # each process of the chain worked for them
            assert groups[name]["main"] > 0
    assert one["client"]["total"] > 0 and at_load["client"]["total"] == 0  # the load's client is not counted


def test_the_asyncio_and_blocking_clients_latencies_are_taken_in_turn_through_the_cluster(cluster):
    xs = np.random.default_rng(3).random((120, 64), dtype=np.float32)
    taken = []
    with Client(cluster.client_endpoints) as client, async_predicting(cluster.client_endpoints[0], "m") as call:
        def blocking(x):
            taken.append("blocking")
            return predicting(client)(x)

        def asyncio_(x):
            taken.append("async")
            return call(x)

        figures = in_turn({"blocking": blocking, "async": asyncio_}, xs, warmup=20, block=50)
    assert all(0 < f["p50_us"] <= f["p99_us"] for f in figures.values())
    # the warm-up a row through each, then the 100 rows left 50 through one, 50 through the other
    assert taken[:40] == ["blocking", "async"] * 20
    assert taken[40:] == ["blocking"] * 50 + ["async"] * 50 + ["blocking"] * 50 + ["async"] * 50
