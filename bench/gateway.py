"""``keel bench gateway``: what the OIP v2 HTTP gateway costs over Keel's ZeroMQ client.

Through real processes on loopback (gateway, frontend, dispatcher, two no-op workers):

- ``gateway_p50_us`` / ``gateway_p99_us``: one ``infer`` outstanding (one row, binary
  tensors, a kept-alive HTTP connection written and read on a plain socket: the lightest
  caller, as Keel's client is on the ZeroMQ side), HTTP caller -> gateway -> frontend -> ... ;
- ``client_p50_us`` / ``client_p99_us``: the same queries through ``common.client.Client``;
- ``gateway_added_p50_us``: the difference of the two p50s (target <= 300 us), the two taken
  in turn, 50 requests at a time (``rates.in_turn``: taken 500 at a time, the difference
  read 239-504 µs in the repetitions of one run);
- ``gateway_stdlib_p50_us`` / ``gateway_stdlib_added_p50_us``: the same through the
  standard library's ``http.client`` (this bench's caller before 2026-11-28; it spends
  100-200 µs a request of its own);
- ``gateway_throughput_rps``: the highest open-loop Poisson rate of one-row ``infer``s
  through the gateway whose p99 stays <= 20 ms with every request answered 200 (a
  bisection to within 5%, ``bench.rates``; the load generator writes and reads plain
  kept-alive connections, one request on each at a time); ``gateway_throughput_vs_client``
  is it over ``core_rps_without_curve``, the ZeroMQ client's rate on the same path
  without the gateway (target >= 0.5).

The floor, in the same run (``bench.floor``): the bare chain of Keel's hops with the
gateway's floor in front (HTTP/1.1 on asyncio and httptools, each request's tensor forwarded
and each answer written back, nothing parsed or checked past HTTP), through the same callers:

- ``floor_gateway_p50_us`` / ``floor_client_p50_us`` / ``floor_gateway_added_p50_us``: as
  above, through the floor's gateway and the floor's own ZeroMQ client;
- ``floor_gateway_throughput_rps``, and ``floor_gateway_throughput_vs_client`` over
  ``core_rps_without_curve``: what any gateway of this shape could carry on this machine.

The latencies are taken ``rates.REPEATS`` times in turn (gateway, http.client, ZeroMQ
client); each figure is the median, with its range (``_range``) and every repetition
(``_runs``).

CURVE's cost, on ``keel bench core``'s no-op cluster (client -> frontend -> dispatcher ->
worker, ``bench.rates``' latency and SLO-bounded rate search), with and without
``[cluster] curve_keys`` (every socket encrypted and allow-listed):

- ``curve_p50_cost``: p50 with CURVE / p50 without - 1 (target <= 0.10), both clusters up
  at once and their latencies taken in turn, ``rates.REPEATS`` pairs (the median pair);
- ``curve_throughput_cost``: 1 - rate with CURVE / rate without (target <= 0.10).

The load generator shares the machine with the cluster, so on a small host the figures
are the generator's as much as the gateway's: ``gateway_cpu_us`` / ``http_caller_cpu_us``
/ ``zmq_caller_cpu_us`` (one outstanding) and ``gateway_cpu_us_at_load`` /
``http_caller_cpu_us_at_load`` (at ``LOAD_RPS``) say what each side spends per request
(``bench.cpu``: every thread of the process).
"""
from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from pathlib import Path

import numpy as np
import orjson

from keel.bench import rates
from keel.bench.cpu import CPUMeter
from keel.bench.floor import Floor, FloorClient, FloorGateway
from keel.common.client import Client
from keel.common.loadgen import schedule
from keel.common.progress import bar
from keel.common.spec import load_spec
from keel.deploy.local import Launcher, free_port, free_port_block

SLO_P99_MS = 20.0
DIM, OUTPUT_SIZE = 8, 4
PATH = "/v2/models/m/infer"
#: the fixed rate the CPU per request at load is read at (well under the gateway's throughput)
LOAD_RPS = 300

