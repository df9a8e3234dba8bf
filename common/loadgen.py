"""Open-loop load: the arrival schedule, the sender, the per-request record, its latency
summary and its accuracy grade. ``keel demo``, ``keel bench core`` and the chaos
workload generator (``chaos.workload``) all use these.

Queries are sent at their scheduled times whether or not earlier ones were answered
(open loop, so queueing shows up in latency instead of throttling the sender). The run
stops after ``count`` queries or ``duration_s``, whichever comes first, then waits at
most ``drain_s`` for outstanding answers; a query still unanswered then is recorded as
lost.

One record shape is summarized and graded: a dict ::

    {"request_id", "input_index", "send_t",
     "replies": [{"recv_t", "source", "error_code", "output", "latency_ms"?}, ...]}

(``chaos.workload`` writes it as JSON lines; ``Record.as_dict`` gives it for
``open_loop``'s records). ``replies`` is empty for a query nobody answered.

Example
-------
>>> records = open_loop(client, "noop", inputs, rate=1000, count=5000, seed=1)  # doctest: +SKIP
>>> summarize(records)["latency_ms"]["p99"]                                    # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

#: error codes that refuse a query at admission: it was never accepted, so not lost
REJECTED = frozenset({"overloaded", "bad_request", "unknown_model"})
PERCENTILES = (50, 90, 99, 99.9)
#: an unbounded-count schedule is cut here
MAX_REQUESTS = 1_000_000


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

    def as_dict(self) -> dict:
        """This record in the shape ``summarize`` and ``grade`` read."""
        replies = [] if self.received is None else [{
            "recv_t": self.received, "source": None if self.source is None else str(self.source),
            "error_code": None if self.error_code is None else str(self.error_code), "output": self.output}]
        return {"request_id": self.request_id, "input_index": self.index, "send_t": self.sent, "replies": replies}


# --------------------------------------------------------------------------- schedule


def settle_heap() -> None:
    """Before a load from a process that ran earlier loads (an experiment's cells or trials):
    their records and results, collected and frozen, so a full collection walking them does
    not pause the sender mid-load (such pauses read as latency: a run's first cell read
    9-12 ms lower than its others before this)."""
    gc.collect()
    gc.freeze()


def schedule(rate: float, count: int | None, seed: int, n_inputs: int,
             duration_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, rows): the send time (s from the start) of each Poisson arrival at
    ``rate``/s and the input row it sends, at most ``count`` (None: as many as fit in
    ``duration_s``), all before ``duration_s`` when given. Seeded: every mode of an
    experiment and every rerun sees the same arrivals and inputs."""
    if count is None:
        if duration_s is None:
            raise ValueError("schedule needs count or duration_s")
        count = min(MAX_REQUESTS, math.ceil(rate * duration_s * 1.2 + 50))
    offsets = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=count))
    if duration_s is not None:
        offsets = offsets[offsets < duration_s]
    rows = np.random.default_rng(seed + 1).integers(0, n_inputs, size=len(offsets))
    return offsets, rows


def open_loop(client: Any, model: str, inputs: np.ndarray, rate: float, count: int, seed: int = 0,
              duration_s: float = 60.0, timeout_ms: float | None = None, drain_s: float = 5.0,
              keep_outputs: bool = False, offsets: np.ndarray | None = None) -> list[Record]:
    """Send the schedule through ``client`` (``submit``/``collect``, e.g. a ``Client``).
    ``offsets``: send times (s from the start) to use instead of Poisson arrivals at
    ``rate`` (a load that steps, made of ``schedule``s of several rates)."""
    if rate <= 0 or count <= 0:
        raise ValueError("rate and count must be positive")
    if offsets is None:
        offsets, picks = schedule(rate, count, seed, len(inputs), duration_s)
    else:
        picks = np.random.default_rng(seed + 1).integers(0, len(inputs), size=len(offsets))
    records: list[Record] = []
    by_id: dict[str, Record] = {}
    start = time.time()
    n, i = len(offsets), 0

    def absorb(results) -> None:
        now = time.time()
        for result in results:
            rec = by_id.pop(result.request_id, None)
            if rec is not None:
                rec.received, rec.source, rec.error_code = now, result.source, result.error_code
                if keep_outputs:
                    rec.output = result.output

    # the queries due at once leave together where the client can hold its sends (``Client.cork``)
    cork = getattr(client, "cork", contextlib.nullcontext)
    while i < n:
        now = time.time()
        if start + offsets[i] <= now:  # (no cork, and no flush after it, on a turn with nothing due)
            with cork():
                while i < n and start + offsets[i] <= now:
                    sent = time.time()
                    rid = client.submit(model, inputs[picks[i]], timeout_ms=timeout_ms)
                    rec = Record(rid, int(picks[i]), sent)
                    records.append(rec)
                    by_id[rid] = rec
                    i += 1
        wait_ms = max(0.0, (start + offsets[i] - time.time()) * 1000.0) if i < n else 0.0
        absorb(client.collect(min(wait_ms, 50.0)) if wait_ms > 0 else client.collect(0.0))
    drain_end = time.time() + drain_s
    while by_id and time.time() < drain_end:
        absorb(client.collect(50.0))
    return records


