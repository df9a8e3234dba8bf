"""Reports: per-mode latency percentiles and counts, mode ratios, JSON and PNG plots.

``summarize(records)`` (``common.loadgen.summarize``, the one latency summary) counts
sent / accepted / answered / lost / rejected requests and answer sources, and takes
latency percentiles (p50, p90, p99, p99.9) over requests whose first answer is a
prediction (model, cache, default or reconstruction: not an error).
``ratios`` compares every mode with the first one, the quantity ParM's figures plot.
``plot_cdf`` draws each mode's latency CDF and its tail; ``plot_timeline`` draws latency
over time with a marker per fault.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from keel.common.loadgen import PERCENTILES, latency_ms, pkey, summarize, write_json  # noqa: F401  (re-exported)
from keel.common.plotting import pyplot

_FAULT_COLORS = {"kill": "red", "restart": "green", "freeze": "purple", "thaw": "violet", "partition": "orange",
                 "heal": "gold", "shuffle": "blue", "delay": "brown", "undelay": "tan", "limit": "gray"}


def ratios(summaries: dict[str, dict]) -> dict[str, dict]:
    """Each mode's percentiles divided by the first mode's (e.g. "equal/parm")."""
    modes = list(summaries)
    if len(modes) < 2:
        return {}
    base = summaries[modes[0]]["latency_ms"]
    out = {}
    for m in modes[1:]:
        mine = summaries[m]["latency_ms"]
        out[f"{m}/{modes[0]}"] = {k: (mine[k] / base[k] if mine.get(k) and base.get(k) else None)
                                  for k in [pkey(p) for p in PERCENTILES] + ["mean"]}
    return out


def plot_cdf(records: dict[str, list[dict]], path: Path, title: str = "") -> Path:
    """Latency CDF per mode (left) and its tail, 1 - CDF on a log scale (right)."""
    plt = pyplot()
    fig, (ax, tail) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, recs in records.items():
        lat = np.sort([v for v in map(latency_ms, recs) if v is not None])
        if not lat.size:
            continue
        frac = np.arange(1, lat.size + 1) / lat.size
        p99 = np.percentile(lat, 99)
        ax.plot(lat, frac, label=f"{mode} (n={lat.size}, p99 {p99:.1f} ms)")
        tail.plot(lat, np.maximum(1.0 - frac + 1.0 / lat.size, 1.0 / lat.size), label=mode)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of predictions")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    tail.set_xscale("log")
    tail.set_yscale("log")
    tail.set_xlabel("latency (ms)")
    tail.set_ylabel("fraction slower (1 - CDF)")
    tail.grid(True, which="both", alpha=0.3)
    for p in (0.1, 0.01, 0.001):
        tail.axhline(p, color="gray", lw=0.5, ls=":")
    fig.suptitle(title or "latency CDF per mode")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_timeline(records: dict[str, list[dict]], events: list[dict], t0: float, path: Path, title: str = "") -> Path:
    """Latency of each request against its send time, lost requests on top, fault markers."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    top = 1.0
    for mode, recs in records.items():
        pts = [(r["send_t"] - t0, latency_ms(r)) for r in recs]
        ok = np.array([(t, v) for t, v in pts if v is not None])
        if ok.size:
            ax.scatter(ok[:, 0], ok[:, 1], s=3, alpha=0.5, label=mode)
            top = max(top, float(ok[:, 1].max()))
    for mode, recs in records.items():
        miss = [r["send_t"] - t0 for r in recs if latency_ms(r) is None]
        if miss:
            ax.scatter(miss, [top * 1.5] * len(miss), marker="x", s=12, label=f"{mode}: no prediction ({len(miss)})")
    seen = set()
    for ev in events:
        if ev.get("ok") is None:
            continue
        t = ev["t_wall"] - t0
        key = (ev["kind"], ev.get("host"), round(t, 1))
        if key in seen:  # the same fault applied to several modes
            continue
        seen.add(key)
        color = _FAULT_COLORS.get(ev["kind"], "black")
        ax.axvline(t, color=color, ls="--", lw=1)
        ax.text(t, top * 2.2, f" {ev['kind']} {ev.get('host') or ''}", rotation=90, va="top", fontsize=7, color=color)
        if ev["kind"] == "shuffle":
            ax.axvspan(t, t + float(ev["params"].get("duration_s", 0)), color=color, alpha=0.06)
    ax.set_yscale("log")
    ax.set_ylim(top=top * 2.5)
    ax.set_xlabel("time since workload start (s)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "latency over time, with faults")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
