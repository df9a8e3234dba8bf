"""``keel experiment hams-overhead``: what fault tolerance costs a service graph (HAMS §VI).

Graphs that mirror the paper's services at small scale -- two adjacent stateful operators
(GRU -> GRU), online learning (an MLP trained online), fan-out + join, and a stateful
operator last -- each operator's service time padded to ``pad_ms`` per batch: 10 ms, and
50 ms at batch 64 (HAMS's GPU services took tens to hundreds of ms). Beside them a
large-state online-learning graph (``ol_large``: a hashed online linear model of 16 MiB
with weight decay, so every batch changes all of it, the experiment's own operator kind
``OnlineHashedLinear``, followed by a stateless stage as in HAMS's services), where
stopping to copy costs enough for the ordering nspb < s2 < remus to show: NSPB ships the
state while the next stage computes, S2 stops the model to copy it, Remus stops and also
holds the model's outputs until the state is delivered. Per cell, Poisson load at half of
bare's capacity (capped at what one Python client can send), modes interleaved, on real
processes: p50, p99, throughput, overhead against bare, the mean batch that formed, the
lineage bookkeeping time per batch. The 50 ms cells (the large-state graph's too) run at
least ``PAD_HAMS_REPS`` repetitions, alternating with the other cells: their p50 is a
queueing figure one repetition does not pin (the large-state graph's nspb cell moved by 10
points of overhead from one repetition to the next); each row is the median of its
repetitions, and ``pad50_reps`` holds every repetition's p50 and p99 (the spread).

The floor, per graph at batch 64 (a traced nspb cell): per reply, the hold (the output of
the operator that answers the frontend -> the frontend released it), one process hop (the
state's backup applied it -> the frontend released it: the durability notice, a PUSH/PULL
hop between two of the graph's processes under the same load) and the ship (the primary
handed the state over after its update -> the backup applied it: serialize, send, receive,
Algorithm 2, apply; no model); ``floor = hop + ship`` per reply (its p50) and the hold's
p50 over it. Beside
it the update of that state (``update_p50_ms``: the model's own work, which NSPB must
finish before the state it ships exists, so the floor leaves it out and the hold cannot).

JSON keys (overheads as fractions of bare, the worst graph): ``nspb_p50_overhead_b64``,
``nspb_p99_overhead_b64``, ``nspb_p50_overhead_b1``, ``nspb_p50_overhead_b64_pad50``,
``nspb_p99_overhead_b64_pad50``, ``nspb_hold_over_floor_ms_b64``, ``remus_over_nspb_ol``
and ``ordering_ok`` (the large-state graph, read in pairs: each repetition runs every mode
and bare twice on one seed, each mode's overhead is its p50 over its repetition's bare, the
median over repetitions (``ol_paired`` per repetition); nspb's overhead in the ratio is
taken as at least ``ol_aa_resolution``, the median of what the two bare cells of a
repetition differ by (``ol_aa``), so an nspb cost too small to measure gives a lower bound,
not a division by noise; ``remus_over_nspb_ol_range`` is the earlier reading, medians over
repetitions against ``ol_resolution``, bare's spread over all its repetitions, which mixes
in the repetitions' different Poisson draws), ``pad50_resolution`` (bare's
spread over its repetitions in each graph's 50 ms cells, the least overhead those cells can
tell from nothing; ``nspb_pad50_resolution``: the worst graph's), ``throughput_ratio_b64``,
``lineage_ms_per_batch`` (Algorithm 1's bookkeeping per batch, and its median,
``lineage_ms_per_batch_p50``; ``output_loop_ms_per_batch``: the same with each row's output
message, the loop bare runs too), ``nspb_hold_over_floor_and_update_ms_b64`` (the hold over
the floor less the update it waits on), ``lost``, ``rows``,
``floors``, ``pad50_reps``.
"""
from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from keel.common import loadgen, transport
from keel.common.steal import STEAL_MAX, StealMeter, least_starved
from keel.common.spec import load_spec
from keel.common.spec.graph import read_graph
from keel.deploy.local import Launcher, free_port_block
from keel.bench.hams_graphs import GRU_STREAMS, OL_HIDDEN, OL_LARGE_BUCKETS, WINDOW, graphs
from keel.bench.hams_readings import chain_of, floor_of, overhead, paired, remus_over_nspb, resolution, stages_of

