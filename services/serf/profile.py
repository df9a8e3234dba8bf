"""A model's SERF profile (§IV-B): the mean service time of each parallelism degree tuple
(i requests running at once, t torch threads each), what it gives the queueing model (the
rates mu_1..mu_c of each configuration (c, t)), and where it is kept.

Example
-------
>>> p = Profile("m", "1", cores=2, service_ms={(1, 1): 20.0, (1, 2): 12.0, (2, 1): 21.0})
>>> p.configurations()
[(1, 1), (1, 2), (2, 1)]
>>> p.mu((2, 1))
[50.0, 47.61904761904762]
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from keel.common.queueing import latency, reference_table, utilisation

FILE = "serf_profile.json"


def tuples(cores: int) -> list[tuple[int, int]]:
    """The parallelism degree tuples (i, t) to profile: every i x t <= cores."""
    return [(i, t) for i in range(1, cores + 1) for t in range(1, cores + 1) if i * t <= cores]


@dataclass
class Profile:
    model: str
    version: str
    cores: int
    #: mean service time (ms) per request with i running at once, t threads each
    service_ms: dict[tuple[int, int], float]
    #: squared coefficient of variation of the service time per tuple (SERF's "D": small)
    scv: dict[tuple[int, int], float] = field(default_factory=dict)
    samples: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Keel's own path outside the worker's service time (client -> frontend -> dispatcher
    #: -> worker -> frontend -> client), measured at one request in flight; added to Eq. 13
    path_ms: float = 0.0
    profiling_s: float = 0.0
    measured_at: float = 0.0
    #: ms a slot stays idle between requests while a queue waits (Done -> dispatcher ->
    #: next Batch), by number of slots; the queue's servers are held service + hand-off
    handoff_ms: dict[int, float] = field(default_factory=dict)
    #: the path measured at several arrival rates: (requests/s, path ms, requests), from
    #: the profiler's own requests (spaced ones at light load, closed loops back to back);
    #: empty in a profile taken before it was measured (then ``path_ms`` at every rate)
    path_points: list[tuple[float, float, int]] = field(default_factory=list)

    def path_at(self, rate: float) -> float:
        """Keel's path (ms) at ``rate`` requests/s: the line through the path's bands
        (``path_bands``), flat beyond the first and the last. Why by rate: processes that
        sleep between far-apart requests wake cold, and above ~100/s the frontend,
        dispatcher and worker loop share this machine's cores; one figure from requests
        50 ms apart said 3-11 ms where the loads' requests saw 6-9 ms."""
        bands = path_bands(self.path_points)
        if not bands:
            return self.path_ms
        rates, paths = zip(*bands)
        return float(np.interp(rate, rates, paths))

    def configurations(self) -> list[tuple[int, int]]:
        """Configurations (c, t) whose every tuple (i <= c, t) was profiled."""
        return [(c, t) for c, t in sorted(self.service_ms) if all((i, t) in self.service_ms for i in range(1, c + 1))]

    def mu(self, config: tuple[int, int]) -> list[float]:
        """mu_1..mu_c (requests/s) of configuration (c, t): the rate at which a slot turns
        over with i running, its service time plus the hand-off."""
        c, t = config
        h = self.handoff_ms.get(c, 0.0)
        return [1000.0 / (self.service_ms[(i, t)] + h) for i in range(1, c + 1)]

    def capacity(self, config: tuple[int, int]) -> float:
        """The arrival rate (req/s) at which configuration ``config`` saturates: c x mu_c."""
        mu = self.mu(config)
        return len(mu) * mu[-1]

    def predict_ms(self, config: tuple[int, int], rate: float, path: bool = True) -> float | None:
        """Mean latency (ms) by Eq. 13, plus Keel's path unless ``path`` is False; None
        where the configuration is unstable. The hand-off holds a slot but is no part of
        a request's own latency: Eq. 13 on the slots' rates, less the hand-off."""
        mu = self.mu(config)
        extra = (self.path_at(rate) if path else 0.0) - self.handoff_ms.get(config[0], 0.0)
        if rate <= 0:
            return 1000.0 / mu[0] + extra
        if utilisation(mu, rate) >= 1:
            return None
        return latency(mu, rate) * 1000.0 + extra

    def rescale(self, config: tuple[int, int], factor: float) -> None:
        """Multiply the service times of ``config``'s tuples (i <= c, t) by ``factor``: what
        the worker measured while serving corrects what profiling measured."""
        c, t = config
        for i in range(1, c + 1):
            self.service_ms[(i, t)] *= factor

    def table(self, rates: list[float]) -> list[dict]:
        """The configuration reference table over ``rates`` (``common.queueing``), each
        latency less its configuration's hand-off (as ``predict_ms``, without the path)."""
        table = reference_table({c: self.mu(c) for c in self.configurations()}, rates)
        for row in table:
            row["latency_s"] = {c: w - self.handoff_ms.get(c[0], 0.0) / 1000.0 for c, w in row["latency_s"].items()}
            row["best"] = min(row["latency_s"], key=row["latency_s"].get) if row["latency_s"] else None
        return table

    def to_json(self) -> dict:
        key = lambda k: f"{k[0]}x{k[1]}"  # noqa: E731
        return {"model": self.model, "version": self.version, "cores": self.cores,
                "service_ms": {key(k): round(v, 4) for k, v in self.service_ms.items()},
                "scv": {key(k): round(v, 5) for k, v in self.scv.items()},
                "samples": {key(k): v for k, v in self.samples.items()},
                "mu": {key(c): [round(m, 3) for m in self.mu(c)] for c in self.configurations()},
                "path_ms": round(self.path_ms, 4), "profiling_s": round(self.profiling_s, 3),
                "measured_at": self.measured_at, "handoff_ms": {str(c): round(h, 4) for c, h in self.handoff_ms.items()},
                "path_points": [[round(r, 3), round(ms, 4), n] for r, ms, n in self.path_points]}

    @classmethod
    def from_json(cls, d: dict) -> Profile:
        def keyed(table: dict) -> dict:
            return {tuple(int(x) for x in k.split("x")): v for k, v in table.items()}
        return cls(d["model"], str(d["version"]), int(d["cores"]), keyed(d["service_ms"]), keyed(d.get("scv", {})),
                   keyed(d.get("samples", {})), float(d.get("path_ms", 0.0)), float(d.get("profiling_s", 0.0)),
                   float(d.get("measured_at", 0.0)), {int(c): float(h) for c, h in d.get("handoff_ms", {}).items()},
                   [(float(r), float(ms), int(n)) for r, ms, n in d.get("path_points", [])])


