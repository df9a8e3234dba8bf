"""Triton's model statistics, as a gateway sees its requests (``GET /v2/models/stats``).

perf_analyzer asks a server for its statistics before and after each measurement and
shows the difference beside its own; it stops when the server has none. The gateway
keeps, per target, what it can see: requests (``execution_count``), rows
(``inference_count``, each one Keel query), and their wall time from the first query
sent to the last answer (``success``/``fail``). Keel's own queueing and compute happen in
the frontends, dispatcher and workers (their Prometheus metrics): here ``compute_infer``
is the whole path and ``queue``, ``compute_input`` and ``compute_output`` count requests
with no time of their own, so a reader's averages are never a division by zero.

Example
-------
>>> stats = Statistics()
>>> stats.record("rec", "1", rows=2, ns=1_000, ok=True)
>>> s = stats.to_json(["rec"])["model_stats"][0]
>>> s["inference_count"], s["execution_count"], s["inference_stats"]["success"]
(2, 1, {'count': 1, 'ns': 1000})
"""
from __future__ import annotations

import time
from typing import Any

from keel.services.oip.triton import DURATIONS


class Statistics:
    """Per target: its counts and durations since the gateway started."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, Any]] = {}

    def record(self, name: str, version: str | None, *, rows: int, ns: int, ok: bool) -> None:
        """One request of ``rows`` rows to ``name`` answered (``ok``) or refused after ``ns``."""
        model = self.models.get(name)
        if model is None:
            model = self.models[name] = {"version": "", "last_inference": 0, "inference_count": 0,
                                         "execution_count": 0, **{k: [0, 0] for k in DURATIONS}}
        model["version"] = version or model["version"]
        model["last_inference"] = int(time.time() * 1000)
        if not ok:
            model["fail"][0] += 1
            model["fail"][1] += ns
            return
        model["inference_count"] += rows
        model["execution_count"] += 1
        for key in ("success", "compute_infer"):
            model[key][0] += 1
            model[key][1] += ns
        for key in ("queue", "compute_input", "compute_output"):
            model[key][0] += 1

    def to_json(self, names: list[str], version: str | None = None) -> dict[str, Any]:
        """Triton's statistics JSON for ``names`` (zeros for one not asked yet)."""
        stats = []
        for name in names:
            model = self.models.get(name) or {"version": version or "", "last_inference": 0, "inference_count": 0,
                                              "execution_count": 0, **{k: [0, 0] for k in DURATIONS}}
            stats.append({"name": name, "version": version or model["version"],
                          "last_inference": model["last_inference"], "inference_count": model["inference_count"],
                          "execution_count": model["execution_count"],
                          "inference_stats": {k: {"count": model[k][0], "ns": model[k][1]} for k in DURATIONS},
                          "batch_stats": []})
        return {"model_stats": stats}
