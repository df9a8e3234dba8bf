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
from collections.abc import Sequence

from keel.common.spec.tables import SpecError


def _serve(args: argparse.Namespace) -> int:
    from keel.services.serve import main

    flags = (("--curve", args.curve), ("--bind", args.bind), ("--metrics-address", args.metrics_address),
             ("--log-level", args.log_level), ("--trace-rate", args.trace_rate and str(args.trace_rate)),
             ("--trace-endpoint", args.trace_endpoint))
    return main([args.role, "--config", args.config] + [x for flag, value in flags if value for x in (flag, value)])


def _demo(args: argparse.Namespace) -> int:
    from keel.deploy.demo import run

    return run(args)


#: the entry-point group through which layers above deploy (benchmarks, experiments, the
#: chaos harness) add their commands: each names ``add(subparsers, argv)``
PLUGINS = "keel.commands"


def _add_plugins(sub, argv: Sequence[str]) -> None:
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=PLUGINS), key=lambda e: e.name):
        try:
            add = ep.load()
        except ImportError as exc:  # an extra that is not installed
            sub.add_parser(ep.name, help=f"not available here: {exc}")
            continue
        add(sub, list(argv))


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The ``keel`` parser; ``argv`` (the command line to parse) lets a plug-in import only
    what the chosen command needs."""
    from keel.common import operations
    from keel.common.roles import ROLES
    from keel.deploy.cli import add_parser as add_deploy
    from keel.deploy.kairos_cli import add_parser as add_kairos
    from keel.deploy.keys_cli import add_parser as add_keys
    from keel.deploy.manager_cli import add_parser as add_manager
    from keel.deploy.model_cli import add_parser as add_model
    from keel.deploy.selection_cli import add_parser as add_selection
    from keel.deploy.serf_cli import add_parser as add_serf
    from keel.training.cli import add_parser as add_training

    from keel import __version__

    parser = argparse.ArgumentParser(prog="keel", description="Keel: prediction serving with flat tail latency")
    parser.add_argument("--version", action="version", version=f"keel {__version__}")
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
    operations.add_arguments(p)
    p.set_defaults(func=_serve)

    add_deploy(sub)
    add_training(sub)
    _add_plugins(sub, argv)
    add_kairos(sub)
    add_model(sub)
    add_keys(sub)
    add_manager(sub)
    add_selection(sub)
    add_serf(sub)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed by the parser built for it."""
    return build_parser(argv).parse_args(list(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    code = 0
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away (`keel status | head`) is noticed here
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SpecError as exc:  # a spec or keys folder at fault, from any command: one line
        print(f"keel: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # Nobody reads the rest: stop quietly, and keep the interpreter's own last flush
        # at exit from failing on the same pipe.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return code


if __name__ == "__main__":
    sys.exit(main())
