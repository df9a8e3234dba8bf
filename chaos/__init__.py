"""Keel's chaos harness: hosts, faults, workload, invariants and reports.

The Python API (what ``keel chaos run`` does, piece by piece, for experiments that need
their own loop, such as ParM's tail-latency sweeps)::

    from keel.chaos import Cluster, Deployment, Workload, WorkloadConfig, FaultPlan, FaultRunner
    from keel.chaos import Checker, CheckContext, report

    cluster = Cluster(["fe", "w1", "w2", "client"], run_dir=Path("runs/x"), netns="auto", link_mbit=1000)
    try:
        dep = Deployment(cluster, spec_dict, probe_host="client").start()
        cfg = WorkloadConfig(model="digits", rate=200, count=5000, duration_s=30,
                             input_shape=dep.input_shape("digits"), modes={"parm": dep.frontends})
        work = Workload(cfg, Path("runs/x/workload"))
        plan = FaultPlan.from_config({"faults": [{"at_s": 2, "kind": "shuffle", "hosts": ["fe", "w1", "w2"],
                                                  "concurrent": 4, "duration_s": 20}]}, list(cluster.hosts))
        work.start(cluster)
        work.wait_ready(60.0)   # imports done: start-up never shifts the schedule
        t0 = time.time() + 0.1
        work.go(t0)
        runner = FaultRunner(plan, {"parm": cluster}).start(t0)
        work.wait()
        shuffles = runner.stop()
        records = work.records()["parm"]
        results = Checker.default().run(records, CheckContext(inputs=..., predictors=dep.predictors(["digits"]), model="digits"))
        summary = report.summarize(records)
    finally:
        cluster.close()

Or the whole experiment from a TOML or dict: ``run_experiment(load_experiment(path), json_path)``.
Modules: ``hosts`` (Cluster), ``netns`` (namespaces, tbf), ``faults`` (plans, runner),
``shuffle``, ``proxy`` (delay), ``workload``, ``invariants``, ``report``, ``deployment``,
``experiment``, ``selftest``, ``resources`` (state files, stale cleanup), ``cli``.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Cluster": "keel.chaos.hosts", "Unsupported": "keel.chaos.hosts",
    "Deployment": "keel.chaos.deployment", "spec_for_mode": "keel.chaos.deployment",
    "Workload": "keel.chaos.workload", "WorkloadConfig": "keel.chaos.workload", "schedule": "keel.chaos.workload",
    "FaultPlan": "keel.chaos.faults", "FaultRunner": "keel.chaos.faults", "Fault": "keel.chaos.faults",
    "Shuffle": "keel.chaos.shuffle", "ShuffleLoad": "keel.chaos.shuffle", "DelayProxy": "keel.chaos.proxy",
    "Checker": "keel.chaos.invariants", "CheckContext": "keel.chaos.invariants", "InvariantResult": "keel.chaos.invariants",
    "UniquePerKey": "keel.chaos.invariants",
    "Experiment": "keel.chaos.experiment", "load_experiment": "keel.chaos.experiment", "run_experiment": "keel.chaos.experiment",
    "run_selftest": "keel.chaos.selftest", "clean_stale": "keel.chaos.resources", "ChaosError": "keel.chaos.resources",
    "report": "keel.chaos.report",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # lazy: `keel` imports chaos.cli on every command and must not pay for matplotlib or zmq
    if name not in _EXPORTS:
        raise AttributeError(f"module 'chaos' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    return module if name == "report" else getattr(module, name)
