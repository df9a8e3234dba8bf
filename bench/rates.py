"""What ``keel bench core`` and ``keel bench gateway`` measure a request path by: the
latency with one request outstanding, and the highest open-loop rate whose p99 stays
within the SLO, found by bisection; each taken several times in one run and reported as
the median with its range.

Why a bisection and not a ramp: a ramp moves in whole steps (x1.25 before), so one stall
at one step moved a run's figure by a step or more, and two runs of the same tree
differed by up to 5x. The search here doubles (or halves) from where it starts until it
holds a rate that passed below one that failed, then halves that bracket (geometrically)
until its ends are within ``PRECISION`` of each other; the figure is the highest rate
that passed.

A rate's verdict: a probe whose p99 holds passes it at once (a path over its capacity
queues without end, and no short probe of it holds by luck); a probe that fails is taken
again, and a majority of three decides. Below the knee a probe fails by chance (one stall
of a process, or of the machine, spoils a second's p99), and a single failed probe used to
send the whole search down: two searches of one tree in one run differed by up to 70%.

Example
-------
>>> spread([3.0, 1.0, 2.0])
{'median': 2.0, 'range': [1.0, 3.0], 'runs': [3.0, 1.0, 2.0]}
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from keel.common.loadgen import open_loop, summarize

#: a search ends when the highest rate that passed is within this of the lowest that failed
PRECISION = 1.05
SLO_P99_MS = 20.0
#: every figure of ``keel bench core`` and ``keel bench gateway`` is the median of this many repetitions in one run
REPEATS = 3
#: the measured model's input (a no-op or a sleep: the path is what is measured)
SHAPE = [64]
#: paths compared one request outstanding take turns, this many requests at a time (``in_turn``)
IN_TURN_BLOCK = 50


def spread(values: list[float]) -> dict:
    """The median of ``values``, their range, and the values themselves."""
    return {"median": float(np.median(values)), "range": [float(min(values)), float(max(values))],
            "runs": [float(v) for v in values]}


def put(out: dict, key: str, figure: dict) -> None:
    """Store ``spread``'s ``figure`` in a report: the median at ``key``, ``key_range``, ``key_runs``."""
    out[key], out[f"{key}_range"], out[f"{key}_runs"] = figure["median"], figure["range"], figure["runs"]


def in_turn(calls: dict[str, Callable[[np.ndarray], float]], xs: np.ndarray, warmup: int = 200,
            block: int = IN_TURN_BLOCK) -> dict[str, dict]:
    """p50 and p99 (µs) of each path in ``calls``, one request outstanding: ``calls[name](x)``
    sends ``x`` and returns its latency (ms). The paths take turns, ``block`` rows of ``xs`` at
    a time, after ``warmup`` rows through each, so that all see the machine alike: taken one
    block of hundreds after the other, two paths' difference moved with the machine's drift
    between the blocks (the gateway's added p50 read 239-504 µs in the repetitions of one run,
    231-251 taken 50 at a time), and one request at a time each path runs colder after the
    other's (a client's p50 read ~25 µs higher than in blocks of 50)."""
    for x in xs[:warmup]:
        for call in calls.values():
            call(x)
    latencies: dict[str, list[float]] = {name: [] for name in calls}
    for at in range(warmup, len(xs), block):
        rows = xs[at:at + block]
        for name, call in calls.items():
            latencies[name] += [call(x) for x in rows]
    return {name: _p50_p99_us(values) for name, values in latencies.items()}


def predicting(client, model: str = "m") -> Callable[[np.ndarray], float]:
    """A path for ``in_turn``: ``client.predict(model, x)`` (Keel's ``Client``, the floor's
    ``FloorClient``), its result's ``latency_ms``."""
    return lambda x: client.predict(model, x).latency_ms


@contextmanager
def async_predicting(endpoint: str, model: str = "m") -> Iterator[Callable[[np.ndarray], float]]:
    """A path for ``in_turn`` through the asyncio client (``AsyncClient``) of ``endpoint``:
    each call awaited alone in an event loop of its own (the client's clock, as the blocking
    one's, runs from the call to its answer's decoding)."""
    import asyncio

    from keel.common.async_client import AsyncClient

    loop = asyncio.new_event_loop()
    client = AsyncClient([endpoint], timeout_ms=5000)
    try:
        yield lambda x: loop.run_until_complete(client.predict(model, x)).latency_ms
    finally:
        loop.run_until_complete(client.close())
        loop.close()


