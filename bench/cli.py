"""``keel bench`` and ``keel experiment``: the benchmarks and experiments, found by the
``keel`` command through the ``keel.commands`` entry points (pyproject.toml), so the
serving commands never import them.

``BENCHMARKS`` and ``EXPERIMENTS`` are the one registry of both commands. A row names the
module, its help line and what ``--quick`` means; the registry gives every command the
same ``--json PATH`` (default ``runs/NAME.json``, ``runs/NAME-quick.json`` with
``--quick``) and ``--quick``, and does the same at the end of each: print the figures
table, write the JSON, draw the plot beside it. A module provides:

- ``run(args, log) -> dict``: runs, logging progress through ``log``; returns the report;
- ``FIGURES`` (keys of the report for the printed table) and ``TARGETS`` (key -> target
  text such as "<= 300"), module constants;
- optionally ``options(parser)`` (its own options), ``plot(report, png)`` (the plot written
  beside the JSON), ``passed(report) -> bool`` (the exit code; default: nothing lost) and
  ``report_name(args)`` (the default JSON's name, for a command with modes of its own).

This module imports nothing heavy: a module is imported only when its command runs.

Example
-------
>>> EXPERIMENTS["kairos"].module
'keel.bench.kairos_experiment'
"""
from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Command:
    """One ``keel bench`` or ``keel experiment`` command."""

    module: str
    help: str
    #: what ``--quick`` does (None: the command has no quick form)
    quick: str | None = "shorter runs"


BENCHMARKS: dict[str, Command] = {
    "core": Command("keel.bench.core", "the request path: no-op latency, throughput at p99 <= 20 ms, batching speed-up",
                    "shorter runs (under 2 minutes)"),
    "erasure": Command("keel.bench.erasure", "ParM's code on the serving path: encode and decode latency", None),
    "gpu": Command("keel.bench.gpu", "the worker's data path on a GPU (batch x streams, copies), SERF's profile and "
                   "ParM's tail there, and the CPU beside it; skipped without a CUDA device",
                   "a smaller grid, 15 s per ParM mode (a few minutes)"),
    "gateway": Command("keel.bench.gateway", "the OIP v2 gateway against the ZeroMQ client, and CURVE's cost"),
    "ragged": Command("keel.bench.ragged", "variable lengths 4..64: padded batches vs equal shapes only, throughput at "
                      "p99 <= 50 ms and padding waste", "one search each, 1.5 s probes (about a minute)"),
    "manager": Command("keel.bench.manager", "the Raft manager group: commit latency and leader failover"),
}

EXPERIMENTS: dict[str, Command] = {
    "parm-tail": Command("keel.chaos.parm_tail", "ParM §6: tail latency of parm vs equal resources under background "
                         "shuffles", "shorter run (under 3 minutes)"),
    "kairos": Command("keel.bench.kairos_experiment", "Kairos §8: allowable throughput of Kairos vs baselines "
                      "(simulation; --live on emulated instances)", "rm2 alone, shorter trials (under 3 minutes)"),
    "hams-overhead": Command("keel.bench.hams_overhead", "HAMS §VI: latency/throughput cost of bare, nspb, s1, s2, "
                             "remus on service graphs", "two graphs, batches 1 and 64, one repetition (under 5 minutes)"),
    "hams-recovery": Command("keel.bench.hams_recovery", "HAMS II: recovery time, lost replies and conflicts after "
                             "kills and freezes of graph operators", "fewer trials per case (several minutes)"),
    "hams-timeline": Command("keel.bench.hams_timeline", "HAMS II: one stateful primary's SIGKILL and recovery, drawn "
                             "from its traces", None),
    "selection": Command("keel.bench.selection_experiment", "Clipper §5 model selection replayed offline: Fig. 8, "
                         "ensemble, contexts", "fewer context and live queries (under 5 minutes)"),
    "serf": Command("keel.bench.serf_experiment", "SERF on an emulated 8-core host: profile, predicted vs measured "
                    "latency, best pick, step load", "one short chunk per point, short phases (under 5 minutes)"),
    "served-models": Command("keel.bench.served_models", "the three seed models from deploy/examples/models.toml: every "
                             "client against the models offline; the localizer's A_a, A_d and box IoU under ParM",
                             "fewer training steps, 100 frozen queries (2-3 minutes)"),
    "serf-drift": Command("keel.bench.serf_drift", "SERF: how steady a model's service time is here, and how far that "
                          "alone moves Eq. 13's predictions", None),
}


