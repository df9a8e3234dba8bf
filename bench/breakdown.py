"""``keel bench core --breakdown``: where one request's time goes on the request path, hop
by hop, with one request outstanding and at 80% of the throughput.

A traced request (``Predict.trace``) collects one wall-clock stamp at each end of each
hop: its client's send, then each process's receipt and send, then its client's receipt.
Only a traced request is stamped (the frontend keeps its stamps until its ``Queries``
leaves, the dispatcher until its ``Batch`` leaves, and each carries them on), so the
untraced path costs one emptiness test a message. Consecutive stamps give nine parts::

    client -> frontend        in flight: encode, send, the wire, wake-up, read
    frontend: admission       receipt to the Queries' send (decode, checks, de-duplication)
    frontend -> dispatcher    in flight, and the dispatcher's decode
    dispatcher                receipt to the Batch's send (queue, batching, policy)
    dispatcher -> worker      in flight, and the worker's decode
    worker                    receipt to the Predictions' send (executor hand-off, model)
    worker -> frontend        in flight, and the frontend's decode
    frontend: answer          receipt to the Reply's send (lookup, encode, dedup record)
    frontend -> client        in flight, and the client's decode

The frontend's first stamp is its true receipt; the dispatcher's and the worker's are
taken once the message is decoded, so their decode counts in the hop before. The parts
add up to the client's send-to-receipt (the test suite checks that against the client's
own clock). At load the traced requests, one every ``TRACE_EVERY_S``, ride among the
load's (sent by another process, so the two clients do not share a GIL).

Beside the parts, the CPU each process spends per request, split by thread
(``bench.cpu``), for Keel and for the floor chain (``bench.floor``), one outstanding and at
the same load (the services only; the load's client is not counted): on a machine with
fewer cores than the path has threads, a hop's in-flight time includes waiting for a core
another process's work still holds, so CPU spent anywhere, on the critical path or not,
shows up in the parts. The two columns side by side say whether Keel's cost over the floor
is work each request needs or the price of each process being woken cold: one request at a
time every process sleeps between messages; at load it stays busy (and batches).
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import zmq

from keel.bench.cpu import CPUMeter, combine
from keel.common import protocol
from keel.common.protocol import Predict, Reply

PARTS = ("client -> frontend", "frontend: admission", "frontend -> dispatcher", "dispatcher", "dispatcher -> worker",
         "worker", "worker -> frontend", "frontend: answer", "frontend -> client")
#: a traced request among the load's, this often
TRACE_EVERY_S = 0.01
LOAD_SHARE = 0.8
#: the CPU table's column of Keel's services at that load
AT_LOAD = f"at {LOAD_SHARE:.0%} (services)"


class Tracer:
    """Traced requests, one at a time, through a DEALER of its own: Keel's wire messages,
    as the ``Client`` sends and reads them."""

    def __init__(self, endpoint: str, model: str):
        self.model = model
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.ids = itertools.count(1)
        # its own client id: a request id another tracer used would be answered from the
        # frontend's de-duplication table, with that request's stamps
        self.client = f"tracer-{uuid.uuid4().hex}"

    def trace(self, x: np.ndarray, timeout_s: float = 5.0) -> tuple[list[float], float] | None:
        """(the nine parts in µs, the client's own send-to-receipt in µs) of one request;
        None if it was answered without a full trace (not by the model, or timed out)."""
        rid = f"t-{next(self.ids)}"
        start = time.perf_counter()
        sent = time.time()
        frames = protocol.encode(Predict(request_id=rid, model=self.model, input=x, client=self.client, trace=[sent]))
        self.sock.send_multipart(frames, copy=False)
        deadline = start + timeout_s
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not self.sock.poll(left * 1000):
                return None
            reply = protocol.decode(self.sock.recv_multipart(copy=False))
            if isinstance(reply, Reply) and reply.request_id == rid:
                break
        stamps = [*(reply.trace or []), time.time()]
        took = (time.perf_counter() - start) * 1e6
        if len(stamps) != len(PARTS) + 1 or stamps[0] != sent:  # not this request's whole path
            return None
        return [(b - a) * 1e6 for a, b in zip(stamps, stamps[1:])], took

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def summary(traces: list[tuple[list[float], float]]) -> dict:
    """Per part: mean, median and p99 (µs) over ``traces``; the end-to-end mean and median
    by the client's clock beside the sums of the parts' (means add up; medians need not)."""
    parts = np.array([t[0] for t in traces])
    ends = np.array([t[1] for t in traces])
    rows = {name: {"mean_us": float(parts[:, i].mean()), "p50_us": float(np.median(parts[:, i])),
                   "p99_us": float(np.percentile(parts[:, i], 99))} for i, name in enumerate(PARTS)}
    return {"traced": len(traces), "parts": rows,
            "end_to_end_mean_us": float(ends.mean()), "end_to_end_p50_us": float(np.median(ends)),
            "sum_of_part_means_us": float(sum(r["mean_us"] for r in rows.values())),
            "sum_of_part_p50s_us": float(sum(r["p50_us"] for r in rows.values()))}


def table(name: str, figures: dict) -> list[str]:
    end = figures["end_to_end_mean_us"]
    lines = [f"{name}: {figures['traced']} traced requests",
             f"  {'part':<26}{'mean µs':>9}{'share':>7}{'p50 µs':>9}{'p99 µs':>9}"]
    for part, row in figures["parts"].items():
        lines.append(f"  {part:<26}{row['mean_us']:>9.1f}{row['mean_us'] / end:>7.0%}{row['p50_us']:>9.1f}{row['p99_us']:>9.1f}")
    lines.append(f"  {'sum of the parts':<26}{figures['sum_of_part_means_us']:>9.1f}{'':>7}{figures['sum_of_part_p50s_us']:>9.1f}")
    lines.append(f"  {'end to end (client clock)':<26}{end:>9.1f}{'':>7}{figures['end_to_end_p50_us']:>9.1f}")
    return lines


def _traced(tracer: Tracer, xs: np.ndarray, count: int, every_s: float = 0.0) -> list:
    out = []
    for i in range(count):
        t = tracer.trace(xs[i % len(xs)])
        if t is not None:
            out.append(t)
        if every_s:
            time.sleep(every_s)
    return out


def cpu_table(figures: dict) -> list[str]:
    """The CPU-per-request rows of ``figures["cpu"]`` (column -> group -> kind -> µs)."""
    columns = list(figures)
    lines = ["CPU per request, µs: main thread + ZeroMQ threads + other threads = total",
             f"  {'process':<12}" + "".join(f"{c:>34}" for c in columns)]
    for group in figures[columns[0]]:
        cells = []
        for c in columns:
            row = figures[c].get(group)
            cells.append(f"{row['main']:>7.0f} +{row['zmq']:>5.0f} +{row['other']:>5.0f} = {row['total']:>6.0f}"
                         if row else "")
        lines.append(f"  {group:<12}" + "".join(f"{cell:>34}" for cell in cells))
    return lines


def _groups(names: list[str]) -> dict[str, list[str]]:
    """Keel's processes by role (every worker as one), the client (this process) first."""
    workers = [n for n in names if n.startswith("worker")]
    return {"client": ["client"], "frontend": ["frontend"], "dispatcher": ["dispatcher"], "workers": workers,
            "all": ["client", "frontend", "dispatcher", *workers]}


def _floor_cpu(xs: np.ndarray, count: int, load_rps: float, seconds: float) -> tuple[dict, float, dict, dict]:
    """The floor chain's CPU per request (grouped as Keel's) and p50 (µs), one outstanding;
    then its services' CPU per request at ``load_rps`` (open-loop, from this process, which
    is not counted) and that load's summary."""
    from keel.bench import rates
    from keel.bench.floor import Floor, FloorClient
    from keel.deploy.local import free_port_block

    with Floor(free_port_block(8), workers=2, shape=rates.SHAPE) as floor, FloorClient(floor.client_endpoint) as client:
        names = ["frontend", "dispatcher", "worker-0", "worker-1"]
        pids = {n: p.pid for n, p in zip(names, floor.procs)}
        meter = CPUMeter({"client": os.getpid(), **pids})
        for x in xs[:200]:
            client.predict("m", x)
        meter.start()
        lat = [client.predict("m", xs[i % len(xs)]).latency_ms for i in range(count)]
        rows = meter.stop(count)
        services = CPUMeter(pids)
        services.start()
        load = rates.probe(client, "m", xs, load_rps, seconds)
        at_load = services.stop(int(load_rps * seconds))
    return combine(rows, _groups(names)), float(np.median(lat) * 1000), combine(at_load, _groups(names)), load


def run_breakdown(args, log=print) -> dict:
    from keel.bench import rates
    from keel.common.client import Client
    from keel.deploy.local import Launcher

    quick = args.quick
    count = 1000 if quick else 5000
    seconds = 4.0 if quick else 15.0
    xs = np.random.default_rng(0).random((1024, *rates.SHAPE), dtype=np.float32)
    out: dict = {"quick": quick, "parts": list(PARTS)}
    with Launcher("runs/bench-core/breakdown") as launcher:
        cluster = rates.model_cluster(launcher, 2, batch_budget_ms=rates.SLO_P99_MS, max_batch=128, builtin="noop")
        endpoint = cluster.local_client_endpoints[0]
        pids = {name: proc.pid for name, proc in launcher.procs.items()}
        groups = _groups(list(pids))
        with Tracer(endpoint, "m") as tracer:
            _traced(tracer, xs, 200)  # warm-up
            log("one request outstanding ...")
            meter = CPUMeter({"client": os.getpid(), **pids})
            meter.start()
            traces = _traced(tracer, xs, count)
            out["cpu"] = {"one outstanding": combine(meter.stop(count), groups)}
            out["one_outstanding"] = summary(traces)
            rate = getattr(args, "rate", None)
            if not rate:
                log("throughput (one search) ...")
                with Client([endpoint], timeout_ms=5000) as client:
                    rate, _ = rates.max_rate(lambda r: rates.probe(client, "m", xs, r, 1.0), 2000, 60000, log)
            out["throughput_rps"], out["load_rps"] = rate, LOAD_SHARE * rate
            log(f"at {LOAD_SHARE:.0%} of {rate:.0f} req/s ...")
            load = subprocess.Popen([sys.executable, "-m", "keel.bench.breakdown", endpoint, str(LOAD_SHARE * rate),
                                     str(seconds + 1.0)], stdout=subprocess.PIPE, text=True)
            try:
                time.sleep(0.5)  # the load under way
                services = CPUMeter(pids)  # the load's client is another process: not counted
                services.start()
                began = time.perf_counter()
                traced = _traced(tracer, xs, int(seconds / TRACE_EVERY_S), TRACE_EVERY_S)
                served = LOAD_SHARE * rate * (time.perf_counter() - began) + len(traced)  # open loop: rate x time
                out["cpu"][AT_LOAD] = combine(services.stop(int(served)), groups)
                out["at_load"] = summary(traced)
            finally:
                stdout, _ = load.communicate(timeout=seconds + 30)
            out["load"] = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
        log(f"the floor chain, one request outstanding and at {LOAD_SHARE * rate:.0f} req/s ...")
        one, out["floor_p50_us"], at_load, out["floor_load"] = _floor_cpu(xs, count, LOAD_SHARE * rate, seconds)
        out["cpu"].update({"floor, one outstanding": one, "floor, same load (services)": at_load})
    cpu = {column: rows["all"]["total"] for column, rows in out["cpu"].items()}
    out["cpu_vs_floor"] = {"one outstanding": cpu["one outstanding"] / cpu["floor, one outstanding"],
                           "at load": cpu[AT_LOAD] / cpu["floor, same load (services)"]}
    log("")
    for line in table("one request outstanding", out["one_outstanding"]) + [""] + table(
            f"at {LOAD_SHARE:.0%} of the throughput ({out['load_rps']:.0f} req/s)", out["at_load"]) + [""] + cpu_table(
            out["cpu"]) + [f"  Keel's CPU a request over the floor's: {out['cpu_vs_floor']['one outstanding']:.2f}x one "
                           f"outstanding, {out['cpu_vs_floor']['at load']:.2f}x at the same load",
                           f"  floor chain p50, one outstanding: {out['floor_p50_us']:.0f} µs"]:
        log(line)
    return out


def _load(endpoint: str, rate: float, seconds: float) -> None:
    """The load beside the traced requests: open-loop Poisson through a ``Client``; prints
    its summary (JSON) on its last line."""
    from keel.common.client import Client
    from keel.common.loadgen import open_loop, summarize

    from keel.bench.rates import SHAPE

    xs = np.random.default_rng(2).random((4096, *SHAPE), dtype=np.float32)
    with Client([endpoint], timeout_ms=5000) as client:
        stats = summarize(open_loop(client, "m", xs, rate=rate, count=int(rate * seconds), seed=7, duration_s=seconds))
    print(json.dumps({"sent": stats["sent"], "lost": stats["lost"], "latency_ms": stats["latency_ms"]}))


if __name__ == "__main__":
    _load(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
