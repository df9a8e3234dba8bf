"""``keel bench core --cold``: what each step of a message's handling costs warm and in a
process woken cold, as every process of the request path is with one request outstanding.

Between two requests a process of the path sleeps while the others (five processes and
their ZeroMQ threads, here on two cores) run; when it wakes, the code and data its next
message touches are no longer in the CPU's caches. A step's warm cost (the same call in a
tight loop) says little about what it costs there. This measures both, in this process:
``warm`` is the mean over a tight loop, ``cold`` the mean over calls each made after
touching ``THRASH_BYTES`` of other memory and sleeping ``SLEEP_S`` (what a process of the
path does between requests). Each figure is the median of ``REPEATS`` alternations, with
its range. The steps: decoding and encoding each message kind of the request path, the
parts of a decode (the JSON header, one tensor on its frame, the message's construction),
and a few calls every request makes (the NaN check, a Prometheus update); ``nothing`` is
the harness's own cost.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import orjson
import zmq

from keel.bench.floor import messages
from keel.bench.rates import SHAPE, spread
from keel.common import protocol
from keel.common.metrics import Metrics
from keel.common.protocol import codec

THRASH_BYTES = 16 * 1024 * 1024
SLEEP_S = 0.0002
REPEATS = 5
#: the no-op model's output size on the path ``keel bench core`` measures
OUTPUT_SIZE = 10
#: calls a figure is the mean of (warm, cold), by --quick
CALLS = {True: (500, 100), False: (2000, 300)}


def steps() -> dict[str, Callable[[], object]]:
    """Name -> a call of one step, on data made once."""
    out: dict[str, Callable[[], object]] = {"nothing": lambda: None}
    msgs = {type(m).__name__: m for m in messages(SHAPE, OUTPUT_SIZE).values()}
    received = {}
    for kind, msg in msgs.items():
        frames = received[kind] = [zmq.Frame(bytes(memoryview(f))) for f in protocol.encode(msg)]
        out[f"decode {kind}"] = lambda frames=frames: protocol.decode(frames)
        out[f"encode {kind}"] = lambda msg=msg: protocol.encode(msg)
    header, tensor = received["Batch"]
    desc = orjson.loads(header.bytes)["tensors"][0]
    fields = {name: getattr(msgs["Batch"], name) for name in ("batch_id", "model", "qids", "reply_to", "inputs")}
    out["Batch: JSON header only (orjson.loads)"] = lambda: orjson.loads(header.buffer)
    out["Batch: its tensor on its frame"] = lambda: codec.decode_tensor(desc, tensor)
    out["Batch: the dataclass only"] = lambda: protocol.Batch(**fields)
    x = msgs["Predict"].input
    out["np.isfinite(x).all() (admission)"] = lambda: np.isfinite(x).all()
    metrics = Metrics("cold")
    histogram, counter = metrics.histogram("h_seconds", "h"), metrics.counter("c_total", "c")
    out["Prometheus: histogram observe"] = lambda: histogram.observe(0.001)
    out["Prometheus: counter inc"] = lambda: counter.inc()
    return out


def _mean_us(fn: Callable[[], object], cold: bool, calls: int, junk: np.ndarray) -> float:
    total = 0.0
    for _ in range(calls):
        if cold:
            junk[::8] += 1  # one write a cache line
            time.sleep(SLEEP_S)
        start = time.perf_counter()
        fn()
        total += time.perf_counter() - start
    return total / calls * 1e6


def run_cold(args, log=print) -> dict:
    calls_warm, calls_cold = CALLS[bool(args.quick)]
    junk = np.zeros(THRASH_BYTES // 8)
    out: dict = {"quick": args.quick, "thrash_bytes": THRASH_BYTES, "sleep_s": SLEEP_S, "repeats": REPEATS, "steps": {}}
    table = steps()
    runs: dict[str, dict[str, list[float]]] = {name: {"warm": [], "cold": []} for name in table}
    for rep in range(REPEATS):
        log(f"repetition {rep + 1} of {REPEATS} ...")
        for name, fn in table.items():
            runs[name]["warm"].append(_mean_us(fn, False, calls_warm, junk))
            runs[name]["cold"].append(_mean_us(fn, True, calls_cold, junk))
    log(f"\n{'step':40s} {'warm µs':>16s} {'cold µs':>18s}")
    for name, r in runs.items():
        warm, cold = spread(r["warm"]), spread(r["cold"])
        out["steps"][name] = {"warm_us": warm, "cold_us": cold}
        log(f"{name:40s} {warm['median']:6.1f} ({warm['range'][0]:.1f}-{warm['range'][1]:.1f})"
            f" {cold['median']:7.1f} ({cold['range'][0]:.0f}-{cold['range'][1]:.0f})")
    kinds = [name.removeprefix("decode ") for name in table if name.startswith("decode ")]
    for mode in ("warm", "cold"):
        key = f"codec_per_request_{mode}_us"  # every kind decoded and encoded once: one request's share
        out[key] = sum(out["steps"][f"{op} {k}"][f"{mode}_us"]["median"] for k in kinds for op in ("decode", "encode"))
    log(f"\none request's messages decoded and encoded once each: {out['codec_per_request_warm_us']:.0f} µs warm, "
        f"{out['codec_per_request_cold_us']:.0f} µs cold")
    return out
