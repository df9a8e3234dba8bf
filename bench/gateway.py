"""``keel bench gateway``: what the OIP v2 HTTP gateway costs over Keel's ZeroMQ client.

Through real processes on loopback (gateway, frontend, dispatcher, two no-op workers):

- ``gateway_p50_us`` / ``gateway_p99_us``: one ``infer`` outstanding (one row, binary
  tensors, a kept-alive HTTP connection from the standard library's client), HTTP client
  -> gateway -> frontend -> ... ;
- ``client_p50_us`` / ``client_p99_us``: the same queries through ``common.client.Client``;
- ``gateway_added_p50_us``: the difference (target <= 300 us);
- ``gateway_throughput_rps``: the highest open-loop Poisson rate of one-row ``infer``s
  through the gateway whose p99 stays <= 20 ms with every request answered 200 (a
  bisection to within 5%, ``bench.rates``).

CURVE's cost, on ``keel bench core``'s no-op cluster (client -> frontend -> dispatcher ->
worker, ``bench.rates``' latency and SLO-bounded rate search), with and without
``[cluster] curve_keys`` (every socket encrypted and allow-listed):

- ``curve_p50_cost``: p50 with CURVE / p50 without - 1 (target <= 0.10);
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
import time
from pathlib import Path

import numpy as np
import orjson

from keel.bench import rates
from keel.bench.cpu import CPUMeter
from keel.common.client import Client
from keel.common.loadgen import schedule
from keel.common.progress import bar
from keel.common.spec import load_spec
from keel.deploy.local import Launcher, free_port, free_port_block

SLO_P99_MS = 20.0
DIM = 8
#: the fixed rate the CPU per request at load is read at (well under the gateway's throughput)
LOAD_RPS = 300

#: the printed table and its targets (keel bench)
FIGURES = ("gateway_p50_us", "gateway_p99_us", "client_p50_us", "client_p99_us", "gateway_added_p50_us",
           "gateway_cpu_us", "http_caller_cpu_us", "zmq_caller_cpu_us", "gateway_cpu_us_at_load",
           "http_caller_cpu_us_at_load", "gateway_throughput_rps", "core_p50_us_without_curve", "core_p50_us_with_curve", "core_rps_without_curve",
           "core_rps_with_curve", "curve_p50_cost", "curve_throughput_cost")
TARGETS = {"gateway_added_p50_us": "<= 300", "curve_p50_cost": "<= 0.10", "curve_throughput_cost": "<= 0.10"}


def _body(x: np.ndarray) -> tuple[bytes, dict]:
    raw = np.ascontiguousarray(x, np.float32).reshape(1, DIM).tobytes()
    head = orjson.dumps({"inputs": [{"name": "input", "shape": [1, DIM], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "output", "parameters": {"binary_data": True}}]})
    return head + raw, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def _one_outstanding(port: int, xs: np.ndarray, warm: int) -> np.ndarray:
    """Latency (ms) of one-row binary infers, one at a time, on one kept-alive connection
    (the standard library's blocking client: the lightest caller, so the figure is the
    gateway's more than the caller's)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    lat = []
    try:
        for i, x in enumerate(xs):
            body, headers = _body(x)
            t = time.perf_counter()
            conn.request("POST", "/v2/models/m/infer", body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"gateway answered {resp.status}")
            if i >= warm:
                lat.append((time.perf_counter() - t) * 1000.0)
    finally:
        conn.close()
    return np.array(lat)


