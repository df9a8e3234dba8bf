"""``keel keys generate DIR``: CURVE keys for a cluster (``common.curve``).

Writes the service keypair, the operators' keypair (``operator``: what ``keel up``,
``status``, ``predict`` and ``model rollout`` talk to the cluster with), one keypair per
client (``--client NAME``, repeatable; default ``client``) and ``DIR/allowed/`` with their
public keys; secret files are 0600, the folder 0700. A second run keeps what is there and
adds what is missing. ``use_for_spec`` gives the commands that talk to a
cluster its keys. Point a spec at it with ``[cluster] curve_keys = "DIR"`` and give
clients ``Client(..., curve_keys="DIR", curve_name=NAME)``. To shut a client out, remove
its ``.key`` from ``DIR/allowed`` on the service hosts: handshakes read the folder.
"""
from __future__ import annotations

import argparse
from typing import Any

from keel.common.spec.tables import SpecError


def use_for_spec(spec) -> None:
    """CURVE keys for talking to ``spec``'s cluster (imports ZeroMQ only when called); a
    keys folder that lacks them is a ``SpecError`` of ``cluster.curve_keys``."""
    from keel.common.curve import CurveError, use_for_spec as use

    try:
        use(spec)
    except CurveError as exc:
        raise SpecError(f"cluster.curve_keys: {exc}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from keel.common.curve import generate

    for path in generate(args.dir, tuple(args.client or ["client"])):
        print(f"{oct(path.stat().st_mode & 0o777)[2:]}  {path}")
    return 0


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("keys", help="CURVE keys for encrypted, allow-listed sockets")
    which = p.add_subparsers(dest="keys_command", required=True)
    g = which.add_parser("generate", help="write the service keypair, the operators' keypair, client keypairs and the allow-list")
    g.add_argument("dir", help="keys folder (created 0700)")
    g.add_argument("--client", action="append", metavar="NAME", help="a client keypair to make (repeatable; default: client)")
    g.set_defaults(func=cmd_generate)
