"""An experiment: a cluster spec, modes, a bounded workload, a fault plan, invariants, a report.

TOML (full reference in docs/design/chaos.md)::

    name = "worker_kill_shuffle"
    seed = 7
    netns = "auto"              # "auto" | true | false
    link_mbit = 1000            # tbf on every host link (netns mode)
    max_duration_s = 180        # hard bound of the whole run
    modes = ["parm", "equal"]   # deployments compared under the same plan and seed
    schedule = "back_to_back"   # or "interleaved": all modes at once, one cluster each
    supervised = ["d1"]         # optional: hosts whose services run under supervisord
                                #   (chaos.supervised; the crash fault)
    [cluster]                   # a Keel cluster spec (common/spec.py), embedded
    [mode_overrides.NAME]       # optional: deep-merged into [cluster] for mode NAME
    prepare = "module:function" # optional: function(out_dir) -> dict deep-merged into [cluster]
                                #   (e.g. chaos.rollout:prepare builds a model store)
    [workload]                  # chaos.workload.WorkloadConfig keys
    [[faults]]                  # and/or [faults_random]: chaos.faults

Back to back, every mode gets a fresh cluster, the same seed, the same arrivals and the
same fault timeline, one after the other. Interleaved, every mode's cluster runs at the
same time (its own namespaces, or its own loopback addresses) with its own workload
process on the same schedule, and each fault hits all of them at once, so a mode ratio
comes from one period of time on one machine.
"""
from __future__ import annotations

import dataclasses
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.chaos import report as rep
from keel.chaos.deployment import Deployment, deep_merge, spec_for_mode
from keel.chaos.faults import FaultPlan, FaultRunner
from keel.chaos.hosts import Cluster
from keel.chaos.invariants import Checker, CheckContext, graph_checks
from keel.chaos.resources import ChaosError, Registry, clean_stale
from keel.chaos.workload import Workload, WorkloadConfig, load_inputs

_KEYS = {"name", "seed", "netns", "link_mbit", "max_duration_s", "modes", "schedule", "cluster", "mode_overrides",
         "workload", "faults", "faults_random", "settle_s", "start_timeout_s", "description", "prepare", "supervised"}


@dataclass
class Experiment:
    name: str
    cluster: dict
    workload: dict
    seed: int = 0
    netns: bool | str = "auto"
    link_mbit: float | None = 1000.0
    max_duration_s: float = 300.0
    modes: list[str] = field(default_factory=lambda: ["none"])
    schedule: str = "back_to_back"
    mode_overrides: dict[str, dict] = field(default_factory=dict)
    faults: list[dict] = field(default_factory=list)
    faults_random: dict | None = None
    #: pause between "deployment ready" and the first query (s)
    settle_s: float = 1.0
    start_timeout_s: float = 60.0
    description: str = ""
    prepare: str = ""
    supervised: list[str] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False)

    def validate(self) -> None:
        if self.schedule not in ("back_to_back", "interleaved"):
            raise ChaosError(f"schedule must be back_to_back or interleaved, got {self.schedule!r}")
        if not self.modes or len(set(self.modes)) != len(self.modes):
            raise ChaosError(f"modes must be distinct and non-empty: {self.modes}")
        if not 0 < self.max_duration_s <= 3600:
            raise ChaosError("max_duration_s must be in (0, 3600]: every experiment is bounded")
        unknown = [h for h in self.supervised if h not in self.cluster.get("hosts", {"local": None})]
        if unknown:
            raise ChaosError(f"supervised: {unknown} are not hosts of the cluster")

    def hosts(self) -> list[str]:
        hosts = list(self.cluster.get("hosts", {"local": "127.0.0.1"}))
        client = self.workload.get("client_host", "client")
        return hosts + ([client] if client not in hosts else [])