MODES = ("bare", "nspb", "s1", "s2", "remus")
MAX_RATE = 400.0  # requests/s one Python client sends on time on a small machine


#: the service times per batch the cells pad to: this machine's scale and HAMS's
PAD_MS, PAD_HAMS_MS = 10.0, 50.0
#: repetitions (at least) of the 50 ms cells of the overhead graphs: their p50 is a queueing
#: figure (a request waits one or two batch times of 50 ms, and which of the two the median
#: lands on moves between runs), so one repetition does not pin it; the median of these,
#: taken alternately with the other cells, and their spread are reported
PAD_HAMS_REPS = 3
#: ... and of the large-state graph's, read in pairs (``paired``): a mode's cell there moves by
#: up to 5% of bare's p50 between repetitions of one seed (the model's 56 ms batches behind
#: the first stage's 52 ms make a queue whose wait moves), two bare cells by ~1%
OL_LARGE_REPS = 5


class StreamClient:
    """``submit``/``collect`` for ``loadgen.open_loop`` through ``keel.Client`` (its client id
    and retries, as a user's calls go); requests cycle over 16 streams (the call's key)."""

    def __init__(self, endpoints: list[str]):
        from keel.common.client import Client

        # a reply held for durability behind 64-row batches of 50 ms takes ~0.2 s: a slice of
        # 10 s never retries a request that is on its way, and retries one that was lost
        self.client = Client(endpoints, timeout_ms=10_000.0, retries=2)
        self.n = 0

    def submit(self, model: str, x: np.ndarray, timeout_ms=None) -> str:
        rid = self.client.submit(model, x, key=str(self.n % 16), timeout_ms=timeout_ms)
        self.n += 1
        return rid

    def collect(self, wait_ms: float) -> list:
        return self.client.collect(wait_ms)

    def close(self) -> None:
        self.client.close()


def cell_spec(table: dict, log_dir: Path, name: str):
    """The cluster spec of one cell: the graph ``table`` as ``[graphs.graph]``, read by
    ``load_spec`` as ``keel up`` reads it (ports from a free block, its own run folder)."""
    return load_spec({"cluster": {"name": name, "base_port": free_port_block(64), "run_dir": str(log_dir / name)},
                      "graphs": {"graph": table}})


def run_cell(graph_name: str, table: dict, mode: str, rate: float, duration_s: float, log_dir: Path, seed: int,
             read_trace: Callable[[Path], dict] | None = None) -> dict:
    """One cell: the graph in ``mode`` under open load; ``read_trace``: every process writes
    its event log, and what this reads of them (``floor_of``, ``stages_of``) comes with the cell."""
    trace_dir = log_dir / f"trace-{graph_name}-{mode}-{uuid.uuid4().hex[:6]}"
    loadgen.settle_heap()  # every earlier cell's records stay in this process
    table = dict(table, mode=mode, **({"trace_dir": str(trace_dir)} if read_trace else {}))
    graph = read_graph(table)
    spec = cell_spec(table, log_dir, f"{graph_name}-{mode}")
    services = spec.services
    launcher = Launcher(log_dir / f"{graph_name}-{mode}")
    client = None
    try:
        launcher.start_spec(spec, timeout_s=60.0)
        client = StreamClient(spec.client_endpoints)
        client_ep = spec.client_endpoints[0]
        inputs = np.random.default_rng(seed).normal(size=(256, *graph.input_shape)).astype(np.float32)
        loadgen.open_loop(client, "graph", inputs[:32], min(rate, MAX_RATE), 30, seed, 1.0, drain_s=3.0)  # warm-up
        steal = StealMeter()
        records = loadgen.open_loop(client, "graph", inputs, min(rate, MAX_RATE), int(rate * duration_s) + 10, seed + 7,
                                    duration_s, drain_s=5.0)
        stolen = steal.fraction()
        summary = loadgen.summarize(records)
        stats = [transport.request_status(s.config.status_endpoint) for s in services if s.role == "graph_operator"]
        stats = [s for s in stats if s and "batches" in s and s["assignment"] not in ("backup", "standby")]
        fe = (transport.request_status(client_ep) or {}).get("graphs", {}).get("graph", {})  # the frontend's graph route
        primaries = [s for s in stats if "copy_ms_mean" in s]
        done = [r.received for r in records if r.received is not None]
        span = (max(done) - records[0].sent) if done else 1.0
        return {"p50_ms": summary["latency_ms"]["p50"], "p99_ms": summary["latency_ms"]["p99"],
                "throughput_rps": summary["predictions"] / span, "sent": summary["sent"], "lost": summary["lost"],
                "errors": summary["errors"],
                "mean_batch": float(np.mean([s["rows"] / max(1, s["batches"]) for s in stats])) if stats else None,
                "lineage_ms_per_batch": max((s["lineage_ms_per_batch"] for s in stats), default=0.0),
                "lineage_ms_p50": max((s.get("lineage_ms_p50", 0.0) for s in stats), default=0.0),
                "output_loop_ms_per_batch": max((s.get("output_loop_ms_per_batch", 0.0) for s in stats), default=0.0),
                # where a fault-tolerant mode's time goes: replies held for durability at the
                # frontend; per stateful primary, the wait before an update and the copy
                "hold_ms": fe.get("hold_ms_mean"),
                "update_wait_ms": max((s["update_wait_ms_per_batch"] for s in primaries), default=None),
                "copy_ms": max((s["copy_ms_mean"] for s in primaries), default=None),
                "steal": stolen, **(read_trace(trace_dir) if read_trace else {})}
    finally:
        if client is not None:
            client.close()
        launcher.stop()


