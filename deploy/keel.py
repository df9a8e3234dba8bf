"""``keel``: the command line of Keel.

Run ``keel --help`` for the list; every subcommand has its own ``--help``.

Example
-------
::

    keel demo                       # train if needed, serve digits-mlp, send queries, report
    keel up deploy/examples/local.toml && keel status deploy/examples/local.toml
    keel bench core --quick --json runs/bench-core.json
"""
from __future__ import annotations

import argparse
import sys


def _serve(args: argparse.Namespace) -> int:
    from services.serve import main

    return main([args.role, "--config", args.config] + (["--curve", args.curve] if args.curve else []))


def _demo(args: argparse.Namespace) -> int:
    from deploy.demo import run

    return run(args)


def _bench(args: argparse.Namespace) -> int:
    if args.what == "core":
        from bench.core import run

        run(args.json, args.quick)
    elif args.what == "gateway":
        from bench.gateway import run

        run(args.json, args.quick)
    elif args.what == "manager":
        from bench.manager import run as run_manager

        return run_manager(args.json, args.quick)
    else:
        from bench.codec import run

        run(args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from bench.hams_overhead import add_parser as add_hams_overhead
    from bench.hams_recovery import add_parser as add_hams_recovery
    from bench.hams_timeline import add_parser as add_hams_timeline
    from bench.kairos_experiment import add_parser as add_kairos_experiment
    from bench.selection_experiment import add_parser as add_selection_experiment
    from bench.serf_drift import add_parser as add_serf_drift
    from bench.serf_experiment import add_parser as add_serf_experiment
    from chaos.cli import add_parser as add_chaos
    from chaos.parm_tail import add_parser as add_parm_tail
    from common.roles import ROLES
    from deploy.cli import add_parser as add_deploy
    from deploy.kairos_cli import add_parser as add_kairos
    from deploy.keys_cli import add_parser as add_keys
    from deploy.manager_cli import add_parser as add_manager
    from deploy.model_cli import add_parser as add_model
    from deploy.selection_cli import add_parser as add_selection
    from deploy.serf_cli import add_parser as add_serf
    from training.cli import add_parser as add_training

    parser = argparse.ArgumentParser(prog="keel", description="Keel: prediction serving with flat tail latency")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="the main job: train if needed, serve, send queries, report, shut down")
    p.add_argument("--store", default="store", help="model store (default: %(default)s)")
    p.add_argument("--queries", type=int, default=3000, help="queries to send (default: %(default)s)")
    p.add_argument("--rate", type=float, default=800.0, help="Poisson arrival rate, queries/s (default: %(default)s)")
    p.add_argument("--workers", type=int, default=4, help="deployed-model workers (default: %(default)s)")
    p.add_argument("--no-parm", action="store_true", help="skip the ParM part (slowed worker, reconstructions)")
    p.add_argument("--run-dir", default="runs/demo", help="supervisord files and logs (default: %(default)s)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("serve", help="run one service process (what supervisord and the chaos harness start)")
    p.add_argument("role", choices=list(ROLES))
    p.add_argument("--config", required=True, help="the role's config as JSON, or @FILE")
    p.add_argument("--curve", metavar="DIR", help="CURVE on every socket with the keys in DIR (keel keys generate)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("bench", help="benchmarks: print a table and write JSON")
    p.add_argument("what", choices=["core", "codec", "gateway", "manager"])
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--quick", action="store_true", help="shorter runs")
    p.set_defaults(func=_bench)

    add_deploy(sub)
    add_training(sub)
    add_chaos(sub)
    p = sub.add_parser("experiment", help="experiments that take minutes (not part of the test suite): table, JSON, plots")
    which = p.add_subparsers(dest="experiment", required=True)
    add_parm_tail(which)
    add_kairos_experiment(which)
    add_hams_overhead(which)
    add_hams_recovery(which)
    add_hams_timeline(which)
    add_selection_experiment(which)
    add_serf_experiment(which)
    add_serf_drift(which)
    add_kairos(sub)
    add_model(sub)
    add_keys(sub)
    add_manager(sub)
    add_selection(sub)
    add_serf(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