async def _open_loop(url: str, xs: np.ndarray, rate: float, seconds: float) -> dict:
    """Send a seeded Poisson schedule; latency of each request answered 200, and failures."""
    import aiohttp

    offsets, rows = schedule(rate, None, int(rate), len(xs), seconds)
    bodies = [_body(x) for x in xs]
    lat: list[float] = []
    failed = 0

    async def one(session, row: int) -> None:
        nonlocal failed
        body, headers = bodies[row]
        t = time.perf_counter()
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                ok = resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        if ok:
            lat.append((time.perf_counter() - t) * 1000.0)
        else:
            failed += 1

    timeout = aiohttp.ClientTimeout(total=10.0)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=256)) as session:
        start, tasks = time.perf_counter(), []
        for offset, row in zip(offsets, rows):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(session, int(row))))
        await asyncio.gather(*tasks)
    arr = np.array(lat) if lat else np.array([np.inf])
    return {"rate": rate, "sent": len(offsets), "failed": failed,
            "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


def _max_rate(url: str, seconds: float, log) -> tuple[float, list[dict]]:
    """Highest offered rate with p99 <= SLO and nothing failed: ``bench.rates``' bisection
    (to within 5%) over open-loop runs of ``seconds``."""
    xs = np.random.default_rng(1).random((1024, DIM), dtype=np.float32)
    asyncio.run(_open_loop(url, xs, 100, 0.5))  # warm-up
    shown = bar(None, "gateway rate search", unit="rate")

    def attempt(rate: float) -> dict:
        shown.update(1)
        row = asyncio.run(_open_loop(url, xs, rate, seconds))
        row["lost"] = row["failed"]
        row["ok"] = row["failed"] == 0 and row["p99_ms"] <= SLO_P99_MS
        return row

    try:
        return rates.max_rate(attempt, 500, 20000, log)
    finally:
        shown.close()


def _core(keys: str | None, quick: bool, log) -> tuple[float, float]:
    """(p50 us, SLO-bounded rate) of bench.core's no-op cluster, with CURVE when ``keys``."""
    from keel.common import curve

    with Launcher(Path("runs/bench-gateway") / ("curve" if keys else "plain")) as launcher:
        spec = load_spec({
            "cluster": {"name": "bench-curve", "base_port": free_port_block(), "run_dir": str(launcher.log_dir),
                        **({"curve_keys": keys} if keys else {})},
            "frontend": {"log_requests": False, "cache_size": 0},
            "models": {"m": {"builtin": "noop", "input_shape": [64], "output_size": 10, "workers": 2,
                             "batch_budget_ms": SLO_P99_MS, "max_batch": 128}},
        })
        curve.use(keys, "client")  # this process's sockets too (the clients, the readiness checks)
        try:
            launcher.start_spec(spec)
            endpoint = spec.client_endpoints[0]
            lat_xs = np.random.default_rng(0).random((1500 if quick else 6000, 64), dtype=np.float32)
            xs = np.random.default_rng(1).random((4096, 64), dtype=np.float32)
            with Client([endpoint], timeout_ms=5000) as client:
                p50 = rates.latency(client, "m", lat_xs)["p50_us"]
                rate, _ = rates.max_rate(lambda r: rates.probe(client, "m", xs, r, 1.0 if quick else 3.0), 2000, 60000, log)
        finally:
            launcher.stop()
            curve.use(None)
    return p50, rate


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
            "models": {"m": {"builtin": "noop", "input_shape": [DIM], "output_size": 4, "workers": 2,
                             "batch_budget_ms": SLO_P99_MS, "max_batch": 128}},
        })
        launcher.start_spec(spec)
        url = f"http://127.0.0.1:{port}/v2/models/m/infer"
        xs = np.random.default_rng(0).random((n + warm, DIM), dtype=np.float32)
        log("gateway latency, one request outstanding ...")
        both = CPUMeter({"gateway": launcher.procs["gateway"].pid, "caller": os.getpid()})
        both.start()
        gw = _one_outstanding(port, xs, warm)
        cpu = both.stop(len(xs))
        out["gateway_cpu_us"], out["http_caller_cpu_us"] = cpu["gateway"]["total"], cpu["caller"]["total"]
        log("ZeroMQ client latency, one request outstanding ...")
        with Client(spec.client_endpoints) as client:
            for x in xs[:warm]:
                client.predict("m", x)
            meter = CPUMeter({"caller": os.getpid()})
            meter.start()
            zc = np.array([client.predict("m", x).latency_ms for x in xs[warm:]])
            out["zmq_caller_cpu_us"] = meter.stop(len(zc))["caller"]["total"]
        log(f"CPU per request at {LOAD_RPS} req/s through the gateway (gateway, and the HTTP load generator) ...")
        both.start()
        probe = asyncio.run(_open_loop(url, xs, LOAD_RPS, seconds))
        cpu = both.stop(probe["sent"])
        out["gateway_cpu_us_at_load"], out["http_caller_cpu_us_at_load"] = cpu["gateway"]["total"], cpu["caller"]["total"]
        out["gateway_p50_us"], out["gateway_p99_us"] = float(np.percentile(gw, 50) * 1000), float(np.percentile(gw, 99) * 1000)
        out["client_p50_us"], out["client_p99_us"] = float(np.percentile(zc, 50) * 1000), float(np.percentile(zc, 99) * 1000)
        out["gateway_added_p50_us"] = out["gateway_p50_us"] - out["client_p50_us"]
        log("gateway throughput (open-loop Poisson, p99 <= 20 ms) ...")
        out["gateway_throughput_rps"], out["gateway_probes"] = _max_rate(url, seconds, log)
    import tempfile

    from keel.common import curve

    with tempfile.TemporaryDirectory(prefix="keel-bench-keys-") as keys:
        curve.generate(keys)
        for label, folder in (("without", None), ("with", keys)):
            log(f"bench core's no-op cluster {label} CURVE ...")
            out[f"core_p50_us_{label}_curve"], out[f"core_rps_{label}_curve"] = _core(folder, quick, log)
    plain_p50, plain_rps = out["core_p50_us_without_curve"], out["core_rps_without_curve"]
    out["curve_p50_cost"] = out["core_p50_us_with_curve"] / plain_p50 - 1 if plain_p50 else None
    out["curve_throughput_cost"] = 1 - out["core_rps_with_curve"] / plain_rps if plain_rps else None
    out["elapsed_s"] = time.time() - t0
    return out