def plan(quick: bool) -> list[tuple[str, int, float, tuple[str, ...]]]:
    """The cells: (graph, batch, pad_ms, modes). Quick runs the baselines only where a
    target reads them (s2 and remus on the large-state graph; s1 nowhere) and bare and nspb
    elsewhere: what that saves pays for the 50 ms cells' repetitions."""
    names = ("gru_gru", "online_learning") if quick else ("gru_gru", "online_learning", "fanout_join", "stateful_last")
    cells = [(n, b, PAD_MS, ("bare", "nspb") if quick else MODES) for b in ((1, 64) if quick else (1, 8, 64)) for n in names]
    cells += [(n, 64, PAD_HAMS_MS, ("bare", "nspb") if quick else MODES) for n in names]
    # the large-state graph's bare cell twice a repetition: what two of them differ by is the
    # least overhead a mode's cell of that repetition can be told from (``paired``)
    cells += [("ol_large", 64, PAD_HAMS_MS, ("bare", "nspb", "s2", "remus", "bare") if quick else (*MODES, "bare"))]
    return cells


def rate_of(name: str, batch: int, pad_ms: float) -> float:
    depth = 3 if name in ("fanout_join", "ol_large") else 2
    return 0.5 * batch * 1000.0 / (pad_ms * depth)  # half of bare's capacity (one operator busy at a time)