#: the printed table and its targets (keel bench)
FIGURES = ("gateway_p50_us", "gateway_p99_us", "client_p50_us", "client_p99_us", "gateway_added_p50_us",
           "gateway_stdlib_p50_us", "gateway_stdlib_added_p50_us", "gateway_cpu_us", "http_caller_cpu_us",
           "zmq_caller_cpu_us", "gateway_cpu_us_at_load", "http_caller_cpu_us_at_load", "gateway_throughput_rps",
           "gateway_throughput_vs_client", "floor_gateway_p50_us", "floor_client_p50_us",
           "floor_gateway_added_p50_us", "floor_gateway_throughput_rps", "floor_gateway_throughput_vs_client",
           "core_p50_us_without_curve", "core_p50_us_with_curve",
           "core_rps_without_curve", "core_rps_with_curve", "curve_p50_cost", "curve_throughput_cost")
TARGETS = {"gateway_added_p50_us": "<= 300", "gateway_throughput_vs_client": ">= 0.5", "curve_p50_cost": "<= 0.10",
           "curve_throughput_cost": "<= 0.10"}


def _body(x: np.ndarray) -> tuple[bytes, dict]:
    raw = np.ascontiguousarray(x, np.float32).reshape(1, DIM).tobytes()
    head = orjson.dumps({"inputs": [{"name": "input", "shape": [1, DIM], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "output", "parameters": {"binary_data": True}}]})
    return head + raw, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def _request(x: np.ndarray) -> bytes:
    """One infer of row ``x`` as the bytes an HTTP/1.1 caller writes (keep-alive)."""
    body, headers = _body(x)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n{head}\r\n").encode() + body


_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


def _response(buf: bytes) -> tuple[int, int] | None:
    """(status, bytes it spans) of the HTTP response at the start of ``buf``; None while it
    is incomplete (the gateway always sends Content-Length)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    length = _LENGTH.search(buf, 0, end + 2)
    size = end + 4 + (int(length.group(1)) if length else 0)
    return (int(buf[9:12]), size) if len(buf) >= size else None


def _one_outstanding(port: int, xs: np.ndarray) -> np.ndarray:
    """Latency (ms) of one-row binary infers, one at a time, on one kept-alive connection,
    written and read on a plain socket: the lightest HTTP caller, as Keel's client is the
    lightest ZeroMQ one, so the difference is the gateway's (the standard library's
    ``http.client`` spends 100-200 µs a request of its own: ``_one_outstanding_stdlib``)."""
    requests = [_request(x) for x in xs]
    with _connection(port) as sock:
        return np.array([_one_request(sock, request) for request in requests])


def _paired(port: int, client, xs: np.ndarray, warm: int) -> tuple[dict, dict]:
    """p50 and p99 (µs) through the gateway (as ``_one_outstanding``) and through ``client``
    (Keel's or the floor's), one request outstanding, taken in turn (``rates.in_turn``)."""
    with _connection(port) as sock:
        figures = rates.in_turn({"gateway": lambda x: _one_request(sock, _request(x)),
                                 "client": rates.predicting(client)}, xs, warm)
    return figures["gateway"], figures["client"]


def _connection(port: int) -> socket.socket:
    """A kept-alive connection to the gateway, each write sent at once (no Nagle delay)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _one_request(sock: socket.socket, request: bytes) -> float:
    """Latency (ms) of one infer written and read on a kept-alive connection; raises unless 200."""
    t = time.perf_counter()
    sock.sendall(request)
    buf = b""
    while (answer := _response(buf)) is None:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the gateway closed the connection")
        buf += chunk
    if answer[0] != 200:
        raise RuntimeError(f"gateway answered {answer[0]}")
    return (time.perf_counter() - t) * 1000.0


