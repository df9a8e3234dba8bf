"""``keel experiment NAME``: experiments that take minutes (not part of the test suite)."""
from __future__ import annotations

import argparse
from typing import Any


def _parm_tail(args: argparse.Namespace) -> int:
    from services.parm_tail import run

    return run(args)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("experiment", help="longer experiments: print a table and write JSON")
    which = p.add_subparsers(dest="experiment", required=True)
    e = which.add_parser("parm-tail", help="ParM §6: tail latency of parm vs equal resources under background shuffles")
    e.add_argument("--json", help="write the figures here")
    e.add_argument("--quick", action="store_true", help="shorter run (under 3 minutes)")
    e.add_argument("--shuffles", type=int, nargs="+", default=None, help="concurrent shuffles to run (default: 4, and 2 and 5 unless --quick)")
    e.add_argument("--local", action="store_true", help="processes on loopback instead of network namespaces")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--rate", type=float, default=100.0, help="Poisson arrival rate, queries/s (default: %(default)s)")
    e.add_argument("--link-mbit", type=float, default=50.0, help="tbf limit of each host's link (default: %(default)s)")
    e.set_defaults(func=_parm_tail)