def overheads(quick: bool, log, reps: int | None = None) -> dict:
    """Every cell in every mode, interleaved, then the traced floor cells; -> the report."""
    reps = reps or (1 if quick else 2)
    duration = 3.0 if quick else 8.0
    cells: dict[tuple, list[dict]] = {}
    floors: list[dict] = []
    retaken = 0
    t0 = time.time()
    todo = plan(quick)
    names = sorted({n for n, b, pad, _ in todo if pad == PAD_MS})
    with tempfile.TemporaryDirectory(prefix="hams-overhead-") as tmp:
        # a cell thrown away: the client process's first cell had a slow tail whatever its mode
        run_cell("warm-up", graphs(PAD_MS, 1)["gru_gru"], "bare", 20.0, 1.0, Path(tmp), seed=99)
        def reps_of(name, pad):
            return max(reps, OL_LARGE_REPS if name == "ol_large" else PAD_HAMS_REPS) if pad == PAD_HAMS_MS else reps

        product = itertools.product(range(max(reps, OL_LARGE_REPS)), todo)  # rep-major: repetitions alternate in time
        for cell, (rep, (name, batch, pad, modes)) in enumerate(c for c in product if c[0] < reps_of(c[1][0], c[1][2])):
            table = graphs(pad, batch)[name]
            order = modes[cell % len(modes):] + modes[:cell % len(modes)]  # no mode always runs first
            for mode in order:  # interleaved: every mode sees the same machine state
                res, stolen, takes = least_starved(  # a cell the hypervisor starved is taken again
                    lambda: run_cell(name, table, mode, rate_of(name, batch, pad), duration, Path(tmp), seed=rep),
                    steal_of=lambda r: r["steal"], log=log, what=f"rep {rep} {name} b={batch} pad={pad:g} {mode}")
                retaken += takes - 1
                res["rep"] = rep
                cells.setdefault((name, mode, batch, pad), []).append(res)
                log(f"  rep {rep} {name:16s} b={batch:<3d} pad {pad:2.0f} {mode:6s} p50 {res['p50_ms']:.2f} ms "
                    f"p99 {res['p99_ms']:.2f} ms {res['throughput_rps']:.0f} rps (mean batch {res['mean_batch'] or 0:.1f}, "
                    f"steal {stolen or 0:.0%})")
        for name in names:  # the floor: a traced nspb cell per graph at batch 64 (tracing costs: not a cell above)
            res = run_cell(name, graphs(PAD_MS, 64)[name], "nspb", rate_of(name, 64, PAD_MS), duration, Path(tmp),
                           seed=0, read_trace=floor_of)
            floors.append({"graph": name, "batch": 64, "pad_ms": PAD_MS, "p50_ms": res["p50_ms"],
                           **{k: res.get(k) for k in ("replies_traced", "hold_p50_ms", "hop_p50_ms", "ship_p50_ms",
                                                      "floor_ms", "floor_p50s_summed_ms", "hold_over_floor_ms",
                                                      "update_p50_ms", "hold_over_floor_and_update_ms")}})
            f = floors[-1]
            log(f"  floor {name:16s} b=64 nspb: hold p50 {f['hold_p50_ms'] or 0:.2f} ms, hop {f['hop_p50_ms'] or 0:.2f}, "
                f"ship {f['ship_p50_ms'] or 0:.2f}, floor (hop + ship per reply) {f['floor_ms'] or 0:.2f} ms, over it "
                f"{f['hold_over_floor_ms'] or 0:.2f} ms, of which the update {f['update_p50_ms'] or 0:.2f} ms "
                f"({f['replies_traced']} replies)")
    rows = []
    for (name, mode, batch, pad), runs in cells.items():
        med = lambda k: float(np.median([r[k] for r in runs if r[k] is not None])) if any(r[k] is not None for r in runs) else None  # noqa: E731
        rows.append({"graph": name, "mode": mode, "batch": batch, "pad_ms": pad, "p50_ms": med("p50_ms"),
                     "p99_ms": med("p99_ms"), "throughput_rps": med("throughput_rps"), "mean_batch": med("mean_batch"),
                     "lineage_ms_per_batch": med("lineage_ms_per_batch"), "lineage_ms_p50": med("lineage_ms_p50"),
                     "output_loop_ms_per_batch": med("output_loop_ms_per_batch"), "lost": sum(r["lost"] for r in runs),
                     **{k: med(k) for k in ("hold_ms", "update_wait_ms", "copy_ms")},
                     "steal_max": max((r["steal"] or 0.0) for r in runs),
                     "p50_ms_reps": [r["p50_ms"] for r in runs], "p99_ms_reps": [r["p99_ms"] for r in runs]})
    index = {(r["graph"], r["mode"], r["batch"], r["pad_ms"]): r for r in rows}
    for r in rows:
        base = index[(r["graph"], "bare", r["batch"], r["pad_ms"])]
        r["p50_overhead"], r["p99_overhead"] = overhead(r, base, "p50_ms"), overhead(r, base, "p99_ms")
        r["throughput_ratio"] = (r["throughput_rps"] / base["throughput_rps"]) if base["throughput_rps"] else None

    def worst(mode, batch, key, pad=PAD_MS):
        vals = [index[(n, mode, batch, pad)][key] for n in names if index[(n, mode, batch, pad)][key] is not None]
        return max(vals) if vals else None

    ol = {m: index[("ol_large", m, 64, PAD_HAMS_MS)] for m in ("nspb", "s2", "remus")}
    pad50_resolution = {n: resolution(index[(n, "bare", 64, PAD_HAMS_MS)]["p50_ms_reps"]) for n in names}
    pad50 = {n: index[(n, "nspb", 64, PAD_HAMS_MS)]["p50_overhead"] for n in names}
    worst_pad50 = max((n for n in names if pad50[n] is not None), key=pad50.get, default=None)
    ol_paired, ol_aa = paired({m: cells[("ol_large", m, 64, PAD_HAMS_MS)] for m in ("bare", "nspb", "s2", "remus")})
    over = {m: float(np.median(v)) if v else None for m, v in ol_paired.items()}
    aa_resolution = float(np.median(ol_aa)) if ol_aa else None
    range_resolution = resolution(index[("ol_large", "bare", 64, PAD_HAMS_MS)]["p50_ms_reps"])
    out = {"quick": quick, "pad_ms": [PAD_MS, PAD_HAMS_MS], "graphs": names, "reps": reps,
           "nspb_p50_overhead_b64": worst("nspb", 64, "p50_overhead"),
           "nspb_p99_overhead_b64": worst("nspb", 64, "p99_overhead"),
           "nspb_p50_overhead_b1": worst("nspb", 1, "p50_overhead"),
           "nspb_p50_overhead_b64_pad50": worst("nspb", 64, "p50_overhead", PAD_HAMS_MS),
           "nspb_p99_overhead_b64_pad50": worst("nspb", 64, "p99_overhead", PAD_HAMS_MS),
           # the spread of the 50 ms cells' repetitions (each rep's p50 and p99, ms), per graph and mode
           "pad50_reps": {f"{n}/{m}": {"p50_ms": index[(n, m, 64, PAD_HAMS_MS)]["p50_ms_reps"],
                                       "p99_ms": index[(n, m, 64, PAD_HAMS_MS)]["p99_ms_reps"]}
                          for n in names for m in ("bare", "nspb")}
                         | {f"ol_large/{m}": {"p50_ms": index[("ol_large", m, 64, PAD_HAMS_MS)]["p50_ms_reps"],
                                              "p99_ms": index[("ol_large", m, 64, PAD_HAMS_MS)]["p99_ms_reps"]}
                            for m in ("bare", "nspb", "s2", "remus")},
           "nspb_hold_over_floor_ms_b64": max((f["hold_over_floor_ms"] for f in floors
                                               if f["hold_over_floor_ms"] is not None), default=None),
           # the same less the update of the state the reply waits on (the model's own work,
           # on the reply's way by NSPB: the state shipped is the one after the update)
           "nspb_hold_over_floor_and_update_ms_b64": max((f["hold_over_floor_and_update_ms"] for f in floors
                                                          if f.get("hold_over_floor_and_update_ms") is not None), default=None),
           # the large-state online-learning graph (16 MiB, 50 ms per batch): what stopping to copy costs,
           # each mode's overhead read against the bare cells of its own repetition (``paired``, the
           # median over repetitions), nspb's taken as at least what two bare cells of one
           # repetition differ by (the median A/A difference): below it nspb's cost is not
           # measured, and the ratio is a lower bound
           "remus_over_nspb_ol": remus_over_nspb(over, aa_resolution),
           "ol_aa_resolution": aa_resolution, "ol_paired": ol_paired, "ol_aa": ol_aa,
           # the earlier reading beside it: medians over repetitions, nspb's overhead taken as at
           # least bare's spread over every repetition (each its own Poisson draw)
           "remus_over_nspb_ol_range": remus_over_nspb({m: ol[m]["p50_overhead"] for m in ol}, range_resolution),
           "ol_resolution": range_resolution,
           # what the 50 ms cells' p50 can tell from nothing: bare's spread over its own repetitions,
           # per graph, and the graph whose nspb overhead is reported (the worst)
           "pad50_resolution": pad50_resolution,
           "nspb_pad50_resolution": pad50_resolution[worst_pad50] if worst_pad50 else None,
           "remus_overhead_ol_b64": over["remus"], "s2_overhead_ol_b64": over["s2"], "nspb_overhead_ol_b64": over["nspb"],
           "ordering_ok": ol["nspb"]["p50_ms"] < ol["s2"]["p50_ms"] < ol["remus"]["p50_ms"],
           "throughput_ratio_b64": min(index[(n, "nspb", 64, PAD_MS)]["throughput_ratio"] for n in names),
           "lineage_ms_per_batch": max(r["lineage_ms_per_batch"] or 0.0 for r in rows),
           # the same per batch as a median (the mean above also counts batches preempted mid-loop)
           "lineage_ms_per_batch_p50": max(r["lineage_ms_p50"] or 0.0 for r in rows),
           # the lineage with each row's output message, the loop bare runs too
           "output_loop_ms_per_batch": max(r.get("output_loop_ms_per_batch") or 0.0 for r in rows),
           "window": WINDOW, "gru_streams": GRU_STREAMS, "ol_hidden": OL_HIDDEN, "ol_large_mib": OL_LARGE_BUCKETS * 4 * 4 / 2**20,
           # where nspb's overhead goes (worst graph, batch 64): replies held for durability
           # at the frontend, the wait before an update, the state copy
           "nspb_hold_ms_b64": worst("nspb", 64, "hold_ms"), "nspb_copy_ms_b64": worst("nspb", 64, "copy_ms"),
           "nspb_update_wait_ms_b64": worst("nspb", 64, "update_wait_ms"), "lost": sum(r["lost"] for r in rows),
           "elapsed_s": time.time() - t0,
           # the machine's load while it ran: figures taken beside other work are not comparable
           "loadavg_1m_at_end": os.getloadavg()[0],
           # CPU time the hypervisor took while cells ran (common.steal): cells above
           # STEAL_MAX were taken again, up to STEAL_RETRIES times (the least starved kept)
           "steal_max": max(r["steal_max"] for r in rows), "cells_retaken": retaken,
           "cells_over_steal_max": sum(1 for runs in cells.values() for r in runs if (r["steal"] or 0.0) > STEAL_MAX),
           "rows": rows, "floors": floors}
    return out