def load_experiment(source: str | Path | dict) -> Experiment:
    raw = source if isinstance(source, dict) else tomllib.loads(Path(source).read_text())
    unknown = set(raw) - _KEYS
    if unknown:
        raise ChaosError(f"unknown experiment key(s) {sorted(unknown)}; known: {sorted(_KEYS)}")
    for key in ("name", "cluster", "workload"):
        if key not in raw:
            raise ChaosError(f"experiment: {key} is required")
    exp = Experiment(**{k: v for k, v in raw.items()}, raw=raw)
    exp.validate()
    return exp


def _segment(exp: Experiment, modes: list[str], plan: FaultPlan, registry: Registry, out_dir: Path,
             deadline: float) -> dict[str, Any]:
    """Deploy ``modes`` at once, run workload and faults, tear down; returns the raw results."""
    clusters: dict[str, Cluster] = {}
    deployments: dict[str, Deployment] = {}
    workloads: dict[str, Workload] = {}
    runner = None
    result: dict[str, Any] = {"records": {}, "done": {}, "events": [], "shuffles": [], "predictors": {}, "inputs": None}
    try:
        for i, mode in enumerate(modes):
            clusters[mode] = Cluster(exp.hosts(), run_dir=out_dir / mode, netns=exp.netns, link_mbit=exp.link_mbit,
                                     registry=registry, tag=f"m{i}" if len(modes) > 1 else "", local_index=i, clean=False)
        for mode in modes:
            spec = spec_for_mode(exp.cluster, mode, exp.mode_overrides.get(mode))
            if "graph" in spec:  # a HAMS graph traces what the graph invariants read
                spec["graph"]["trace_dir"] = str(_graph_traces(out_dir, mode))
            dep = Deployment(clusters[mode], spec, probe_host=exp.workload.get("client_host", "client"),
                             supervised=exp.supervised)
            deployments[mode] = dep.start(min(exp.start_timeout_s, max(1.0, deadline - time.monotonic())))
        model = exp.workload["model"]
        for mode in modes:
            wcfg = WorkloadConfig(**{**exp.workload, "seed": exp.workload.get("seed", exp.seed)})
            wcfg.input_shape = wcfg.input_shape or deployments[mode].input_shape(model)
            wcfg.modes = {mode: deployments[mode].frontends}
            workloads[mode] = Workload(wcfg, out_dir / mode / "workload")
        for mode in modes:
            workloads[mode].start(clusters[mode])
        for mode in modes:
            workloads[mode].wait_ready(max(1.0, deadline - time.monotonic()))
        t0 = time.time() + exp.settle_s + 0.1  # the generators and the faults on one schedule
        for mode in modes:
            workloads[mode].go(t0)
        runner = FaultRunner(plan, clusters, specs={m: d.spec for m, d in deployments.items()},
                             probe_host=exp.workload.get("client_host", "client")).start(t0)
        result["t0"] = t0
        for mode in modes:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChaosError(f"experiment ran past max_duration_s = {exp.max_duration_s}")
            result["done"][mode] = workloads[mode].wait(min(workloads[mode].bound_s(), left))
            result["records"].update(workloads[mode].records())
        result["shuffles"] = runner.stop()
        result["events"] = runner.events
        first = deployments[modes[0]]
        result["predictors"] = first.predictors([model])
        result["inputs"] = load_inputs(workloads[modes[0]].cfg.dataset, workloads[modes[0]].cfg.input_shape)
        return result
    finally:
        if runner is not None:
            runner.stop()
            result["events"] = runner.events
        for cluster in clusters.values():
            cluster.close()
        result["leftovers"] = [x for c in clusters.values() for x in c.leftovers()]


