"""Invariants checked after every run, and the API later work extends.

An invariant is any object with a ``name`` and ``check(records, ctx) -> InvariantResult``;
``records`` are the workload's per-request dicts (see ``chaos.workload``) and ``ctx`` a
``CheckContext`` with what a check may need (inputs, offline predictors, extra record
streams such as operator outputs). ``Checker`` runs a list of them and never lets one
crash the report: an exception becomes a failed result that names it.

Built in:

- ``AnsweredExactlyOnce``   every accepted request got exactly one answer (a rejection,
  e.g. ``overloaded``, means not accepted; a client timeout means lost)
- ``ModelRepliesMatchOffline``  a reply from source ``model`` or ``cache`` equals what
  the model computes offline for that input (``np.allclose``, atol 1e-4); with the
  version the reply names, when a rollout left several (predictors ``model@version``)
- ``NoConflictingAnswers``  no request id got two different answers
- ``EachRequestAppliedOnce`` (HAMS graphs) each (client, request id) changes each stateful
  operator's state at most once, over the states its backups applied
- ``UniquePerKey``          generic "no two different values for one key anywhere":
  stateful graphs use it for (operator, sequence number) -> output, e.g.
  ``UniquePerKey("operator_outputs_unique", stream="operator_outputs",
  key=lambda r: (r["operator"], r["seq"]), value=lambda r: r["output"])``

Example
-------
>>> checker = Checker.default()
>>> [r.name for r in checker.run([], CheckContext())]
['answered_exactly_once', 'model_replies_match_offline', 'no_conflicting_answers']
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from keel.common.loadgen import REJECTED, accepted, answers  # noqa: F401  (the harness imports them from here)

MAX_EXAMPLES = 10


@dataclass
class InvariantResult:
    name: str
    ok: bool | None  # None: not checked (the reason is in detail)
    checked: int = 0
    violations: int = 0
    detail: str = ""
    examples: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CheckContext:
    """What checks may use besides the records."""

    #: the workload's input rows (indexed by a record's ``input_index``)
    inputs: np.ndarray | None = None
    #: model name -> offline predictor with ``predict_batch``
    predictors: dict[str, Any] = field(default_factory=dict)
    #: the model the workload queried
    model: str | None = None
    atol: float = 1e-4
    #: further record streams by name (e.g. "operator_outputs" from stateful graphs)
    streams: dict[str, list[dict]] = field(default_factory=dict)


class Invariant(Protocol):
    name: str

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult: ...


def _same(a: dict, b: dict, atol: float) -> bool:
    if (a.get("source") == "error") != (b.get("source") == "error"):
        return False
    oa, ob = a.get("output"), b.get("output")
    if oa is None or ob is None:
        return oa is None and ob is None and a.get("error_code") == b.get("error_code")
    return len(oa) == len(ob) and bool(np.allclose(oa, ob, atol=atol))


class AnsweredExactlyOnce:
    name = "answered_exactly_once"

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        res = InvariantResult(self.name, True)
        lost = dup = 0
        for rec in records:
            if not accepted(rec):
                continue
            res.checked += 1
            n = len(answers(rec))
            if n == 1:
                continue
            lost += n == 0
            dup += n > 1
            if len(res.examples) < MAX_EXAMPLES:
                res.examples.append({"request_id": rec["request_id"], "answers": n,
                                     "replies": [r.get("source") + (f"/{r['error_code']}" if r.get("error_code") else "")
                                                 for r in rec.get("replies", [])]})
        res.violations = lost + dup
        res.ok = res.violations == 0
        res.detail = f"{lost} lost, {dup} answered more than once, of {res.checked} accepted"
        return res


class ModelRepliesMatchOffline:
    name = "model_replies_match_offline"

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        res = InvariantResult(self.name, True)
        predictor = ctx.predictors.get(ctx.model) if ctx.model else None
        if predictor is None or ctx.inputs is None:
            return InvariantResult(self.name, None, detail="not checked: no offline predictor or inputs for the model")
        todo = [(rec, r) for rec in records for r in rec.get("replies", []) if r.get("source") in ("model", "cache")]
        missing = sum(1 for _, r in todo if r.get("output") is None)
        todo = [(rec, r) for rec, r in todo if r.get("output") is not None]
        # a reply is checked against the version it names where the context has that
        # version's predictor ("model@version": a rollout moved the workers), else the model's
        def predictor_of(r: dict) -> str:
            versioned = f"{ctx.model}@{r.get('version')}"
            return versioned if versioned in ctx.predictors else ctx.model

        key = {id(r): predictor_of(r) for _, r in todo}
        expected: dict[tuple[str, int], np.ndarray] = {}
        for name in sorted(set(key.values())):
            rows = sorted({rec["input_index"] for rec, r in todo if key[id(r)] == name})
            for start in range(0, len(rows), 256):
                chunk = rows[start:start + 256]
                out = np.asarray(ctx.predictors[name].predict_batch(ctx.inputs[chunk]))
                expected.update({(name, row): out[j].ravel() for j, row in enumerate(chunk)})
        for rec, r in todo:
            res.checked += 1
            want = expected[key[id(r)], rec["input_index"]]
            got = np.asarray(r["output"], np.float32)
            if got.shape != want.shape or not np.allclose(got, want, atol=ctx.atol):
                res.violations += 1
                if len(res.examples) < MAX_EXAMPLES:
                    res.examples.append({"request_id": rec["request_id"], "input_index": rec["input_index"],
                                         "max_abs_diff": float(np.max(np.abs(got - want))) if got.shape == want.shape else None})
        res.ok = res.violations == 0
        res.detail = f"{res.violations} of {res.checked} model replies differ from offline (atol {ctx.atol})"
        if missing:
            res.detail += f"; {missing} model replies kept no output"
        return res


class NoConflictingAnswers:
    name = "no_conflicting_answers"

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        res = InvariantResult(self.name, True)
        for rec in records:
            got = answers(rec)
            res.checked += 1
            if any(not _same(got[0], other, ctx.atol) for other in got[1:]):
                res.violations += 1
                if len(res.examples) < MAX_EXAMPLES:
                    res.examples.append({"request_id": rec["request_id"], "sources": [r.get("source") for r in got]})
        res.ok = res.violations == 0
        res.detail = f"{res.violations} request ids got different answers"
        return res


class UniquePerKey:
    """No two different values for one key, over ``ctx.streams[stream]`` (or the records)."""

    def __init__(self, name: str, key: Callable[[dict], Any], value: Callable[[dict], Any], stream: str | None = None,
                 same: Callable[[Any, Any], bool] | None = None):
        self.name, self.key, self.value, self.stream = name, key, value, stream
        self.same = same or (lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))))

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        if self.stream is not None and self.stream not in ctx.streams:
            return InvariantResult(self.name, None, detail=f"not checked: no {self.stream!r} stream in this run")
        rows = ctx.streams[self.stream] if self.stream is not None else records
        res = InvariantResult(self.name, True)
        seen: dict[Any, Any] = {}
        bad: set = set()
        for row in rows:
            k, v = self.key(row), self.value(row)
            res.checked += 1
            if k in seen:
                if not self.same(seen[k], v) and k not in bad:
                    bad.add(k)
                    if len(res.examples) < MAX_EXAMPLES:
                        res.examples.append({"key": repr(k)})
            else:
                seen[k] = v
        res.violations = len(bad)
        res.ok = not bad
        res.detail = f"{len(bad)} keys with two or more different values, of {len(seen)}"
        return res


class Checker:
    """A list of invariants, run together; extend with ``add``."""

    def __init__(self, invariants: Iterable[Invariant] = ()):
        self.invariants: list[Invariant] = list(invariants)

    @classmethod
    def default(cls) -> Checker:
        return cls([AnsweredExactlyOnce(), ModelRepliesMatchOffline(), NoConflictingAnswers()])

    def add(self, invariant: Invariant) -> Checker:
        self.invariants.append(invariant)
        return self

    def run(self, records: list[dict], ctx: CheckContext) -> list[InvariantResult]:
        out = []
        for inv in self.invariants:
            try:
                out.append(inv.check(records, ctx))
            except Exception as exc:  # a broken check fails loudly in the report, not the run
                out.append(InvariantResult(inv.name, False, detail=f"check raised {type(exc).__name__}: {exc}"))
        return out


# --- HAMS service graphs ------------------------------------------------------------------
# Streams from the graph processes' event logs (services.graph.events, ``load_graph_traces``):
# "graph_release" (a reply left the frontend, with its lineage), "graph_apply" (a backup
# applied a state, with the lineage it depended on and the state's epoch), "graph_output"
# (an operator's output per seq, with its epoch and origin). Times are one host's monotonic clock.


def load_graph_traces(trace_dir: str | Path) -> dict[str, list[dict]]:
    """The graph streams of every ``*.jsonl`` trace in ``trace_dir``, by stream name (a
    last line cut short by a killed process is skipped)."""
    import orjson

    streams: dict[str, list[dict]] = {"graph_release": [], "graph_apply": [], "graph_output": []}
    for path in sorted(Path(trace_dir).glob("*.jsonl")):
        process = path.stem  # until the file's first ``process`` line names the writer
        for line in path.read_bytes().splitlines():
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if rec["stream"] == "process":  # a process (re)started on this path: what follows is its
                process = f"{path.stem}:{rec['pid']}"
                continue
            rec["process"] = process
            streams.setdefault(f"graph_{rec['stream']}", []).append(rec)
    return streams


class _DurableTimeline:
    """When each stateful operator's backup had applied up to each seq: per operator the
    apply times with the running highest applied seq, so "was seq durable at t" is one
    binary search."""

    def __init__(self, applies: list[dict]):
        by_op: dict[str, list[tuple[float, int]]] = {}
        for a in sorted(applies, key=lambda a: a["t"]):
            by_op.setdefault(a["operator"], []).append((a["t"], a["last_seq"]))
        self.times: dict[str, list[float]] = {}
        self.highest: dict[str, list[int]] = {}
        for op, rows in by_op.items():
            self.times[op] = [t for t, _ in rows]
            self.highest[op] = list(itertools.accumulate((s for _, s in rows), max))

    def durable_at(self, operator: str, seq: int, t: float) -> bool:
        i = bisect.bisect_right(self.times.get(operator, []), t)
        return i > 0 and self.highest[operator][i - 1] >= seq


class DurableBeforeRelease:
    """HAMS §IV-D: no reply leaves the frontend before every stateful state on its lineage
    was applied on that operator's backup."""

    name = "graph_durable_before_release"

    def __init__(self, stateful: Iterable[str]):
        self.stateful = set(stateful)

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        if "graph_release" not in ctx.streams:
            return InvariantResult(self.name, None, detail="not checked: no graph traces in this run")
        durable = _DurableTimeline(ctx.streams.get("graph_apply", []))
        res = InvariantResult(self.name, True)
        for rel in ctx.streams["graph_release"]:
            res.checked += 1
            early = [e for e in rel["lineage"] if e[2] in self.stateful and not durable.durable_at(e[2], e[3], rel["t"])]
            if early:
                res.violations += 1
                if len(res.examples) < MAX_EXAMPLES:
                    res.examples.append({"origin": rel["origin"], "not_durable": early})
        res.ok = res.violations == 0
        res.detail = f"{res.violations} replies left before their lineage was durable, of {res.checked}"
        return res