#: the path's points are pooled into at most this many bands of neighbouring rates
PATH_BANDS = 3


def path_bands(points: list[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """(rate, path ms) of up to ``PATH_BANDS`` bands of the points sorted by rate, each
    about as many points: its rates' mean and its paths' median. A median, because each
    point is one tuple's few requests, and one hiccup of a shared machine in a tuple read
    as 15 ms; bands, because neighbouring tuples' paths differ by more than their rates
    explain (3-7 ms back to back at 18-95/s)."""
    pts = sorted(points)
    if not pts:
        return []
    k = min(PATH_BANDS, len(pts))
    bands = [pts[round(j * len(pts) / k):round((j + 1) * len(pts) / k)] for j in range(k)]
    return [(float(np.mean([r for r, _, _ in b])), float(np.median([ms for _, ms, _ in b]))) for b in bands]


def where(model: str, version: str, store: str | None = None, run_dir: str | None = None) -> Path:
    """Where a model version's profile is kept: beside its manifest in the store when the
    store has that version, else ``run_dir/serf/MODEL-VERSION.json``."""
    if store:
        from keel.common.modelstore import ModelStore

        mstore = ModelStore(store)
        if mstore.has(model, version):
            return mstore.folder(mstore.manifest(model, version)) / FILE
    return Path(run_dir or "runs") / "serf" / f"{model}-{version}.json"


def save(profile: Profile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(profile.to_json(), option=orjson.OPT_INDENT_2))
    return path


def load(path: str | Path, version: str | None = None) -> Profile | None:
    """The profile at ``path``; None when there is none, or it is of another version than
    ``version`` (a new version is reprofiled)."""
    path = Path(path)
    if not path.exists():
        return None
    profile = Profile.from_json(orjson.loads(path.read_bytes()))
    if version is not None and profile.version != str(version):
        return None
    return profile


def stamp() -> float:
    return round(time.time(), 3)