def _one_outstanding_stdlib(port: int, xs: np.ndarray, warm: int) -> np.ndarray:
    """``_one_outstanding`` through the standard library's ``http.client`` (the caller of
    this bench's figures before 2026-11-28)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    lat = []
    try:
        for i, x in enumerate(xs):
            body, headers = _body(x)
            t = time.perf_counter()
            conn.request("POST", PATH, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"gateway answered {resp.status}")
            if i >= warm:
                lat.append((time.perf_counter() - t) * 1000.0)
    finally:
        conn.close()
    return np.array(lat)


class _Connection(asyncio.Protocol):
    """One kept-alive connection of the load generator: one request at a time."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.answer: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        answer = _response(self.buf)
        if answer is not None and self.answer is not None and not self.answer.done():
            self.buf = self.buf[answer[1]:]
            self.answer.set_result(answer[0])

    def connection_lost(self, exc) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError("the gateway closed the connection"))

    def send(self, request: bytes) -> asyncio.Future:
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.answer


async def _open_loop(port: int, xs: np.ndarray, rate: float, seconds: float) -> dict:
    """Send a seeded Poisson schedule over kept-alive connections (one more opened whenever
    every one is busy; written and read as ``_one_outstanding`` does); latency of each
    request answered 200, and failures (another status, a closed connection, 10 s)."""
    loop = asyncio.get_running_loop()
    offsets, rows = schedule(rate, None, int(rate), len(xs), seconds)
    requests = [_request(x) for x in xs]
    idle: list[_Connection] = []
    lat: list[float] = []
    failed = 0

    async def one(row: int) -> None:
        nonlocal failed
        t = time.perf_counter()
        try:
            conn = idle.pop() if idle else (await loop.create_connection(_Connection, "127.0.0.1", port))[1]
            answer = conn.send(requests[row])
            timer = loop.call_later(10.0, lambda: answer.done() or answer.set_exception(TimeoutError()))
            try:
                status = await answer
            finally:
                timer.cancel()
        except (OSError, TimeoutError):
            failed += 1
            return
        if status == 200:
            lat.append((time.perf_counter() - t) * 1000.0)
            idle.append(conn)
        else:
            failed += 1
            conn.transport.close()

    start, tasks = time.perf_counter(), []
    for offset, row in zip(offsets, rows):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(one(int(row))))
    await asyncio.gather(*tasks)
    for conn in idle:
        conn.transport.close()
    arr = np.array(lat) if lat else np.array([np.inf])
    return {"rate": rate, "sent": len(offsets), "failed": failed,
            "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


def _max_rate(port: int, seconds: float, log) -> tuple[float, list[dict]]:
    """Highest offered rate with p99 <= SLO and nothing failed: ``bench.rates``' bisection
    (to within 5%) over open-loop runs of ``seconds``."""
    xs = np.random.default_rng(1).random((1024, DIM), dtype=np.float32)
    asyncio.run(_open_loop(port, xs, 100, 0.5))  # warm-up
    shown = bar(None, "gateway rate search", unit="rate")

    def attempt(rate: float) -> dict:
        shown.update(1)
        row = asyncio.run(_open_loop(port, xs, rate, seconds))
        row["lost"] = row["failed"]
        row["ok"] = row["failed"] == 0 and row["p99_ms"] <= SLO_P99_MS
        return row

    try:
        return rates.max_rate(attempt, 500, 20000, log)
    finally:
        shown.close()


def _curve_costs(keys: str, quick: bool, out: dict, log) -> None:
    """bench.core's no-op cluster without and with CURVE, both up at once: the latencies taken
    in turn (``rates.in_turn``; one cluster after the other moved the cost by +-0.1 with the
    machine's drift), ``rates.REPEATS`` times, then one rate search each."""
    from keel.common import curve

    lat_xs = np.random.default_rng(0).random((1500 if quick else 6000, 64), dtype=np.float32)
    xs = np.random.default_rng(1).random((4096, 64), dtype=np.float32)
    clients: dict[str, Client] = {}
    with Launcher(Path("runs/bench-gateway") / "plain") as plain, Launcher(Path("runs/bench-gateway") / "curve") as secure:
        try:
            for label, launcher, folder in (("without", plain, None), ("with", secure, keys)):
                log(f"bench core's no-op cluster {label} CURVE ...")
                curve.use(folder, "client")  # this process's sockets made from now on (the client, the readiness checks)
                spec = load_spec({
                    "cluster": {"name": f"bench-curve-{label}", "base_port": free_port_block(),
                                "run_dir": str(launcher.log_dir), **({"curve_keys": folder} if folder else {})},
                    "frontend": {"log_requests": False, "cache_size": 0},
                    "models": {"m": {"builtin": "noop", "input_shape": [64], "output_size": 10, "workers": 2,
                                     "batch_budget_ms": SLO_P99_MS, "max_batch": 128}},
                })
                launcher.start_spec(spec)
                clients[label] = Client(spec.local_client_endpoints, timeout_ms=5000)
                clients[label].predict("m", lat_xs[0])  # its socket is made now, under this setting
            p50s: dict[str, list[float]] = {label: [] for label in clients}
            calls = {label: rates.predicting(client) for label, client in clients.items()}
            for rep in range(rates.REPEATS):
                log(f"  latency with and without CURVE in turn, repetition {rep + 1} of {rates.REPEATS} ...")
                for label, figures in rates.in_turn(calls, lat_xs).items():
                    p50s[label].append(figures["p50_us"])
            for label, client in clients.items():
                rates.put(out, f"core_p50_us_{label}_curve", rates.spread(p50s[label]))
                log(f"  rate {label} CURVE ...")
                out[f"core_rps_{label}_curve"], _ = rates.max_rate(
                    lambda r: rates.probe(client, "m", xs, r, 1.0 if quick else 3.0), 2000, 60000, log)
            costs = [w / wo - 1 for w, wo in zip(p50s["with"], p50s["without"])]  # each repetition's own pair
            rates.put(out, "curve_p50_cost", rates.spread(costs))
        finally:
            for client in clients.values():
                client.close()
            curve.use(None)
            plain.stop()
            secure.stop()


def _warm_up(port: int, client, xs: np.ndarray) -> None:
    """One pass of ``xs`` through the gateway and through the ZeroMQ client before the
    repetitions: the first pass after a start read up to 260 µs slower than the next."""
    _one_outstanding(port, xs)
    for x in xs:
        client.predict("m", x)


def _floor(out: dict, xs: np.ndarray, warm: int, seconds: float, log) -> None:
    """The same latencies and search through the floor: the bare chain (``bench.floor``)
    with the gateway's floor in front (HTTP parsed and forwarded, nothing checked)."""
    runs: dict[str, list[float]] = {"floor_gateway_p50_us": [], "floor_client_p50_us": [],
                                    "floor_gateway_added_p50_us": []}
    with Floor(free_port_block(8), workers=2, shape=[DIM], output_size=OUTPUT_SIZE) as floor, \
            FloorGateway(floor, free_port()) as gateway, \
            FloorClient(floor.client_endpoint, [DIM], OUTPUT_SIZE) as client:
        _warm_up(gateway.http_port, client, xs)
        for rep in range(rates.REPEATS):
            log(f"the floor, one request outstanding, repetition {rep + 1} of {rates.REPEATS} ...")
            gw, zc = (figures["p50_us"] for figures in _paired(gateway.http_port, client, xs, warm))
            for key, value in zip(runs, (gw, zc, gw - zc)):
                runs[key].append(value)
        log("the floor's gateway throughput (open-loop Poisson, p99 <= 20 ms) ...")
        out["floor_gateway_throughput_rps"], out["floor_gateway_probes"] = _max_rate(gateway.http_port, seconds, log)
    for key, values in runs.items():
        rates.put(out, key, rates.spread(values))


def run(args, log=print) -> dict:
    quick = args.quick
    t0 = time.time()
    n = 500 if quick else 3000
    warm = 100
    seconds = 1.5 if quick else 4.0
    out: dict = {"quick": quick, "slo_p99_ms": SLO_P99_MS}
    port = free_port()
    with Launcher(Path("runs/bench-gateway")) as launcher:
        spec = load_spec({
            "cluster": {"name": "bench-gateway", "base_port": free_port_block(), "run_dir": str(launcher.log_dir)},
            "gateway": {"http_port": port},
            "frontend": {"log_requests": False, "cache_size": 0},
            "models": {"m": {"builtin": "noop", "input_shape": [DIM], "output_size": OUTPUT_SIZE, "workers": 2,
                             "batch_budget_ms": SLO_P99_MS, "max_batch": 128}},
        })
        launcher.start_spec(spec)
        xs = np.random.default_rng(0).random((n + warm, DIM), dtype=np.float32)
        both = CPUMeter({"gateway": launcher.procs["gateway"].pid, "caller": os.getpid()})
        meter = CPUMeter({"caller": os.getpid()})
        runs: dict[str, list[float]] = {k: [] for k in ("gateway_p50_us", "gateway_p99_us", "client_p50_us", "client_p99_us",
                                                         "gateway_added_p50_us", "gateway_stdlib_p50_us",
                                                         "gateway_stdlib_added_p50_us", "gateway_cpu_us",
                                                         "http_caller_cpu_us", "zmq_caller_cpu_us")}
        with Client(spec.local_client_endpoints) as client:
            _warm_up(port, client, xs)
            for rep in range(rates.REPEATS):
                log(f"one request outstanding, repetition {rep + 1} of {rates.REPEATS}: each side's CPU (the "
                    "gateway, the ZeroMQ client), http.client, then the gateway and the client in turn ...")
                both.start()  # CPU: each side alone
                _one_outstanding(port, xs)
                cpu = both.stop(len(xs))
                runs["gateway_cpu_us"].append(cpu["gateway"]["total"])
                runs["http_caller_cpu_us"].append(cpu["caller"]["total"])
                meter.start()
                for x in xs:
                    client.predict("m", x)
                runs["zmq_caller_cpu_us"].append(meter.stop(len(xs))["caller"]["total"])
                stdlib = _one_outstanding_stdlib(port, xs, warm)
                gw, zc = _paired(port, client, xs, warm)  # the latencies: the two taken in turn
                std = float(np.percentile(stdlib, 50) * 1000)
                runs["gateway_p50_us"].append(gw["p50_us"])
                runs["gateway_p99_us"].append(gw["p99_us"])
                runs["client_p50_us"].append(zc["p50_us"])
                runs["client_p99_us"].append(zc["p99_us"])
                runs["gateway_added_p50_us"].append(gw["p50_us"] - zc["p50_us"])  # each repetition's own pair
                runs["gateway_stdlib_p50_us"].append(std)
                runs["gateway_stdlib_added_p50_us"].append(std - zc["p50_us"])
        for key, values in runs.items():
            rates.put(out, key, rates.spread(values))
        log(f"CPU per request at {LOAD_RPS} req/s through the gateway (gateway, and the HTTP load generator) ...")
        both.start()
        probe = asyncio.run(_open_loop(port, xs, LOAD_RPS, seconds))
        cpu = both.stop(probe["sent"])
        out["gateway_cpu_us_at_load"], out["http_caller_cpu_us_at_load"] = cpu["gateway"]["total"], cpu["caller"]["total"]
        log("gateway throughput (open-loop Poisson, p99 <= 20 ms) ...")
        out["gateway_throughput_rps"], out["gateway_probes"] = _max_rate(port, seconds, log)
    _floor(out, xs, warm, seconds, log)
    import tempfile

    from keel.common import curve

    with tempfile.TemporaryDirectory(prefix="keel-bench-keys-") as keys:
        curve.generate(keys)
        _curve_costs(keys, quick, out, log)
    plain_rps = out["core_rps_without_curve"]
    out["curve_throughput_cost"] = 1 - out["core_rps_with_curve"] / plain_rps if plain_rps else None
    out["gateway_throughput_vs_client"] = out["gateway_throughput_rps"] / plain_rps if plain_rps else None
    out["floor_gateway_throughput_vs_client"] = out["floor_gateway_throughput_rps"] / plain_rps if plain_rps else None
    out["elapsed_s"] = time.time() - t0
    return out