# --------------------------------------------------------------------------- summary


def _dicts(records: Iterable[Record | dict]) -> list[dict]:
    return [r.as_dict() if isinstance(r, Record) else r for r in records]


def answers(record: dict) -> list[dict]:
    """The real answers of a request: replies except the client's own timeouts."""
    return [r for r in record.get("replies", []) if r.get("error_code") != "timeout"]


def accepted(record: dict) -> bool:
    """Not refused at admission (overloaded, bad request, unknown model)."""
    replies = record.get("replies", [])
    return not (replies and replies[0].get("error_code") in REJECTED)


def pkey(p: float) -> str:
    return f"p{p:g}"


def latency_ms(record: dict) -> float | None:
    """Send to first answer (ms) when that answer is a prediction, else None."""
    got = answers(record)
    if not got or got[0].get("source") == "error":
        return None
    first = got[0]
    if first.get("latency_ms") is not None:
        return float(first["latency_ms"])
    return (first["recv_t"] - record["send_t"]) * 1000.0


def summarize(records: Iterable[Record | dict]) -> dict:
    """Counts (sent, accepted, rejected, answered, lost, predictions), first answers by
    source and error code, latency percentiles (p50, p90, p99, p99.9, mean, max) over
    predictions (model, cache, default or reconstruction: not an error), and the
    offered rate."""
    records = _dicts(records)
    lat = np.array([v for v in map(latency_ms, records) if v is not None])
    sources: dict[str, int] = {}
    errors: dict[str, int] = {}
    for rec in records:
        got = answers(rec) or rec.get("replies", [])[:1]
        if got:
            sources[got[0]["source"]] = sources.get(got[0]["source"], 0) + 1
            if got[0].get("error_code"):
                errors[got[0]["error_code"]] = errors.get(got[0]["error_code"], 0) + 1
    acc = [r for r in records if accepted(r)]
    out = {
        "sent": len(records),
        "accepted": len(acc),
        "rejected": sum(1 for r in records if r.get("replies") and r["replies"][0].get("error_code") in REJECTED),
        "answered": sum(1 for r in acc if answers(r)),
        "lost": sum(1 for r in acc if not answers(r)),
        "predictions": int(lat.size),
        "sources": sources,
        "errors": errors,
        "latency_ms": {pkey(p): (float(np.percentile(lat, p)) if lat.size else None) for p in PERCENTILES},
    }
    out["latency_ms"]["mean"] = float(lat.mean()) if lat.size else None
    out["latency_ms"]["max"] = float(lat.max()) if lat.size else None
    sends = [r["send_t"] for r in records]
    if len(sends) > 1 and max(sends) > min(sends):
        out["offered_rps"] = (len(sends) - 1) / (max(sends) - min(sends))
    return out


def grade(records: Iterable[Record | dict], labels: np.ndarray) -> dict:
    """Top-1 accuracy of the first answers that carry an output, against ``labels``
    (indexed by each record's input row), overall and over reconstructions alone (ParM's
    degraded-mode accuracy, measured online). None where there is nothing to grade."""
    right: list[bool] = []
    rebuilt: list[bool] = []
    for rec in _dicts(records):
        got = answers(rec)
        if not got or got[0].get("output") is None:
            continue
        ok = bool(np.argmax(got[0]["output"]) == labels[rec["input_index"]])
        right.append(ok)
        if got[0].get("source") == "reconstruction":
            rebuilt.append(ok)
    return {"accuracy": float(np.mean(right)) if right else None, "graded": len(right),
            "reconstructed": len(rebuilt), "degraded_accuracy": float(np.mean(rebuilt)) if rebuilt else None}


def write_json(path: str | Path, report: dict) -> Path:
    """Write a benchmark's or experiment's figures (numpy values and non-string keys
    allowed), making the folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    return path


def write_json_and_plot(path: str | Path, report: dict, plot: Callable[[dict, Path], None]) -> Path:
    """``write_json`` with the report's plot beside it (``path`` as .png, drawn by
    ``plot(report, png)``, named in the report as ``plot`` when one was drawn); returns the
    plot's path.

    Keys that start with "_" are the plot's (series too long for the figures) and are left
    out of the JSON; the JSON is written even if the plot fails."""
    png = Path(path).with_suffix(".png")
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)  # a run that draws nothing must not leave an older run's plot beside its JSON
    report["plot"] = str(png)
    try:
        plot(report, png)
    finally:
        if not png.exists():
            report.pop("plot", None)
        write_json(path, {k: v for k, v in report.items() if not str(k).startswith("_")})
    return png


def figures_table(figures: dict, keys: Iterable[str], targets: dict[str, str] | None = None) -> list[str]:
    """The lines of a printed table: each of ``keys`` with its value in ``figures`` and its
    target (text such as "<= 2.0") when ``targets`` has one."""
    targets = targets or {}
    keys = list(keys)
    width = max(len(k) for k in keys) + 2
    lines = [f"{'figure':<{width}}{'value':>12}  target"]
    for key in keys:
        value = figures.get(key)
        shown = (f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}") if isinstance(value, float) else str(value)
        lines.append(f"{key:<{width}}{shown:>12}  {targets.get(key, '')}".rstrip())
    return lines
