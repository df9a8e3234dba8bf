"""What ``keel experiment hams-overhead``'s cells are read as (``bench.hams_overhead`` runs
them): from a traced cell's event logs, the floor per reply (``floor_of``) and where a chain's
p50 goes stage by stage (``chain_of``, ``stages_of``); from the cells' p50s, a mode's overhead
over bare (``overhead``), what a cell can tell from nothing (``resolution``, and the A/A
differences of ``paired``), and Remus's cost over nspb's (``remus_over_nspb``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

#: outputs of one batch are written within this of each other, batches further apart
BATCH_GAP_S = 0.002


def floor_of(trace_dir: Path) -> dict:
    """Per released reply, from the cell's traces: the hold (the output of the operator that
    answers the frontend -> released), and for the state it waited on last (of the stateful
    operators on its lineage, the one its backup applied last) one hop (applied -> released:
    the durability notice) and the ship (the primary handed the state over after its update
    -> its backup applied it). p50s in ms; ``floor_ms``: the p50 of each reply's hop + ship
    (the floor is per reply; the sum of the two p50s, ``floor_p50s_summed_ms``, beside it)."""
    from keel.chaos.invariants import load_graph_traces

    streams = load_graph_traces(str(trace_dir))
    out_t = {(o["operator"], o["seq"]): o["t"] for o in streams["graph_output"]}
    ships: dict[str, list[tuple[int, int, float]]] = {}
    for e in streams.get("graph_ship", []):
        ships.setdefault(e["operator"], []).append((e["first_seq"], e["last_seq"], e["t"]))
    updates = {(e["operator"], e["last_seq"]): e["t"] for e in streams.get("graph_update", [])}
    applies: dict[str, list[tuple[float, int]]] = {}
    for a in sorted(streams["graph_apply"], key=lambda a: a["t"]):
        applies.setdefault(a["operator"], []).append((a["t"], a["last_seq"]))
    holds, hops, shipped, updated = [], [], [], []
    for r in streams["graph_release"]:
        if not r["lineage"]:
            continue
        last_op, last_seq = r["lineage"][-1][2], r["lineage"][-1][3]
        waited = []  # (applied t, shipped t, its update's start t) of each state on the lineage
        for _, _, op, seq in r["lineage"]:
            t_apply = next((t for t, s in applies.get(op, []) if s >= seq), None)
            state = next(((first, last, t) for first, last, t in ships.get(op, []) if first <= seq <= last), None)
            if t_apply is not None and state is not None:
                waited.append((t_apply, state[2], updates.get((op, state[1]))))
        if (last_op, last_seq) not in out_t or not waited:
            continue
        t_apply, t_ship, t_update = max(waited, key=lambda w: w[0])
        holds.append(1000 * (r["t"] - out_t[last_op, last_seq]))
        hops.append(1000 * (r["t"] - t_apply))
        shipped.append(1000 * (t_apply - t_ship))
        # the model's update of that state (NSPB ships the state after it; not in the floor)
        updated.append(1000 * (t_ship - t_update) if t_update is not None else 0.0)
    if not holds:
        return {"replies_traced": 0}
    p50 = lambda v: float(np.percentile(v, 50))  # noqa: E731
    floors = [hop + ship for hop, ship in zip(hops, shipped)]
    return {"replies_traced": len(holds), "hold_p50_ms": p50(holds), "hop_p50_ms": p50(hops), "ship_p50_ms": p50(shipped),
            "floor_ms": p50(floors), "floor_p50s_summed_ms": p50(hops) + p50(shipped),
            "hold_over_floor_ms": p50(holds) - p50(floors),
            "update_p50_ms": p50(updated),
            "hold_over_floor_and_update_ms": p50(holds) - p50([f + u for f, u in zip(floors, updated)])}


def overhead(row: dict, base: dict, key: str) -> float | None:
    if row.get(key) is None or not base.get(key):
        return None
    return row[key] / base[key] - 1.0


def resolution(bare_p50s: list[float]) -> float | None:
    """What an overhead over bare can be told from nothing: bare's p50 moves this much (as a
    fraction of its median) between its own repetitions; None with fewer than two."""
    vals = [v for v in bare_p50s if v is not None]
    return (max(vals) - min(vals)) / float(np.median(vals)) if len(vals) > 1 else None


def remus_over_nspb(over: dict, res: float | None) -> float | None:
    """Remus's p50 overhead over nspb's, nspb's taken as at least the cells' resolution
    ``res``: an nspb overhead within it is not a measured cost, and dividing by it (or by a
    negative one) says nothing; against the resolution the ratio is a lower bound."""
    res = res or 0.0
    if over.get("remus") is None or over.get("nspb") is None or max(over["nspb"], res) <= 0:
        return None
    return over["remus"] / max(over["nspb"], res)


def paired(runs: dict[str, list[dict]]) -> tuple[dict[str, list[float]], list[float]]:
    """The large-state graph's cells read in pairs: every repetition runs each mode and two
    bare cells on the same seed (the same Poisson draw) in the same minutes. -> (per mode,
    its p50 over the mean of its repetition's two bare p50s, less one, per repetition; the
    A/A differences: what the two bare cells of a repetition differ by, ``|b2 / b1 - 1|``).
    ``runs``: mode -> its cells, each with ``rep`` and ``p50_ms``."""
    bare: dict[int, list[float]] = {}
    for r in runs["bare"]:
        if r["p50_ms"] is not None:
            bare.setdefault(r["rep"], []).append(r["p50_ms"])
    aa = [abs(b[1] / b[0] - 1.0) for b in bare.values() if len(b) == 2]
    over = {m: [r["p50_ms"] / float(np.mean(bare[r["rep"]])) - 1.0 for r in cells
                if r["p50_ms"] is not None and r["rep"] in bare]
            for m, cells in runs.items() if m != "bare"}
    return over, aa


def chain_of(table: dict) -> list[str]:
    """The operators of a chain graph in order, from the frontend's one successor on (a
    graph that branches has no one order: ValueError)."""
    succ: dict[str, list[str]] = {}
    for a, b in table["edges"]:
        succ.setdefault(a, []).append(b)
    order, node = [], "frontend"
    while True:
        nexts = succ.get(node, [])
        if len(nexts) != 1:
            raise ValueError(f"{node} has {len(nexts)} successors: not a chain")
        node = nexts[0]
        if node == "frontend":
            return order
        order.append(node)


def stages_of(trace_dir: Path, order: list[str]) -> dict:
    """From one cell's traces: per released reply, the time from each operator's output to
    the next one's on its lineage and from the last one's to the release (p50 ms, each
    stage's queueing, compute and hop; the last, the hold's), and per operator the median
    time from one batch's outputs to the next's (its cycle) and the median rows a batch."""
    from keel.chaos.invariants import load_graph_traces

    streams = load_graph_traces(str(trace_dir))
    out_t = {(o["operator"], o["seq"]): o["t"] for o in streams["graph_output"]}
    names = [f"{a} -> {b}" for a, b in zip(order, order[1:])] + [f"{order[-1]} -> release"]
    gaps: dict[str, list[float]] = {n: [] for n in names}
    for r in streams["graph_release"]:
        seqs = {e[2]: e[3] for e in r["lineage"]}
        ts = [out_t.get((op, seqs.get(op))) for op in order]
        if None in ts:
            continue
        for name, t0, t1 in zip(names, ts, [*ts[1:], r["t"]]):
            gaps[name].append(1000 * (t1 - t0))
    cycles, rows = {}, {}
    for op in order:
        ts = sorted(t for (o, _), t in out_t.items() if o == op)
        starts = [i for i in range(len(ts)) if i == 0 or ts[i] - ts[i - 1] > BATCH_GAP_S]  # a batch's rows: within it
        cycles[op] = float(np.median(np.diff([ts[i] for i in starts]))) * 1000 if len(starts) > 1 else None
        rows[op] = float(np.median(np.diff([*starts, len(ts)]))) if starts else None
    return {"replies": len(gaps[names[-1]]),
            "stages_p50_ms": {n: float(np.median(v)) if v else None for n, v in gaps.items()},
            "cycle_ms": cycles, "rows_per_batch": rows}
