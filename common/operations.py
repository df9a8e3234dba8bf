"""How one process is operated on its host: the address its TCP endpoints bind when it
is not the one they advertise, the address its metrics and health port binds, and its
log level. ``keel serve`` takes them as flags, which a cluster spec fills in per
service (``common.spec.operations``); a process built in-process keeps the defaults
(advertised address, loopback metrics, info).

Example
-------
>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_arguments(parser)
>>> parser.parse_args(["--log-level", "debug"]).log_level
'debug'
"""
from __future__ import annotations

import argparse

from keel.common import logs, metrics, transport


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", metavar="ADDRESS", default=None,
                        help="bind TCP endpoints on ADDRESS (0.0.0.0 or * for all) while advertising the config's")
    parser.add_argument("--metrics-address", metavar="ADDRESS", default=None,
                        help="the address the metrics and health port binds (default 127.0.0.1)")
    parser.add_argument("--log-level", choices=list(logs.LEVELS), default=None, help="log level (default info)")


def apply(args: argparse.Namespace) -> None:
    """Set this process's bind address, metrics address and log level from ``args``."""
    if args.bind:
        transport.BIND_ADDRESS = args.bind
    if args.metrics_address:
        metrics.ADDRESS = args.metrics_address
    if args.log_level:
        logs.LEVEL = logs.LEVELS[args.log_level]