def hold_breakdown(graph_name: str = "gru_gru", batch: int = 64, duration_s: float = 4.0) -> dict:
    """Where a held reply's time goes, from one nspb cell's traces: per reply, the last
    stateful operator's output -> its backup applying that state (update, copy, ship,
    Algorithm 2) -> the frontend releasing the reply (the notice's hop)."""
    from keel.chaos.invariants import load_graph_traces

    pad_ms = PAD_MS
    with tempfile.TemporaryDirectory(prefix="hams-hold-") as tmp:
        table = dict(graphs(pad_ms, batch)[graph_name], trace_dir=str(Path(tmp) / "trace"))
        rate = 0.5 * batch * 1000.0 / (pad_ms * 2)
        cell = run_cell(graph_name, table, "nspb", rate, duration_s, Path(tmp), seed=0)
        streams = load_graph_traces(str(Path(tmp) / "trace"))
    last = graphs(pad_ms, batch)[graph_name]["edges"][-1][0]  # the operator that answers the frontend
    out_t = {(o["operator"], o["seq"]): o["t"] for o in streams["graph_output"]}
    applies = sorted((a["last_seq"], a["t"]) for a in streams["graph_apply"] if a["operator"] == last)
    to_apply, to_release = [], []
    for r in streams["graph_release"]:
        seq = next((e[3] for e in r["lineage"] if e[2] == last), None)
        t_out = out_t.get((last, seq))
        t_apply = min((t for s, t in applies if s >= seq), default=None) if seq is not None else None
        if t_out is not None and t_apply is not None:
            to_apply.append(1000 * (t_apply - t_out))
            to_release.append(1000 * (r["t"] - t_apply))
    pct = lambda v, q: float(np.percentile(v, q)) if v else None  # noqa: E731
    return {"graph": graph_name, "batch": batch, "operator": last, "replies": len(to_apply), "steal": cell["steal"],
            "p50_ms": cell["p50_ms"], "hold_ms": cell["hold_ms"],
            "output_to_backup_apply_ms": {"p50": pct(to_apply, 50), "p90": pct(to_apply, 90)},
            "backup_apply_to_release_ms": {"p50": pct(to_release, 50), "p90": pct(to_release, 90)}}