def _needs_extra() -> None:
    if find_spec("matplotlib") is None:
        raise SystemExit("keel: benchmarks and experiments need the bench extra: pip install 'keel[bench]'")


def json_path(name: str, args: argparse.Namespace, module: Any = None) -> Path:
    """Where a command's report goes: ``--json``, else ``runs/NAME[-quick].json`` (NAME as
    the module's ``report_name(args)`` says, for a command with modes of its own)."""
    if args.json:
        return Path(args.json)
    report_name = getattr(module, "report_name", None)
    name = report_name(args) if report_name is not None else name
    return Path(f"runs/{name}{'-quick' if getattr(args, 'quick', False) else ''}.json")


def finish(module: Any, report: dict, path: Path, log=print) -> int:
    """What every command does at its end: the figures table, the JSON (and the plot beside
    it), and the exit code (``module.passed``, else 0 when nothing was lost)."""
    from keel.common.loadgen import figures_table, write_json, write_json_and_plot

    figures = [k for k in module.FIGURES if k in report]
    if figures:
        log("")
        for line in figures_table(report, figures, getattr(module, "TARGETS", {})):
            log(line)
    plot = getattr(module, "plot", None)
    if plot is not None:
        drawn = write_json_and_plot(path, report, plot)
        log(f"wrote {path} and {drawn}" if Path(drawn).exists() else f"wrote {path} (nothing to draw)")
    else:
        log(f"wrote {write_json(path, report)}")
    passed = getattr(module, "passed", None)
    return 0 if (passed(report) if passed is not None else not report.get("lost")) else 1


def _command(name: str, command: Command):
    def run(args: argparse.Namespace) -> int:
        _needs_extra()
        module = importlib.import_module(command.module)
        log = lambda s: print(s, flush=True)  # noqa: E731
        path = json_path(name, args, module)
        report = module.run(args, log)
        if isinstance(report, int):  # a mode of the command that reports by itself (e.g. a breakdown)
            return report
        return finish(module, report, path, log)

    return run


def _add(subparsers: Any, name: str, command: Command, options: bool) -> None:
    p = subparsers.add_parser(name, help=command.help, description=command.help)
    p.add_argument("--json", metavar="PATH", help=f"write the figures here (default runs/{name}.json; a plot beside it)")
    if command.quick is not None:
        p.add_argument("--quick", action="store_true", help=command.quick)
    if options:
        add_options = getattr(importlib.import_module(command.module), "options", None)
        if add_options is not None:
            add_options(p)
    p.set_defaults(func=_command(name, command))


def _register(subparsers: Any, commands: dict[str, Command], argv: Sequence[str], dest: str) -> None:
    """Add every command; import only the one being run (for its own options)."""
    which = subparsers.add_subparsers(dest=dest, required=True, metavar=dest.upper())
    chosen = argv[1] if len(argv) > 1 else None
    for name, command in commands.items():
        _add(which, name, command, options=name == chosen)


def add_bench(subparsers: Any, argv: Sequence[str] = ()) -> None:
    p = subparsers.add_parser("bench", help="benchmarks: print a table and write JSON")
    if argv and argv[0] == "bench":
        _needs_extra()
    _register(p, BENCHMARKS, list(argv) if argv and argv[0] == "bench" else (), "benchmark")


def add_experiment(subparsers: Any, argv: Sequence[str] = ()) -> None:
    p = subparsers.add_parser("experiment", help="experiments that take minutes (not part of the test suite): "
                              "table, JSON, plots")
    if argv and argv[0] == "experiment":
        _needs_extra()
    _register(p, EXPERIMENTS, list(argv) if argv and argv[0] == "experiment" else (), "experiment")
