"""Open-loop load: Poisson arrivals through the client library, always bounded.

Queries are sent at their scheduled times whether or not earlier ones were answered
(open loop, so queueing shows up in latency instead of throttling the sender). The run
stops after ``count`` queries or ``duration_s``, whichever comes first, then waits at
most ``drain_s`` for outstanding answers; a query still unanswered then is recorded as
lost. Every record has the send and receive times, the source and the reply.

Example
-------
>>> records = open_loop(client, "noop", inputs, rate=1000, count=5000, seed=1)  # doctest: +SKIP
>>> summarize(records)["p99_ms"]                                               # doctest: +SKIP
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from common.client import Client


@dataclass(slots=True)
class Record:
    request_id: str
    index: int  # row of the input set that was sent
    sent: float  # time.time()
    received: float | None = None
    source: str | None = None
    output: np.ndarray | None = None
    error_code: str | None = None

    @property
    def latency_ms(self) -> float | None:
        return None if self.received is None else (self.received - self.sent) * 1000.0


def poisson_schedule(rate: float, count: int, seed: int) -> np.ndarray:
    """Offsets (s) of ``count`` Poisson arrivals at ``rate`` per second."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, size=count))


def open_loop(client: Client, model: str, inputs: np.ndarray, rate: float, count: int, seed: int = 0,
              duration_s: float = 60.0, timeout_ms: float | None = None, drain_s: float = 5.0,
              keep_outputs: bool = False) -> list[Record]:
    if rate <= 0 or count <= 0:
        raise ValueError("rate and count must be positive")
    offsets = poisson_schedule(rate, count, seed)
    picks = np.random.default_rng(seed + 1).integers(0, len(inputs), size=count)
    records: list[Record] = []
    by_id: dict[str, Record] = {}
    start = time.time()
    stop_at = start + duration_s
    i = 0

    def absorb(results) -> None:
        now = time.time()
        for result in results:
            rec = by_id.pop(result.request_id, None)
            if rec is not None:
                rec.received, rec.source, rec.error_code = now, result.source, result.error_code
                if keep_outputs:
                    rec.output = result.output

    while i < count:
        now = time.time()
        if now >= stop_at:
            break
        while i < count and start + offsets[i] <= now:
            sent = time.time()
            rid = client.submit(model, inputs[picks[i]], timeout_ms)
            rec = Record(rid, int(picks[i]), sent)
            records.append(rec)
            by_id[rid] = rec
            i += 1
        wait_ms = max(0.0, (start + offsets[i] - time.time()) * 1000.0) if i < count else 0.0
        absorb(client.collect(min(wait_ms, 50.0)) if wait_ms > 0 else client.collect(0.0))
    drain_end = time.time() + drain_s
    while by_id and time.time() < drain_end:
        absorb(client.collect(50.0))
    return records


def summarize(records: list[Record]) -> dict:
    """Latency percentiles over answered records, and counts by source."""
    lat = np.array([r.latency_ms for r in records if r.received is not None])
    sources: dict[str, int] = {}
    for r in records:
        key = r.source or "lost"
        sources[key] = sources.get(key, 0) + 1
    out = {"sent": len(records), "answered": int(len(lat)), "lost": len(records) - int(len(lat)), "sources": sources}
    if len(lat):
        for name, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99), ("p999_ms", 99.9)):
            out[name] = float(np.percentile(lat, q))
        out["mean_ms"] = float(lat.mean())
    if len(records) > 1:
        span = records[-1].sent - records[0].sent
        out["offered_rps"] = (len(records) - 1) / span if span > 0 else 0.0
    return out