class AppliedInAlgorithm2Order:
    """HAMS Algorithm 2: a backup applies a state only after every previous stateful model
    on its requests' lineage had applied (was durable at) the seq in that lineage."""

    name = "graph_algorithm2_order"

    def __init__(self, stateful: Iterable[str]):
        self.stateful = set(stateful)

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        if "graph_apply" not in ctx.streams:
            return InvariantResult(self.name, None, detail="not checked: no graph traces in this run")
        applies = ctx.streams["graph_apply"]
        durable = _DurableTimeline(applies)
        res = InvariantResult(self.name, True)
        for a in applies:
            res.checked += 1
            early = [e for e in a["lineage"] if e[2] in self.stateful and e[2] != a["operator"]
                     and not durable.durable_at(e[2], e[3], a["t"])]
            if early:
                res.violations += 1
                if len(res.examples) < MAX_EXAMPLES:
                    res.examples.append({"operator": a["operator"], "last_seq": a["last_seq"], "not_durable": early})
        res.ok = res.violations == 0
        res.detail = f"{res.violations} states applied before their dependencies were durable, of {res.checked}"
        return res


class OneOutputPerOperatorSeq:
    """HAMS's guarantee, "one output per (operator, seq) across replies and backups": no two
    different outputs for one (operator, seq) among the outputs that counted, i.e. that
    reached a reply (a released reply's lineage names that (operator, seq) for the output's
    origin, and it is the newest such output made before the release) or that a backup applied (an ``apply`` of that operator at the output's epoch
    names it). An output a failed or rolled-back primary numbered but that nobody took
    (voided at the frontend, never applied) is not an output of the graph and is not counted.

    A ``graph_output`` record carries ``operator``, ``seq``, ``epoch``, ``origin``, ``output``;
    an ``apply`` its state's ``epoch``."""

    name = "graph_one_output_per_operator_seq"

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        if "graph_output" not in ctx.streams:
            return InvariantResult(self.name, None, detail="not checked: no graph traces in this run")
        # the output a reply carried: the newest one for its (operator, seq, origin) made
        # before the release (an older one, voided at a takeover and re-run, did not reach it)
        made: dict[tuple, list[dict]] = {}
        for o in sorted(ctx.streams["graph_output"], key=lambda o: o.get("t", 0.0)):
            made.setdefault((o["operator"], o["seq"], o.get("origin")), []).append(o)
        reached: dict[int, dict] = {}
        for rel in ctx.streams.get("graph_release", []):
            for e in rel["lineage"]:
                before = [o for o in made.get((e[2], e[3], rel["origin"]), []) if o.get("t", 0.0) <= rel["t"]]
                if before:
                    reached[id(before[-1])] = before[-1]
        applied = {(e[2], e[3], a.get("epoch")) for a in ctx.streams.get("graph_apply", []) for e in a["lineage"]
                   if e[2] == a["operator"]}
        counted = [o for o in ctx.streams["graph_output"]
                   if id(o) in reached or (o["operator"], o["seq"], o.get("epoch")) in applied]
        res = UniquePerKey(self.name, key=lambda r: (r["operator"], r["seq"]), value=lambda r: r["output"]).check(
            counted, CheckContext())
        res.detail += f" (counted {len(counted)} released or applied outputs of {len(ctx.streams['graph_output'])} traced)"
        return res


