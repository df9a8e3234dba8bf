"""``keel bench`` and ``keel experiment``: the benchmarks and experiments, found by the
``keel`` command through the ``keel.commands`` entry points (pyproject.toml), so the
serving commands never import them.

This module imports nothing heavy: a benchmark or experiment module is imported only
when its command is the one being run (or ``keel experiment --help`` lists them all).

``EXPERIMENTS`` is the one registry of ``keel experiment``: each module there has
``add_parser(which)``, which adds its subcommand, options and function.
"""
from __future__ import annotations

import argparse
import importlib
from importlib.util import find_spec
from collections.abc import Sequence
from typing import Any

#: experiment name -> the module whose ``add_parser(which)`` adds it
EXPERIMENTS: dict[str, str] = {
    "parm-tail": "keel.chaos.parm_tail",
    "kairos": "keel.bench.kairos_experiment",
    "hams-overhead": "keel.bench.hams_overhead",
    "hams-recovery": "keel.bench.hams_recovery",
    "hams-timeline": "keel.bench.hams_timeline",
    "selection": "keel.bench.selection_experiment",
    "serf": "keel.bench.serf_experiment",
    "serf-drift": "keel.bench.serf_drift",
}

#: benchmark name -> module with ``run(json_path, quick)``
BENCHMARKS: dict[str, str] = {
    "core": "keel.bench.core",
    "erasure": "keel.bench.erasure",
    "gateway": "keel.bench.gateway",
    "manager": "keel.bench.manager",
}


def _needs_extra() -> None:
    if find_spec("matplotlib") is None:
        raise SystemExit("keel: benchmarks and experiments need the bench extra: pip install 'keel[bench]'")


def _bench(args: argparse.Namespace) -> int:
    _needs_extra()
    module = importlib.import_module(BENCHMARKS[args.what])
    if args.what == "erasure":
        module.run(args.json)
        return 0
    out = module.run(args.json, args.quick)
    return out if isinstance(out, int) else 0


def add_bench(subparsers: Any, argv: Sequence[str] = ()) -> None:
    p = subparsers.add_parser("bench", help="benchmarks: print a table and write JSON")
    p.add_argument("what", choices=list(BENCHMARKS))
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--quick", action="store_true", help="shorter runs")
    p.set_defaults(func=_bench)


def add_experiment(subparsers: Any, argv: Sequence[str] = ()) -> None:
    p = subparsers.add_parser("experiment", help="experiments that take minutes (not part of the test suite): "
                              "table, JSON, plots")
    if not argv or argv[0] != "experiment":
        return  # another command runs: import no experiment
    _needs_extra()
    which = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    named = [name for name in EXPERIMENTS if name in argv[1:2]]
    for name in named or EXPERIMENTS:
        importlib.import_module(EXPERIMENTS[name]).add_parser(which)