def stages(graph_name: str, reps: int = 2, pad_ms: float = PAD_HAMS_MS, batch: int = 64, duration_s: float = 4.0,
           log=print) -> dict:
    """Where a chain graph's p50 goes in bare and nspb: traced cells of each, in turn,
    ``reps`` times, at ``pad_ms`` per batch (``stages_of`` per cell). Stages padded to the
    same time can lock in phase: a stage a little slower per batch than the one before it
    makes that one's outputs wait, and the wait grows until two of its batches merge, so
    one cell's queueing differs from the next one's by up to a batch time."""
    table = graphs(pad_ms, batch)[graph_name]
    order = chain_of(table)
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    cells = []
    for rep in range(reps):
        for mode in ("bare", "nspb"):
            with tempfile.TemporaryDirectory(prefix="hams-stages-") as tmp:
                st = run_cell(graph_name, table, mode, rate_of(graph_name, batch, pad_ms), duration_s, Path(tmp),
                              seed=rep, read_trace=lambda trace_dir: stages_of(trace_dir, order))
            cells.append({"rep": rep, "mode": mode, **{k: st[k] for k in ("p50_ms", "p99_ms", "steal", "replies",
                                                                          "stages_p50_ms", "cycle_ms", "rows_per_batch")}})
            log(f"  rep {rep} {mode:5s} p50 {st['p50_ms']:.1f} ms; p50 per stage: "
                + ", ".join(f"{n} {fmt(v)}" for n, v in st["stages_p50_ms"].items())
                + " ms; cycle " + ", ".join(f"{op} {fmt(c)}" for op, c in st["cycle_ms"].items()) + " ms"
                + f" ({st['replies']} replies)")
    return {"graph": graph_name, "pad_ms": pad_ms, "batch": batch, "order": order, "cells": cells}