def _p50_p99_us(latencies_ms: list[float]) -> dict:
    lat = np.array(latencies_ms)
    return {"p50_us": float(np.percentile(lat, 50) * 1000), "p99_us": float(np.percentile(lat, 99) * 1000)}


def probe(client, model: str, xs: np.ndarray, rate: float, seconds: float, slo_ms: float = SLO_P99_MS) -> dict:
    """One open-loop Poisson run at ``rate``/s for ``seconds``: whether its p99 stayed
    within ``slo_ms`` with every request answered by the model (none lost, none by default)."""
    count = max(1, int(rate * seconds))
    stats = summarize(open_loop(client, model, xs, rate=rate, count=count, seed=int(rate), duration_s=seconds * 3))
    p50, p99 = stats["latency_ms"]["p50"], stats["latency_ms"]["p99"]
    ok = stats["lost"] == 0 and p99 is not None and p99 <= slo_ms and stats["sources"].get("model", 0) == count
    return {"rate": round(rate, 1), "p50_ms": p50, "p99_ms": p99, "lost": stats["lost"], "ok": ok}


def max_rate(try_rate: Callable[[float], dict], start: float, limit: float, log=print,
             step: float = 2.0, floor: float = 1.0) -> tuple[float, list[dict]]:
    """The highest rate ``try_rate(rate)["ok"]`` accepts, to within ``PRECISION``: from
    ``start``, rates x``step`` up (or down) until a passing rate lies below a failing one,
    then bisection (geometric) of that bracket. 0.0 if nothing at or above ``floor``
    passes; ``limit`` if that passes. Returns (rate, every probe)."""
    rows: list[dict] = []

    def one(rate: float, nth: int) -> bool:
        row = {**try_rate(rate), "probe": nth}  # nth probe of this rate's verdict
        rows.append(row)
        log(f"    offered {rate:8.0f}/s  p50 {row['p50_ms'] or 0:7.2f} ms  p99 {row['p99_ms'] or 0:7.2f} ms  "
            f"lost {row['lost']}  {'ok' if row['ok'] else 'over SLO'}" + (f"  (probe {nth} of the rate)" if nth > 1 else ""))
        return row["ok"]

    def attempt(rate: float) -> bool:
        """The rate's verdict (the module's docstring): passed at once, else a majority of three."""
        if one(rate, 1):
            return True
        return one(rate, 2) and one(rate, 3)

    rate = min(start, limit)
    if attempt(rate):
        lo, hi = rate, None
        while hi is None:
            if lo >= limit:
                return limit, rows
            rate = min(lo * step, limit)
            if attempt(rate):
                lo = rate
            else:
                hi = rate
    else:
        lo, hi = None, rate
        while lo is None:
            rate = hi / step
            if rate < floor:
                return 0.0, rows
            if attempt(rate):
                lo = rate
            else:
                hi = rate
    while hi / lo > PRECISION:
        mid = math.sqrt(lo * hi)
        if attempt(mid):
            lo = mid
        else:
            hi = mid
    return lo, rows


def model_cluster(launcher, workers: int, frontends: int = 1, **model):
    """Model "m" (a builtin, ``model`` its spec options) on ``workers`` workers behind
    ``frontends`` frontends, started by ``launcher`` (``deploy.local.Launcher``); the spec."""
    from keel.common.spec import load_spec
    from keel.deploy.local import free_port_block

    spec = load_spec({
        "cluster": {"name": "bench-core", "base_port": free_port_block(), "run_dir": str(launcher.log_dir)},
        "frontend": {"log_requests": False, "cache_size": 0, **({"hosts": ["local"] * frontends} if frontends > 1 else {})},
        "models": {"m": {"input_shape": SHAPE, "output_size": 10, "deadline_ms": 1000.0, "workers": workers, **model}},
    })
    return launcher.start_spec(spec)
