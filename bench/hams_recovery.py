"""``keel experiment hams-recovery``: how fast a HAMS service graph recovers, and whether it
loses or contradicts anything (HAMS §IV-E, §VII-D), on real processes, in netns mode (every
process on a network namespace of its own, host faults; ``--netns auto`` when the machine
allows it) or in local mode (every process on loopback, ``--netns off``).

The graph is GRU -> GRU (NSPB, W=2) with the manager group (three Raft replicas) that
detects failures and promotes backups. Per trial: a fresh cluster, open-loop load at a
fixed rate, and at a random moment the stateful primary of g2 is SIGKILLed. The harness's
clock (``time.monotonic()``, one clock for every process of the host, the one the traces
use) gives, per trial:

- ``detection_ms``: fault -> the backup learns the manager promoted it (its ``takeover`` trace);
- ``takeover_ms``: that -> the first new output of the recovered operator;
- ``recovery_ms``: fault -> that first new output (the sum, what the targets name);
- ``lost`` (requests never answered or answered with an error), ``conflicts`` (violations
  of one output per (operator, seq), and requests answered twice or unlike an offline
  run of the deterministic GRUs), and the HAMS invariants' verdicts.

Cases (``CASES``): SIGKILL of the last stateful primary (g2), of the first (g1: g2 rolls
back when it took lost outputs), of g2's backup (its primary's window stalls; after a grace
it goes on alone from its newest shipped state, rolled back in place at a new epoch), of a
stateless operator (its hot standby takes over);
SIGSTOP of g2's primary (a freeze: its sockets stay open, so only the manager's heartbeat
silence detects it), SIGCONT once the backup was promoted (the thawed primary must be
fenced and number nothing more at its old epoch); in netns mode, a partition of g2's
primary's host (healed once the backup was promoted: fenced by epoch, it rejoins as
backup); the correlated cases: a stateless and a
stateful operator killed together (m and g2 of MLP -> GRU -> GRU), and two adjacent
stateful primaries (g1 and g2). A correlated trial's times are its slowest victim's. With
noise (GRUs whose every run differs) under NSPB, and under the ``strawman`` mode (no state
shipping: the replacement re-executes on a fresh state), where the checker must find
conflicts (``strawman_conflicts`` > 0; not counted in the nspb figures). HAMS Fig. 6
(``fig6_chain``): GRU -> GRU -> GRU, g2's state delivery to its backup delayed 30 ms (in netns
mode by the chaos delay proxy on that link, in local mode by the spec's ``state_delay_ms``
hook at the backup), then g2's primary and g3's backup killed
together: g3's primary rolls back in place (a trial's recovery is the slower of g2's takeover
and g3's roll-back); the same fault under the strawman.
``ls_stateful_kill``: the Lineage Stash baseline (mode ``ls``, ``ls_chain``: a checkpoint
every 100 batches, noise): its cold standby loads the checkpoint and replays; the checker must
find conflicts (``ls_conflicts`` > 0, ``ls_lost``; ``ls_kill_median_ms`` / ``_max_ms``: fault
-> its first output above its highest seq before the fault, i.e. after the replay), against
the outputs since the checkpoint (``ls_recovery_by_batches_since_checkpoint``: one input a
batch, so outputs = batches) beside nspb's against the kill time (``nspb_recovery_by_kill_at``:
``stateful_primary_kill`` and ``stateful_primary_kill_late``, the same fault after 5-10 s of
load); each with its least-squares slope (``ls_growth_ms_per_1000_batches``,
``nspb_growth_ms_per_1000_requests``). ``--cases A,B`` runs only those. JSON keys (``mode``: which mode ran):
``stateful_kill_median_ms``, ``stateful_kill_max_ms``, ``stateful_kill_late_median_ms`` / ``_max_ms``,
``detection_median_ms``, ``takeover_median_ms``, ``upstream_stateful_kill_median_ms``,
``stateless_kill_median_ms``, ``backup_kill_median_ms``, ``backup_kill_max_ms``,
``freeze_partition_median_ms``, ``freeze_partition_max_ms``
(freeze and partition trials), ``freeze_median_ms``, ``freeze_max_ms``, ``partition_trials``,
``partition_fenced``, ``partition_old_epoch_outputs_after_heal``, ``freeze_fenced``, ``freeze_old_epoch_outputs_after_thaw``,
``correlated_stateless_stateful_median_ms`` / ``_max_ms``,
``correlated_adjacent_stateful_median_ms`` / ``_max_ms``, ``fig6_median_ms``, ``fig6_max_ms``,
``fig6_trials``, ``fig6_rolled_back_in_place``, ``strawman_fig6_conflicts``, ``strawman_conflicts``, ``nspb_lost``,
``nspb_conflicts``, ``trials``, ``cases``.
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from keel.common import loadgen
from keel.common.steal import StealMeter

from keel.chaos.graph_trials import (FIG6_STATE_DELAY, fig6_chain, gru_chain, ls_chain, mlp_gru, mlp_gru_gru,
                                      noisy_chain, run_trial, strawman_chain)
TARGETS = {"partition_fenced": "== True", "partition_old_epoch_outputs_after_heal": "== 0", "stateful_kill_median_ms": "<= 100", "stateful_kill_max_ms": "<= 200", "stateless_kill_median_ms": "<= 100",
           "freeze_partition_max_ms": "<= 250", "freeze_fenced": "== True", "freeze_old_epoch_outputs_after_thaw": "== 0",
           "correlated_stateless_stateful_max_ms": "<= 200", "correlated_adjacent_stateful_max_ms": "<= 150", "fig6_max_ms": "<= 400", "fig6_trials": ">= 50 (full)",
           "strawman_conflicts": "> 0", "strawman_fig6_conflicts": "> 0", "nspb_lost": "== 0", "nspb_conflicts": "== 0",
           "ls_conflicts": "> 0", "ls_lost": "== 0", "stateful_kill_late_median_ms": "<= 100",
           "stateful_kill_late_max_ms": "<= 200", "nspb_growth_ms_per_1000_requests": "~0 (ls's grows)"}


CASES = (  # name, victims, fault, graph, what, trials (quick, full)
    ("stateful_primary_kill", "g2", "kill", gru_chain, "SIGKILL of g2's primary (stateful, last), GRU -> GRU", (3, 20)),
    ("stateful_primary_kill_late", "g2", "kill", gru_chain,
     "SIGKILL of g2's primary after 5-10 s of load (1,200-2,400 requests), GRU -> GRU: recovery must not grow "
     "with how long the graph ran", (3, 5)),
    ("upstream_stateful_kill", "g1", "kill", gru_chain,
     "SIGKILL of g1's primary (stateful, first; g2 rolls back if it took lost outputs)", (2, 10)),
    ("stateful_backup_kill", (), "kill", gru_chain,
     "SIGKILL of g2's backup, GRU -> GRU: its primary's window stalls; it goes on alone from its newest shipped "
     "state, rolled back in place at a new epoch (degraded)", (2, 10)),
    ("stateless_kill", "m", "kill", mlp_gru, "SIGKILL of m (stateless MLP, first), MLP -> GRU: the hot standby takes over", (2, 10)),
    ("stateful_primary_freeze", "g2", "freeze", gru_chain,
     "SIGSTOP of g2's primary, GRU -> GRU: detected by heartbeat silence; SIGCONT after the takeover: fenced", (3, 20)),
    ("stateful_primary_partition", "g2", "partition", gru_chain,
     "g2's primary's host partitioned from every host, GRU -> GRU: detected by heartbeat silence, fenced by its "
     "lease; healed after the takeover: fenced by epoch, rejoins as backup (netns mode only)", (3, 20)),
    ("correlated_stateless_stateful_kill", ("m", "g2"), "kill", mlp_gru_gru,
     "SIGKILL of m (stateless) and g2's primary (stateful) together, MLP -> GRU -> GRU", (2, 10)),
    ("correlated_adjacent_stateful_kill", ("g1", "g2"), "kill", gru_chain,
     "SIGKILL of g1's and g2's primaries (adjacent, stateful) together, GRU -> GRU", (2, 10)),
    ("stateful_primary_kill_noisy", "g2", "kill", noisy_chain,
     "SIGKILL of g2's primary, GRU -> GRU with noise (every re-execution differs)", (2, 10)),
    ("fig6_kill", "g2", "kill", fig6_chain,
     "HAMS Fig. 6: g2's state delivery delayed 30 ms, then g2's primary and g3's backup SIGKILLed together, "
     "GRU -> GRU -> GRU (g3's primary rolls back in place)", (3, 50)),
    ("strawman_fig6_kill", "g2", "kill", lambda: fig6_chain(mode="strawman", noise=0.01),
     "the Fig. 6 fault under the strawman with noise", (2, 10)),
    ("strawman_stateful_kill", "g2", "kill", strawman_chain,
     "SIGKILL of g2's primary, GRU -> GRU with noise, strawman mode (no state shipping: re-executes on a fresh state)",
     (2, 10)),
    ("ls_stateful_kill", "g2", "kill", lambda: ls_chain(checkpoint_every=100),
     "SIGKILL of g2's primary, GRU -> GRU with noise, ls mode (Lineage Stash: checkpoint every 100 batches, replay)",
     (3, 10)),
)


#: more processes killed with the victims, per case
ALSO_KILL = {"fig6_kill": ("op-g3-backup",), "stateful_backup_kill": ("op-g2-backup",)}
#: the request the fault lands at, drawn from this range (default 60-160 of 240 requests):
#: randomized timing, the fault lands anywhere in a batch's life; each trial runs 80 more
KILL_AT = {"stateful_primary_kill_late": (1200, 2400)}


def growth_per_1000(points: list) -> float | None:
    """The least-squares slope of recovery (ms) per 1,000 units of x, over ``[x, ms]``
    points (None where a trial did not recover, or fewer than 3 points)."""
    pts = [(x, y) for x, y in points if x is not None and y is not None and y == y]
    if len(pts) < 3 or len({x for x, _ in pts}) < 2:
        return None
    x, y = np.array(pts, dtype=float).T
    return float(1000 * np.polyfit(x, y, 1)[0])


def decided_on(row: dict) -> str:
    """What the manager's decisions for a trial's victims were made on: a suspicion's why
    (``refused``: the backup's probe of the dead primary's port; ``disconnect``, after a
    heartbeat interval; ``silent``: heartbeats missed), or the operator's own request
    (``rollback in place``, ``backup lost``: Fig. 6); "-" where it made none."""
    reasons = {r.get("why") or "" for r in row.get("per_victim", {}).values()} - {""}
    whys = {why if " suspected" in head else head for head, _, why in (r.partition(": ") for r in reasons)}
    return "+".join(sorted(whys)) or "-"


def recovery_times(case: dict) -> list[float]:
    """A case's recovery per recovered trial: fault -> first new output; for ls, until its
    replay is done (its first output above its highest seq before the fault)."""
    key = "replayed_ms" if case["mode"] == "ls" else "recovery_ms"
    return [t[key] for t in case["trials"] if t.get(key) is not None and t[key] == t[key]]


def recovery(quick: bool, log, trials: int | None = None, netns: bool | str = "auto",
             only: set[str] | None = None) -> dict:
    """Every case's trials (``only``: those cases); -> the report."""
    from keel.chaos.hosts import resolve_netns

    use_netns, why = resolve_netns(netns)
    mode_text = ("netns (a network namespace per process, host faults)" if use_netns
                 else "local (one host, real processes, loopback TCP)")
    log(f"mode: {mode_text} ({why})")
    rng = random.Random(1)
    t0, steal = time.time(), StealMeter()
    cases: dict[str, dict] = {}
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hams-recovery-", ignore_cleanup_errors=True) as tmp:
        for name, victim, fault, graph, what, counts in CASES:
            if only and name not in only:
                continue
            if fault == "partition" and not use_netns:
                log(f"  {name}: skipped, a partition needs netns mode ({why})")
                continue
            rows = []
            for k in range(trials or counts[0 if quick else 1]):
                work = Path(tmp) / f"{name}-{k}"
                kill_at = rng.randint(*KILL_AT.get(name, (60, 160)))
                loadgen.settle_heap()  # the load client runs in this process, beside every earlier trial's results
                row = run_trial(use_netns, work, victim=victim, n=max(240, kill_at + 80), kill_at=kill_at, seed=k, fault=fault, table=graph(),
                                also_kill=ALSO_KILL.get(name.replace("strawman_", ""), ()),
                                state_delay=FIG6_STATE_DELAY if name.endswith("fig6_kill") else None)
                rows.append(row)
                log(f"  {name} {k}: {fault} at request {kill_at}: detection {fmt(row['detection_ms'])} ms, takeover "
                    f"{fmt(row['takeover_ms'])} ms, recovery {fmt(row['recovery_ms'])} ms, lost {row['lost']}, "
                    f"conflicts {row['conflicts']}, degraded replies {row['degraded_replies']}, rolled back {row['rolled_back'] or '-'}, "
                    f"decided on {decided_on(row)}, "
                    + (f"thawed at {fmt(row['thaw_after_fault_ms'])} ms, fenced {row['fenced']}, "
                       f"old-epoch outputs after thaw {row['old_epoch_outputs_after_thaw']}, " if row["fenced"] is not None else "") +
                    f"invariants {'ok' if row['invariants_ok'] else 'VIOLATED'}")
            rec = [r["recovery_ms"] for r in rows if r["recovery_ms"] is not None]
            med = lambda key, rows=rows: (float(np.median([r[key] for r in rows if r[key] is not None]))  # noqa: E731
                                          if any(r[key] is not None for r in rows) else None)
            mode = rows[0]["mode"]
            cases[name] = {"fault": f"{what}, {mode}, {'netns' if use_netns else 'local'} mode", "mode": mode, "trials": rows,
                           "recovery_median_ms": float(np.median(rec)) if rec else None,
                           "recovery_max_ms": max(rec) if rec else None,
                           "detection_median_ms": med("detection_ms"), "takeover_median_ms": med("takeover_ms"),
                           "detection_max_ms": max((r["detection_ms"] for r in rows if r["detection_ms"] is not None), default=None),
                           "takeover_max_ms": max((r["takeover_ms"] for r in rows if r["takeover_ms"] is not None), default=None),
                           "lost": sum(r["lost"] for r in rows), "conflicts": sum(r["conflicts"] for r in rows),
                           "degraded_replies": sum(r["degraded_replies"] for r in rows),
                           "invariants_ok": all(r["invariants_ok"] for r in rows),
                           "not_recovered": len(rows) - len(rec), "n": len(rows)}
    ls_ = [c for c in cases.values() if c["mode"] == "ls"]
    ls_out = {"ls_conflicts": sum(c["conflicts"] for c in ls_), "ls_lost": sum(c["lost"] for c in ls_),
              "ls_kill_median_ms": float(np.median(r)) if (r := [x for c in ls_ for x in recovery_times(c)]) else None,
              "ls_kill_max_ms": max(r) if r else None,
              # recovery grows with what ls replays; nspb's does not grow with how long the graph ran
              "ls_recovery_by_batches_since_checkpoint": [[t["outputs_since_checkpoint"], t["replayed_ms"]]
                                                          for c in ls_ for t in c["trials"]],
              "nspb_recovery_by_kill_at": [[t["kill_at"], t["recovery_ms"]] for name in
                                           ("stateful_primary_kill", "stateful_primary_kill_late")
                                           for t in cases.get(name, {}).get("trials", [])]}
    ls_out["ls_growth_ms_per_1000_batches"] = growth_per_1000(ls_out["ls_recovery_by_batches_since_checkpoint"])
    ls_out["nspb_growth_ms_per_1000_requests"] = growth_per_1000(ls_out["nspb_recovery_by_kill_at"])
    if only:  # a selection of cases (--cases): their rows and the ls figures
        out = {"quick": quick, "cases": cases, **ls_out, "trials": sum(c["n"] for c in cases.values()),
               "elapsed_s": time.time() - t0, "loadavg_1m_at_end": os.getloadavg()[0], "steal": steal.fraction(),
               "only": sorted(only)}
        return out
    sk, up, sl = cases["stateful_primary_kill"], cases["upstream_stateful_kill"], cases["stateless_kill"]
    bk = cases["stateful_backup_kill"]
    fz, co = cases["stateful_primary_freeze"], cases["correlated_stateless_stateful_kill"]
    adj, fig6 = cases["correlated_adjacent_stateful_kill"], cases["fig6_kill"]
    nspb = [c for c in cases.values() if c["mode"] == "nspb"]
    straw = [c for c in cases.values() if c["mode"] == "strawman"]
    # freeze and partition: one figure (the issue's), over both faults' trials
    cut = fz["trials"] + (cases["stateful_primary_partition"]["trials"] if "stateful_primary_partition" in cases else [])
    cut_rec = [r["recovery_ms"] for r in cut if r["recovery_ms"] is not None]
    pt = cases.get("stateful_primary_partition", {"trials": []})["trials"]
    out = {"quick": quick, "mode": mode_text, "netns": use_netns,
           "stateful_kill_median_ms": sk["recovery_median_ms"], "stateful_kill_max_ms": sk["recovery_max_ms"],
           "stateful_kill_late_median_ms": cases["stateful_primary_kill_late"]["recovery_median_ms"],
           "stateful_kill_late_max_ms": cases["stateful_primary_kill_late"]["recovery_max_ms"],
           "detection_median_ms": sk["detection_median_ms"], "takeover_median_ms": sk["takeover_median_ms"],
           "upstream_stateful_kill_median_ms": up["recovery_median_ms"],
           "upstream_stateful_kill_max_ms": up["recovery_max_ms"],
           "stateless_kill_median_ms": sl["recovery_median_ms"], "stateless_kill_max_ms": sl["recovery_max_ms"],
           "backup_kill_median_ms": bk["recovery_median_ms"], "backup_kill_max_ms": bk["recovery_max_ms"],
           "freeze_partition_median_ms": float(np.median(cut_rec)) if cut_rec else None,
           "freeze_partition_max_ms": max(cut_rec) if cut_rec else None,
           "freeze_median_ms": fz["recovery_median_ms"], "freeze_max_ms": fz["recovery_max_ms"],
           "partition_trials": len(pt), "partition_fenced": all(r["fenced"] for r in pt) if pt else None,
           "partition_old_epoch_outputs_after_heal": sum(r["old_epoch_outputs_after_thaw"] for r in pt),
           "freeze_detection_median_ms": fz["detection_median_ms"],
           "freeze_fenced": all(r["fenced"] for r in fz["trials"]),
           "freeze_old_epoch_outputs_after_thaw": sum(r["old_epoch_outputs_after_thaw"] for r in fz["trials"]),
           "correlated_stateless_stateful_median_ms": co["recovery_median_ms"],
           "correlated_stateless_stateful_max_ms": co["recovery_max_ms"],
           "correlated_adjacent_stateful_median_ms": adj["recovery_median_ms"],
           "correlated_adjacent_stateful_max_ms": adj["recovery_max_ms"],
           "fig6_median_ms": fig6["recovery_median_ms"], "fig6_max_ms": fig6["recovery_max_ms"], "fig6_trials": fig6["n"],
           "fig6_rolled_back_in_place": sum(1 for r in fig6["trials"] if r["rolled_back_in_place"]),
           "strawman_fig6_conflicts": cases["strawman_fig6_kill"]["conflicts"],
           "nspb_lost": sum(c["lost"] for c in nspb), "nspb_conflicts": sum(c["conflicts"] for c in nspb),
           "invariants_ok": all(c["invariants_ok"] for c in nspb),
           "not_recovered": sum(c["not_recovered"] for c in nspb),
           # the strawman must show what NSPB prevents (the checker's proof that it can see a conflict)
           "strawman_conflicts": sum(c["conflicts"] for c in straw), "strawman_lost": sum(c["lost"] for c in straw),
           "strawman_trials_with_conflicts": sum(1 for c in straw for r in c["trials"] if r["conflicts"] > 0),
           "strawman_trials": sum(c["n"] for c in straw),
           **ls_out, "trials": sum(c["n"] for c in cases.values()), "cases": cases, "elapsed_s": time.time() - t0,
           # the machine's load while it ran: the figures are taken under load (2 cores, shared)
           "loadavg_1m_at_end": os.getloadavg()[0], "steal": steal.fraction()}
    return out