class OnePrimaryPerEpoch:
    """HAMS §IV-E fencing: at each (operator, epoch) one process numbers outputs. A failover
    or a roll-back in place takes a new epoch; a fenced old primary (thawed, healed) must
    number nothing more at its own. The process of a record is its trace file's writer
    (``load_graph_traces``: a process started again on one path is told apart by pid)."""

    name = "graph_one_primary_per_epoch"

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        if "graph_output" not in ctx.streams:
            return InvariantResult(self.name, None, detail="not checked: no graph traces in this run")
        writers: dict[tuple, set[str]] = {}
        for o in ctx.streams["graph_output"]:
            writers.setdefault((o["operator"], o.get("epoch")), set()).add(o.get("process", "?"))
        res = InvariantResult(self.name, True, checked=len(writers))
        for (op, epoch), procs in sorted(writers.items(), key=str):
            if len(procs) > 1:
                res.violations += 1
                if len(res.examples) < MAX_EXAMPLES:
                    res.examples.append({"operator": op, "epoch": epoch, "processes": sorted(procs)})
        res.ok = res.violations == 0
        res.detail = f"{res.violations} (operator, epoch) pairs numbered by more than one process, of {res.checked}"
        return res


class EachRequestAppliedOnce:
    """Exactly-once effects: each (client, request id) changes each stateful operator's
    state at most once. Read over the operator's durable states, in the order they were
    applied: an ``apply`` names the requests its state applied (``requests``: [request key,
    seq], the primary's table records, services.graph.applied); a ``takeover`` at
    ``max_seq`` (a promoted backup, a roll-back in place, an ls replay from a checkpoint)
    goes on from the state at ``max_seq``, so requests applied above it belong to a state
    that no longer exists and may be applied again. A key applied at two seqs of the
    surviving states is a violation (one apply traced twice, at the same seq, is not)."""

    name = "graph_request_applied_once"

    def check(self, records: list[dict], ctx: CheckContext) -> InvariantResult:
        if "graph_apply" not in ctx.streams:
            return InvariantResult(self.name, None, detail="not checked: no graph traces in this run")
        events = [(a["t"], 1, a) for a in ctx.streams["graph_apply"]] + \
                 [(t["t"], 0, t) for t in ctx.streams.get("graph_takeover", [])]
        applied: dict[str, dict[str, int]] = {}  # operator -> request key -> seq its state applied it at
        res = InvariantResult(self.name, True)
        for _, is_apply, e in sorted(events, key=lambda x: (x[0], x[1])):
            held = applied.setdefault(e["operator"], {})
            if not is_apply:
                for key in [k for k, seq in held.items() if seq > e["max_seq"]]:
                    del held[key]  # the state above max_seq is gone: its requests come again
                continue
            for key, seq in e.get("requests") or []:
                res.checked += 1
                if held.setdefault(key, seq) != seq:
                    res.violations += 1
                    if len(res.examples) < MAX_EXAMPLES:
                        res.examples.append({"operator": e["operator"], "request": key, "seqs": [held[key], seq]})
        res.ok = res.violations == 0
        res.detail = f"{res.violations} requests applied twice to one operator's state, of {res.checked} applied"
        return res


def graph_invariants(stateful: Iterable[str]) -> list[Invariant]:
    """The HAMS invariants: durable before release; Algorithm 2 order; one output per
    (operator, seq); one primary per (operator, epoch); each request applied once per
    stateful operator."""
    stateful = list(stateful)
    return [DurableBeforeRelease(stateful), AppliedInAlgorithm2Order(stateful), OneOutputPerOperatorSeq(),
            OnePrimaryPerEpoch(), EachRequestAppliedOnce()]


def graph_checks(graph_table: dict, trace_dir: str | Path) -> tuple[list[Invariant], dict[str, list[dict]]]:
    """For a run of the ``[graph]`` table ``graph_table`` whose processes traced into
    ``trace_dir``: the HAMS invariants and the streams they read (the chaos runner adds
    both to a graph experiment's checks)."""
    from keel.common.spec.graph import read_graph

    return graph_invariants(read_graph(graph_table).stateful), load_graph_traces(trace_dir)