def plot_overheads(out: dict, path: Path) -> None:
    """p50 per mode at 10 ms per batch (a panel per batch size), and at 50 ms per batch the
    p50 over bare per graph and mode (the large-state graph's ordering), its repetitions'
    range as the bar's whiskers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in out["rows"] if r.get("pad_ms", PAD_MS) == PAD_MS and r["graph"] in out["graphs"]]
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches) + 1, figsize=(5 * (len(batches) + 1), 4), squeeze=False)
    colour = {m: f"C{i}" for i, m in enumerate(MODES)}
    for ax, batch in zip(axes[0], batches):
        modes = [m for m in MODES if any(r["mode"] == m and r["batch"] == batch for r in rows)]
        for i, mode in enumerate(modes):
            vals = [next((r["p50_ms"] for r in rows if r["graph"] == g and r["mode"] == mode and r["batch"] == batch), 0.0)
                    for g in out["graphs"]]
            ax.bar(np.arange(len(vals)) + i * 0.16, vals, 0.16, label=mode, color=colour[mode])
        ax.set_xticks(np.arange(len(out["graphs"])) + 0.08 * (len(modes) - 1), out["graphs"], rotation=15)
        ax.set_title(f"p50 latency, batch {batch}, {PAD_MS:g} ms per batch")
        ax.set_ylabel("ms")
        ax.legend()
    ax = axes[0][-1]
    slow = [r for r in out["rows"] if r.get("pad_ms") == PAD_HAMS_MS and r["mode"] != "bare"]
    names = [g for g in [*out["graphs"], "ol_large"] if any(r["graph"] == g for r in slow)]
    modes = [m for m in MODES if any(r["mode"] == m for r in slow)]
    for i, mode in enumerate(modes):
        xs, ys, lo, hi = [], [], [], []
        for j, g in enumerate(names):
            r = next((r for r in slow if r["graph"] == g and r["mode"] == mode), None)
            base = next((b for b in out["rows"] if b["graph"] == g and b["mode"] == "bare" and b.get("pad_ms") == PAD_HAMS_MS), None)
            if r is None or base is None or not base["p50_ms"]:
                continue
            reps = [100 * (v / base["p50_ms"] - 1) for v in r.get("p50_ms_reps") or [r["p50_ms"]]]
            y = 100 * (r["p50_ms"] / base["p50_ms"] - 1)
            xs.append(j + i * 0.2), ys.append(y), lo.append(y - min(reps)), hi.append(max(reps) - y)
        ax.bar(xs, ys, 0.2, yerr=[lo, hi], capsize=3, label=mode, color=colour[mode])
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(names)) + 0.1 * (len(modes) - 1), names, rotation=15)
    ax.set_title(f"p50 over bare, batch 64, {PAD_HAMS_MS:g} ms per batch")
    ax.set_ylabel("% (whiskers: the repetitions)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(out: dict) -> list[str]:
    lines = [f"{'graph':16s} {'batch':>5s} {'pad':>3s} {'mode':6s} {'p50 ms':>8s} {'p99 ms':>8s} {'rps':>7s} {'p50 ovh':>8s} "
             f"{'p99 ovh':>8s} {'mean b':>6s} {'hold ms':>7s} {'copy ms':>7s} {'steal':>5s}"]
    fmt = lambda v: "-" if v is None else f"{v:+.1%}"  # noqa: E731
    for r in sorted(out["rows"], key=lambda r: (r["graph"], r.get("pad_ms", PAD_MS), r["batch"], MODES.index(r["mode"]))):
        lines.append(f"{r['graph']:16s} {r['batch']:5d} {r.get('pad_ms', PAD_MS):3.0f} {r['mode']:6s} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
                     f"{r['throughput_rps']:7.0f} {fmt(r['p50_overhead']):>8s} {fmt(r['p99_overhead']):>8s} "
                     f"{r['mean_batch'] or 0:6.1f} {r.get('hold_ms') or 0:7.2f} {r.get('copy_ms') or 0:7.2f} "
                     f"{r.get('steal_max') or 0:5.0%}")
    for key, reps in out.get("pad50_reps", {}).items():  # the 50 ms cells' spread: their p50 is a queueing figure
        lines.append(f"{key:22s} b=64 pad {PAD_HAMS_MS:.0f}: p50 per rep " + " ".join(f"{v:.1f}" for v in reps["p50_ms"])
                     + " ms; p99 per rep " + " ".join(f"{v:.1f}" for v in reps["p99_ms"]) + " ms")
    return lines


#: the printed table (keel experiment)
FIGURES = ("nspb_p50_overhead_b64", "nspb_p99_overhead_b64", "nspb_p50_overhead_b1", "nspb_p50_overhead_b64_pad50",
           "nspb_p99_overhead_b64_pad50", "nspb_pad50_resolution", "nspb_hold_over_floor_ms_b64",
           "nspb_hold_over_floor_and_update_ms_b64", "remus_over_nspb_ol", "ol_aa_resolution", "remus_over_nspb_ol_range",
           "ol_resolution", "throughput_ratio_b64", "lineage_ms_per_batch", "lineage_ms_per_batch_p50", "output_loop_ms_per_batch", "ordering_ok", "lost", "nspb_hold_ms_b64",
           "loadavg_1m_at_end", "steal_max", "cells_retaken", "cells_over_steal_max", "elapsed_s")


def run(args: argparse.Namespace, log=print) -> dict:
    if args.stages:
        log(f"HAMS overhead: where {args.stages}'s p50 goes, bare and nspb in turn, traced")
        return stages(args.stages, reps=args.reps or 2, log=log)
    if args.breakdown:
        out = hold_breakdown()
        log(f"{out['graph']} batch {out['batch']} nspb: p50 {out['p50_ms']:.2f} ms, mean hold {out['hold_ms']:.2f} ms over "
            f"{out['replies']} replies; {out['operator']}'s output -> its backup applied: p50 "
            f"{out['output_to_backup_apply_ms']['p50']:.2f} ms (p90 {out['output_to_backup_apply_ms']['p90']:.2f}); "
            f"-> the frontend released: p50 {out['backup_apply_to_release_ms']['p50']:.2f} ms "
            f"(p90 {out['backup_apply_to_release_ms']['p90']:.2f}); steal {out['steal'] or 0:.0%}")
        return out
    log("HAMS overhead: modes bare/nspb/s1/s2/remus interleaved on real processes")
    out = overheads(args.quick, log, reps=args.reps)
    for line in table(out):
        log(line)
    return out


def plot(out: dict, path: Path) -> None:
    """The overheads by mode (a breakdown run draws nothing)."""
    if "rows" in out:
        plot_overheads(out, path)


def options(e: argparse.ArgumentParser) -> None:
    """``keel experiment hams-overhead``'s own options."""
    e.add_argument("--reps", type=int, help="repetitions of every cell (default: 1 quick, 2 full)")
    e.add_argument("--stages", metavar="GRAPH", choices=("gru_gru", "online_learning", "stateful_last", "ol_large"),
                   help="instead: traced bare and nspb cells of a chain GRAPH at 50 ms per batch, in turn (--reps "
                        "times, default 2), and per reply the time from each operator's output to the next's and to "
                        "the release")
    e.add_argument("--breakdown", action="store_true",
                   help="instead: one traced nspb cell (gru_gru, batch 64) and where its held replies' time goes")

