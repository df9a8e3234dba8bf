"""Chaos experiments of the manager (``chaos/experiments/manager_*.toml``): what the generic
report does not say.

``prepare`` gives the run fresh journals under its output directory (a journal from an
earlier run would replay that run's history) and removes an earlier run's logs there. ``augment`` reads, after the run, what the
processes left: every replica's final state (``*.journal.final.json``, written at
shutdown) and the dispatchers' logs, and adds to the report

* ``manager.replicas_equal``: the replicas alive at the end hold one history (invariant);
* ``manager.one_holder_per_epoch``: no two dispatchers were ever active at one epoch, from
  the dispatchers' own "promoted" log lines and the replicated decision log (invariant);
* for a fault that killed or cut the active dispatcher's host: the time from the fault to
  the first model answer to a query sent after it (``recovery_s``; target <= 0.3 s median)
  and the deadline defaults among queries in flight or sent in that window (target 0);
* a plot ``PATH-manager.png``: latency around each fault, by answer source.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson

from keel.chaos import report as rep


def uses_manager(exp) -> bool:
    return isinstance(exp.cluster.get("manager"), dict)


def prepare(exp, out_dir: Path) -> None:
    """Point the replicas' journals at a fresh directory of this run, and remove the logs an
    earlier run left in the same place (the harness appends to them; ``augment`` reads them)."""
    out_dir = Path(out_dir).absolute()
    journal = out_dir / "manager-journal"
    shutil.rmtree(journal, ignore_errors=True)
    for mode in exp.modes:
        shutil.rmtree(out_dir / mode / "logs", ignore_errors=True)
    exp.cluster["manager"]["journal_dir"] = str(journal)


def _finals(journal_dir: Path) -> list[dict]:
    out = []
    for path in sorted(journal_dir.glob("*.final.json")):
        try:
            out.append(orjson.loads(path.read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            continue
    return out


def _one_state(states: list[dict]) -> bool:
    return bool(states) and all(s == states[0] for s in states)


def replicas_equal(journal_dir: Path) -> tuple[bool, int]:
    """(whether the replicas that wrote a final state at shutdown hold one state, how many did)."""
    states = [f["state"] for f in _finals(Path(journal_dir))]
    return _one_state(states), len(states)


def _promotions(log_root: Path) -> list[dict]:
    """Every "promoted: active dispatcher" line of every dispatcher log under ``log_root``."""
    out = []
    for path in log_root.rglob("dispatcher*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if '"promoted: active dispatcher"' in line:
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                out.append({"service": entry.get("service"), "epoch": entry.get("epoch"), "at": entry.get("timestamp")})
    return out


def _first_model_answer(records: list[dict], t_fault: float) -> tuple[float | None, int, int]:
    """(seconds from the fault to the first model answer to a query sent after it, defaults
    among queries sent up to that answer or in flight at the fault, such queries)."""
    first = None
    for r in records:
        if r["send_t"] < t_fault:
            continue
        for reply in r.get("replies", []):
            if reply.get("source") == "model" and (first is None or reply["recv_t"] < first):
                first = reply["recv_t"]
    window_end = first if first is not None else float("inf")
    defaults = window = 0
    for r in records:
        replies = r.get("replies", [])
        answered = min((x["recv_t"] for x in replies), default=None)
        in_window = r["send_t"] <= window_end and (answered is None or answered >= t_fault)
        if in_window:
            window += 1
            defaults += sum(1 for x in replies if x.get("source") == "default")
    return (None if first is None else first - t_fault), defaults, window


def augment(exp, report: dict, json_path: Path, out_dir: Path) -> dict:
    """Add the manager's figures and invariants to ``report`` and write it again."""
    journal_dir = Path(exp.cluster["manager"]["journal_dir"])
    finals = _finals(journal_dir)
    states = [f["state"] for f in finals]
    equal = _one_state(states)  # the files are read once, above
    promotions = _promotions(Path(out_dir))
    by_epoch: dict[int, set[str]] = {}
    for p in promotions:
        by_epoch.setdefault(p["epoch"], set()).add(p["service"])
    decisions = states[0]["decisions"] if states else []
    decided_epochs = [d["epoch"] for d in decisions]
    one_holder = (all(len(v) == 1 for v in by_epoch.values())
                  and decided_epochs == sorted(set(decided_epochs)))
    disp_hosts = {s.get("host") for s in [exp.cluster.get("dispatcher", {})]}
    faults = []
    for mode, recs_path in report["records"].items():
        records = [orjson.loads(line) for line in Path(recs_path).read_text().splitlines() if line.strip()]
        for ev in report["faults"]:
            if ev.get("mode") not in (mode, None) or ev["kind"] not in ("kill", "partition", "freeze"):
                continue
            recovery, defaults, window = _first_model_answer(records, ev["t_wall"])
            faults.append({"mode": mode, "kind": ev["kind"], "host": ev["host"], "t_rel": ev["t_rel"],
                           "dispatcher_host": ev["host"] in disp_hosts, "recovery_s": recovery,
                           "defaults_in_window": defaults, "queries_in_window": window})
    summary = {
        "replicas": [{"name": f["name"], "seq": f["seq"], "term": f["term"], "leader_changes": f["leader_changes"]}
                     for f in finals],
        "replicas_equal": equal, "one_holder_per_epoch": one_holder, "promotions": promotions,
        "decisions": decisions, "faults": faults,
        "targets": {"recovery_s_median": 0.3, "defaults_in_window": 0},
    }
    report["manager"] = summary
    for name, ok, detail in (
        ("manager_replicas_equal", equal, f"{len(states)} final states"),
        ("manager_one_holder_per_epoch", one_holder, f"promotions by epoch {sorted((k, sorted(v)) for k, v in by_epoch.items())}"),
    ):
        report["invariants_all"].append({"name": name, "mode": "manager", "ok": ok, "checked": len(states),
                                         "violations": int(not ok), "detail": detail, "examples": []})
    stem = Path(json_path).with_suffix("")
    report["plots"]["manager"] = str(_plot(report, faults, Path(f"{stem}-manager.png"), exp.name))
    rep.write_json(Path(json_path), report)
    return summary


