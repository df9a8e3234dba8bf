"""How one process is operated on its host: the address its TCP endpoints bind when it
is not the one they advertise, the address its metrics and health port binds, its log
level, and the share of requests it traces (OpenTelemetry, ``common.tracing``). ``keel serve`` takes them as flags, which a cluster spec fills in per
service (``common.spec.operations``); a process built in-process keeps the defaults
(advertised address, loopback metrics, info).

Example
-------
>>> import argparse
import os
>>> parser = argparse.ArgumentParser()
>>> add_arguments(parser)
>>> parser.parse_args(["--log-level", "debug"]).log_level
'debug'
"""
from __future__ import annotations

import argparse
import os

from keel.common import logs  # not metrics, transport: `keel --help` imports this, and no ZeroMQ


#: flag -> the environment variable that gives its default (systemd units, pods)
ENV = {"bind": "KEEL_BIND", "metrics_address": "KEEL_METRICS_ADDRESS", "log_level": "KEEL_LOG_LEVEL",
       "trace_rate": "KEEL_TRACE_RATE", "trace_endpoint": "KEEL_TRACE_ENDPOINT"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = {flag: os.environ.get(name) or None for flag, name in ENV.items()}
    parser.add_argument("--bind", metavar="ADDRESS", default=env["bind"],
                        help="bind TCP endpoints on ADDRESS (0.0.0.0 or * for all) while advertising the config's "
                             "(env KEEL_BIND)")
    parser.add_argument("--metrics-address", metavar="ADDRESS", default=env["metrics_address"],
                        help="the address the metrics and health port binds (default 127.0.0.1; env KEEL_METRICS_ADDRESS)")
    parser.add_argument("--log-level", choices=list(logs.LEVELS), default=env["log_level"],
                        help="log level (default info; env KEEL_LOG_LEVEL)")
    parser.add_argument("--trace-rate", type=float, metavar="R", default=float(env["trace_rate"] or 0),
                        help="OpenTelemetry: the share of requests traced, 0..1 (default 0: off; env KEEL_TRACE_RATE)")
    parser.add_argument("--trace-endpoint", metavar="URL", default=env["trace_endpoint"],
                        help="OTLP/HTTP traces endpoint (default: the exporter's, localhost:4318; env KEEL_TRACE_ENDPOINT)")


def environment(svc) -> dict[str, str]:
    """The environment variables that give ``svc`` (a ``ServiceLaunch``) its bind
    address, metrics address and log level, for a launcher that passes no flags."""
    values = {"bind": svc.bind, "metrics_address": svc.metrics_address, "log_level": svc.log_level,
              "trace_rate": svc.trace_rate and str(svc.trace_rate), "trace_endpoint": svc.trace_endpoint}
    return {ENV[k]: v for k, v in values.items() if v}


def apply(args: argparse.Namespace) -> None:
    """Set this process's bind address, metrics address and log level from ``args``."""
    from keel.common import metrics, transport

    if args.bind:
        transport.BIND_ADDRESS = args.bind
    if args.metrics_address:
        metrics.ADDRESS = args.metrics_address
    if args.log_level:
        logs.LEVEL = logs.LEVELS[args.log_level]
    if args.trace_rate:
        from keel.common import tracing

        tracing.configure(args.trace_rate, args.trace_endpoint)
