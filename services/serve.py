"""Start one Keel process: ``python -m keel.services.serve ROLE --config JSON``.

ROLE is a role of common.roles.ROLES; JSON is the role's config (see common.config).
supervisord, systemd and the chaos harness all start services this way.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

import orjson
import zmq

from keel.common import operations
from keel.common.config import ConfigError
from keel.common.roles import from_dict
from keel.common.roles import role as role_of
from keel.services.base import BindError, catch_signals_early


def build(role: str, cfg):
    """The process of ``role`` (a row of ``common.roles.ROLES``) for ``cfg``."""
    return role_of(role).build(cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="keel serve", description=__doc__.splitlines()[0])
    parser.add_argument("role")
    parser.add_argument("--config", required=True, help="the role's config as JSON, or @FILE")
    parser.add_argument("--curve", default=os.environ.get("KEEL_CURVE_KEYS") or None, metavar="DIR",
                        help="CURVE on every socket with the keys in DIR (keel keys generate; env KEEL_CURVE_KEYS)")
    operations.add_arguments(parser)
    args = parser.parse_args(argv)
    catch_signals_early()
    operations.apply(args)
    raw = args.config
    if raw.startswith("@"):
        with open(raw[1:], "rb") as f:
            raw = f.read()
    try:
        cfg = from_dict(args.role, orjson.loads(raw))
    except (ConfigError, orjson.JSONDecodeError) as exc:
        print(f"keel serve {args.role}: bad config: {exc}", file=sys.stderr)
        return 2
    if args.curve:
        from keel.common import curve

        try:
            curve.use(args.curve)
        except curve.CurveError as exc:
            print(f"keel serve {args.role}: {exc}", file=sys.stderr)
            return 2
    from keel.common.containers import DeviceError

    if args.role == "worker" and cfg.store_endpoints and cfg.builtin is None:
        from keel.common import logs
        from keel.common.modelfetch import StoreUnreachable, fetch_for_worker
        from keel.services import base

        try:  # the version first, from the store service, checked; the worker registers only after
            fetch_for_worker(cfg, logs.setup(cfg.name).info, stop=lambda: base._early_signals > 0)
        except StoreUnreachable:  # stopped while waiting: nothing was started
            return 0
    try:
        service = build(args.role, cfg)
        service.run()
    except DeviceError as exc:  # a spec asking for hardware this host lacks: say so, once
        print(f"keel serve {args.role}: {exc}", file=sys.stderr)
        return 2
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise
        print(f"keel serve {args.role}: {_bind_error(cfg, str(exc))}", file=sys.stderr)
        return 2
    except BindError as exc:
        print(f"keel serve {args.role}: {exc}", file=sys.stderr)
        return 2
    return 0


def _bind_error(cfg, text: str) -> BindError:
    """The address a ZeroMQ bind found taken (pyzmq names it in its message) and the config
    option that holds it."""
    found = re.search(r"\(addr='([^']*)'\)", text)
    address = found.group(1) if found else "an address"
    option = next((f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) == address), "its endpoint options")
    return BindError(address, option)


if __name__ == "__main__":
    sys.exit(main())