def _plot(report: dict, faults: list[dict], path: Path, name: str) -> Path:
    """Latency of each query against its send time around the first fault, by source."""
    plt = rep._plt()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    t_fault = next((ev["t_wall"] for ev in report["faults"] if ev["kind"] in ("kill", "partition", "freeze")), None)
    colors = {"model": "tab:blue", "default": "tab:red", "error": "black", "cache": "tab:green"}
    for mode, recs_path in report["records"].items():
        points: dict[str, list[tuple[float, float]]] = {}
        for line in Path(recs_path).read_text().splitlines():
            r = orjson.loads(line)
            for reply in r.get("replies", [])[:1]:
                t = r["send_t"] - (t_fault or r["send_t"])
                points.setdefault(reply.get("source", "?"), []).append((t, reply.get("latency_ms") or 0.0))
        for source, pts in points.items():
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, s=4, label=f"{mode}: {source}", color=colors.get(source))
    first = faults[0]["t_rel"] if faults else 0.0
    for f in faults:
        x0 = f["t_rel"] - first
        ax.axvline(x0, color="tab:red", linestyle="--", label=f"{f['kind']} {f['host']} at {x0:+.1f} s")
        if f["recovery_s"] is not None:
            ax.axvline(x0 + f["recovery_s"], color="tab:green", linestyle=":",
                       label=f"first model answer after it: {f['recovery_s'] * 1000:.0f} ms")
    ax.set_xlabel("send time relative to the first fault (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"{name}: latency around the fault")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_summary(summary: dict[str, Any]) -> None:
    print(f"manager: replicas_equal {summary['replicas_equal']}  one_holder_per_epoch {summary['one_holder_per_epoch']}  "
          f"replicas {[(r['name'], r['seq'], r['leader_changes']) for r in summary['replicas']]}")
    for f in summary["faults"]:
        rec = "-" if f["recovery_s"] is None else f"{f['recovery_s'] * 1000:.0f} ms"
        print(f"  {f['kind']} {f['host']} at {f['t_rel']:.1f} s: first model answer after it {rec}; "
              f"defaults in the window {f['defaults_in_window']} of {f['queries_in_window']} queries")