def run_experiment(exp: Experiment, json_path: Path, out_dir: Path | None = None,
                   checker: Checker | None = None) -> dict:
    """Run ``exp``; write the report JSON at ``json_path`` and plots beside it."""
    started, mono0 = time.time(), time.monotonic()
    deadline = mono0 + exp.max_duration_s
    json_path = Path(json_path)
    out_dir = Path(out_dir or json_path.with_suffix("")).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = clean_stale()
    if exp.prepare:
        deep_merge(exp.cluster, _hook(exp.prepare)(out_dir))
    plan = FaultPlan.from_config(exp.raw or dataclasses.asdict(exp), exp.hosts(), exp.seed)
    registry = Registry.create()
    groups = [exp.modes] if exp.schedule == "interleaved" else [[m] for m in exp.modes]
    segments = []
    try:
        for modes in groups:
            segments.append(_segment(exp, modes, plan, registry, out_dir, deadline))
    finally:
        if not any(seg.get("leftovers") for seg in segments):
            registry.close()
    checker = checker or Checker.default()
    records = {m: r for seg in segments for m, r in seg["records"].items()}
    summaries = {m: rep.summarize(records.get(m, [])) for m in exp.modes}
    invariants: dict[str, list[dict]] = {}
    for seg in segments:
        for mode in seg["records"]:
            ctx = CheckContext(inputs=seg["inputs"], predictors=seg["predictors"], model=exp.workload["model"])
            mode_checker = checker
            spec = spec_for_mode(exp.cluster, mode, exp.mode_overrides.get(mode))
            if "graph" in spec:
                hams, ctx.streams = graph_checks(spec["graph"], _graph_traces(out_dir, mode))
                mode_checker = Checker([*checker.invariants, *hams])
            invariants[mode] = [r.to_dict() for r in mode_checker.run(seg["records"][mode], ctx)]
    events = [e for seg in segments for e in seg["events"]]
    report = {
        "experiment": exp.name, "description": exp.description, "seed": exp.seed, "config": exp.raw,
        "hosts_mode": "netns" if _netns_used(exp) else "local", "schedule": exp.schedule, "modes_order": exp.modes,
        "started": started, "duration_s": time.monotonic() - mono0, "stale_cleaned": stale,
        "fault_plan": plan.to_list(), "faults": events, "shuffles": [s for seg in segments for s in seg["shuffles"]],
        "modes": summaries, "ratios": rep.ratios(summaries), "invariants": invariants,
        "invariants_all": [{**r, "mode": m} for m, rs in invariants.items() for r in rs],
        "workload": {m: d for seg in segments for m, d in seg["done"].items()},
        "records": {m: str(out_dir / m / "workload" / f"records-{m}.jsonl") for m in exp.modes},
        "leftovers": [x for seg in segments for x in seg.get("leftovers", [])],
    }
    stem = json_path.with_suffix("")
    t0s = {m: seg["t0"] for seg in segments for m in seg["records"]}
    report["plots"] = {"cdf": str(rep.plot_cdf(records, Path(f"{stem}-cdf.png"), f"{exp.name}: latency CDF")),
                       "timeline": str(_timeline(records, events, t0s, Path(f"{stem}-timeline.png"), exp.name))}
    rep.write_json(json_path, report)
    return report


def _graph_traces(out_dir: Path, mode: str) -> Path:
    return out_dir / mode / "graph-traces"


def _hook(name: str):
    """The function ``module:function`` names."""
    import importlib

    module, _, func = name.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise ChaosError(f"prepare = {name!r}: {exc}") from None


def _netns_used(exp: Experiment) -> bool:
    from keel.chaos.hosts import resolve_netns

    try:
        return resolve_netns(exp.netns)[0]
    except ChaosError:
        return False


def _timeline(records: dict, events: list[dict], t0s: dict[str, float], path: Path, name: str) -> Path:
    """Latency over time since each mode's own start (back to back, modes run at different
    times), with each mode's faults shifted the same way."""
    shifted_recs = {m: [{**r, "send_t": r["send_t"] - t0s[m]} for r in recs] for m, recs in records.items() if m in t0s}
    shifted_evs = [{**e, "t_wall": e["t_wall"] - t0s.get(e["mode"], 0.0)} for e in events]
    return rep.plot_timeline(shifted_recs, shifted_evs, 0.0, path, f"{name}: latency over time, with faults")
