"""``keel experiment hams-timeline``: one recovery, drawn (HAMS §IV-E; docs/design/hams.md).

One trial of ``hams-recovery``'s stateful case (GRU -> GRU under open load, g2's primary
SIGKILLed at a chosen request), its traces kept, and a picture of what every process did
around the fault: each operator's outputs by seq (old and new epoch), the backups' applied
states (what is durable), and the replies the frontend released. Times are the traces'
``time.monotonic()`` (one clock for every process of the host), drawn relative to the fault.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from keel.common.ids import SEQ_MASK
from keel.deploy.local import Launcher


def events(streams: dict[str, list[dict]], fault_t: float, victim: str) -> dict[str, Any]:
    """The trial's traces as (ms after the fault, seq) series, per what they show."""
    ms = lambda t: 1000 * (t - fault_t)  # noqa: E731
    takeover = next((t for t in streams.get("graph_takeover", []) if t["operator"] == victim), None)
    series: dict[str, list[tuple[float, int]]] = {}
    for o in streams["graph_output"]:
        new = takeover is not None and o["operator"] == victim and o.get("epoch") == takeover["epoch"]
        series.setdefault(f"{o['operator']} output" + (" (new epoch)" if new else ""), []).append((ms(o["t"]), o["seq"]))
    for a in streams["graph_apply"]:
        series.setdefault(f"{a['operator']} durable" + (" (degraded)" if a.get("degraded") else ""), []).append(
            (ms(a["t"]), a["last_seq"]))
    # origins carry the frontend's incarnation in their high bits: the request's number is the low ones
    series["frontend release"] = [(ms(r["t"]), r["origin"] & SEQ_MASK) for r in streams["graph_release"]]
    first_new = min((t for t, _ in series.get(f"{victim} output (new epoch)", [])), default=None)
    return {"series": {k: sorted(v) for k, v in series.items()},
            "takeover_ms": ms(takeover["t"]) if takeover else None, "max_seq": takeover["max_seq"] if takeover else None,
            "first_new_output_ms": first_new}


def plot(out: dict, path: Path, window_ms: tuple[float, float] = (-40.0, 120.0)) -> None:
    """One panel per operator (its outputs and its durable states) and one for the replies."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({name.split()[0] for name in out["series"] if name != "frontend release"})
    fig, axes = plt.subplots(len(ops) + 1, 1, figsize=(9, 2.6 * (len(ops) + 1)), sharex=True)
    styles = {"output": ("o", 5), "durable": ("s", 3), "release": ("x", 5)}
    for ax, who in zip(axes, ops + ["frontend"]):
        for name, points in out["series"].items():
            if name.split()[0] != who:
                continue
            points = [(t, s) for t, s in points if window_ms[0] <= t <= window_ms[1]]
            marker, size = next(v for k, v in styles.items() if k in name)
            ax.plot([t for t, _ in points], [s for _, s in points], marker, markersize=size, label=name, alpha=0.75,
                    fillstyle="none" if "durable" in name else "full")
        ax.axvline(0, color="red", lw=1)
        if out["takeover_ms"] is not None:
            ax.axvline(out["takeover_ms"], color="purple", lw=1, ls="--")
        if out["first_new_output_ms"] is not None:
            ax.axvline(out["first_new_output_ms"], color="green", lw=1, ls=":")
        ax.set_ylabel("request (origin)" if who == "frontend" else f"{who} seq")
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_title(f"SIGKILL of {out['victim']}'s primary at 0 (red); its backup promoted (purple; max_seq "
                      f"{out['max_seq']}); its first new output (green)", fontsize=9)
    axes[-1].set_xlabel("ms after the fault (the traces' clock, one host)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def timeline(kill_at: int, seed: int) -> dict:
    """One kill trial of g2's primary and its events, from the traces."""
    from keel.chaos.graph_trials import kill_trial
    from keel.chaos.invariants import load_graph_traces

    with tempfile.TemporaryDirectory(prefix="hams-timeline-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        row = kill_trial(lambda n: Launcher(work / "logs" / n), work, "g2", n=240, kill_at=kill_at, seed=seed)
        streams = load_graph_traces(str(work / "trace"))
    takeover = next((t for t in streams.get("graph_takeover", []) if t["operator"] == "g2"), None)
    if takeover is None or row["detection_ms"] is None:
        raise SystemExit(f"no takeover in the trial's traces (lost {row['lost']}); nothing to draw")
    fault_t = takeover["t"] - row["detection_ms"] / 1000
    out = {"victim": "g2", "kill_at": kill_at, **{k: row[k] for k in ("detection_ms", "takeover_ms", "recovery_ms",
                                                                      "lost", "conflicts", "invariants_ok")},
           **events(streams, fault_t, "g2")}
    return out


#: the printed table (keel experiment)
FIGURES = ("detection_ms", "takeover_ms", "recovery_ms", "lost", "conflicts", "invariants_ok")
TARGETS = {"lost": "0", "conflicts": "0", "invariants_ok": "True"}


def run(args: argparse.Namespace, log=print) -> dict:
    return timeline(args.kill_at, args.seed)


def passed(report: dict) -> bool:
    return report["lost"] == 0 and report["conflicts"] == 0 and report["invariants_ok"]


def options(e: argparse.ArgumentParser) -> None:
    """``keel experiment hams-timeline``'s own options."""
    e.add_argument("--kill-at", type=int, default=120, help="SIGKILL after this request (of 240)")
    e.add_argument("--seed", type=int, default=0)
