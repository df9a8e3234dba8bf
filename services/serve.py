"""Start one Keel process: ``python -m keel.services.serve ROLE --config JSON``.

ROLE is a role of common.roles.ROLES; JSON is the role's config (see common.config).
supervisord, systemd and the chaos harness all start services this way.
"""
from __future__ import annotations

import argparse
import os
import sys

import orjson

from keel.common.config import ConfigError
from keel.common.roles import from_dict
from keel.common.roles import role as role_of


def build(role: str, cfg):
    """The process of ``role`` (a row of ``common.roles.ROLES``) for ``cfg``."""
    return role_of(role).build(cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="keel serve", description=__doc__.splitlines()[0])
    parser.add_argument("role")
    parser.add_argument("--config", required=True, help="the role's config as JSON, or @FILE")
    parser.add_argument("--curve", default=os.environ.get("KEEL_CURVE_KEYS") or None, metavar="DIR",
                        help="CURVE on every socket with the keys in DIR (keel keys generate; env KEEL_CURVE_KEYS)")
    args = parser.parse_args(argv)
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

    try:
        service = build(args.role, cfg)
    except DeviceError as exc:  # a spec asking for hardware this host lacks: say so, once
        print(f"keel serve {args.role}: {exc}", file=sys.stderr)
        return 2
    service.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