def plot(out: dict, path: Path) -> None:
    """Left: each case's recovery times (one dot a trial; the targets as ticks). Right: what
    recovery grows with: ls against the batches since its checkpoint (its replay), nspb's
    stateful kill against how long the graph had run (the request it died at)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    names = [n for n, c in out["cases"].items() if recovery_times(c)]
    for i, name in enumerate(names):
        rec = recovery_times(out["cases"][name])
        color = {"nspb": "tab:blue", "strawman": "tab:gray", "ls": "tab:red"}.get(out["cases"][name]["mode"], "k")
        left.scatter(i + (np.linspace(-0.2, 0.2, len(rec)) if len(rec) > 1 else np.zeros(len(rec))), rec, s=10, color=color)
    left.set_xticks(range(len(names)), [n.replace("_", " ") for n in names], rotation=35, ha="right", fontsize=8)
    left.set_ylabel("fault -> first new output (ms)")
    left.set_yscale("log")
    left.set_title("recovery per trial (blue nspb, gray strawman, red ls: until its replay is done)")
    ls_pts = out.get("ls_recovery_by_batches_since_checkpoint") or []
    nspb_pts = out.get("nspb_recovery_by_kill_at") or []
    if ls_pts:
        right.scatter(*zip(*ls_pts), color="tab:red")
    right.set_xlabel("batches since its checkpoint (ls, red)", color="tab:red")
    right.set_ylabel("fault -> first new output (ms)")
    if nspb_pts:  # on a top axis: nspb's x is how long the graph ran (requests), not batches
        top = right.twiny()
        top.scatter(*zip(*[(x, y) for x, y in nspb_pts if y is not None]), color="tab:blue", marker="s")
        top.set_xlabel("requests served before the kill (nspb stateful kill, blue)", color="tab:blue")
    right.set_title("what recovery grows with")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: the printed table (keel experiment); with --cases only the ls figures and what those cases give
FIGURES = ("stateful_kill_median_ms", "stateful_kill_max_ms", "stateful_kill_late_median_ms", "stateful_kill_late_max_ms",
           "detection_median_ms", "takeover_median_ms",
           "upstream_stateful_kill_median_ms", "upstream_stateful_kill_max_ms", "stateless_kill_median_ms",
           "stateless_kill_max_ms", "backup_kill_median_ms", "backup_kill_max_ms", "freeze_partition_median_ms",
           "freeze_partition_max_ms", "freeze_detection_median_ms",
           "freeze_median_ms", "freeze_max_ms", "partition_trials", "partition_fenced", "partition_old_epoch_outputs_after_heal",
           "freeze_fenced", "freeze_old_epoch_outputs_after_thaw", "correlated_stateless_stateful_median_ms",
           "correlated_stateless_stateful_max_ms", "correlated_adjacent_stateful_median_ms",
           "correlated_adjacent_stateful_max_ms", "fig6_median_ms", "fig6_max_ms", "fig6_trials", "fig6_rolled_back_in_place",
           "strawman_fig6_conflicts", "strawman_conflicts", "strawman_trials_with_conflicts",
           "strawman_trials", "strawman_lost", "ls_conflicts", "ls_lost", "ls_kill_median_ms", "ls_kill_max_ms",
           "ls_recovery_by_batches_since_checkpoint", "ls_growth_ms_per_1000_batches", "nspb_recovery_by_kill_at",
           "nspb_growth_ms_per_1000_requests", "nspb_lost", "nspb_conflicts", "invariants_ok", "not_recovered", "trials",
           "loadavg_1m_at_end", "steal")


def run(args: argparse.Namespace, log=print) -> dict:
    log("HAMS recovery: kills, freezes and partitions under open load, manager-driven failover (figures under load)")
    only = set(args.cases.split(",")) if args.cases else None
    return recovery(args.quick, log, trials=args.trials, netns=args.netns, only=only)


def passed(out: dict) -> bool:
    if out.get("only"):
        return True  # a selection of cases: figures, no verdict
    return (out["nspb_lost"] == 0 and out["nspb_conflicts"] == 0 and out["invariants_ok"] and not out["not_recovered"]
            and out["freeze_fenced"] and out["freeze_old_epoch_outputs_after_thaw"] == 0
            and out["partition_fenced"] is not False and out["partition_old_epoch_outputs_after_heal"] == 0
            and out["strawman_trials_with_conflicts"] == out["strawman_trials"]
            and out["ls_conflicts"] > 0 and out["ls_lost"] == 0)


def options(e: argparse.ArgumentParser) -> None:
    """``keel experiment hams-recovery``'s own options."""
    e.add_argument("--trials", type=int, help=f"trials per case (default: {'/'.join(str(c[-1][0]) for c in CASES)} quick, "
                                                    f"{'/'.join(str(c[-1][1]) for c in CASES)} full)")
    e.add_argument("--netns", choices=("auto", "on", "off"), default="auto",
                   help="netns mode (a network namespace per process, host faults, the partition case): "
                        "auto = when the machine allows it (root with ip netns)")
    e.add_argument("--cases", help="only these cases, comma-separated (e.g. ls_stateful_kill): their rows and the ls figures")

