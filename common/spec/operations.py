"""What a cluster spec says about operating it across hosts: the address each host's
services bind beside the one they advertise, the address metrics and health ports bind,
and each service's log level.

- ``[hosts]``: ``a = "10.0.0.5"`` (bind and advertise the same address), or
  ``a = { address = "203.0.113.5", bind = "0.0.0.0" }``: the endpoints others connect
  to name ``address`` (a NAT's public side, a pod's Service name, a container's host
  port), while a's services bind ``bind`` (``keel serve --bind``; ``common.transport``
  puts it in each TCP bind, so CURVE and every endpoint a message names stay as they were).
- Metrics ports (``[cluster] metrics_base_port``) bind loopback on a cluster of one
  machine, else the host's bind address (its address when none): a Prometheus on
  another host scrapes them (``keel serve --metrics-address``).
- ``[logs]``: ``level = "info"`` for every service, and a level per role or per
  service name (``worker = "debug"``, ``"worker-m-0" = "debug"``); the name wins over
  the role (``keel serve --log-level``).
- ``[tracing]``: ``rate`` and ``endpoint`` of OpenTelemetry traces, for every service
  (``keel serve --trace-rate --trace-endpoint``; ``common.tracing``).

The ``[hosts]`` entries themselves are read by ``common.spec.hosts``.
"""
from __future__ import annotations

from typing import Any

from keel.common.logs import LEVELS
from keel.common.spec.ports import _loopback
from keel.common.spec.tables import Table, fail



def metrics_address(address: str, bind: str | None, one_machine: bool) -> str | None:
    """The address a service's metrics port binds: None (``common.metrics``'s loopback
    default) on a cluster of one machine, else the host's bind address or its address."""
    if one_machine and _loopback(address):
        return None
    where = bind or address
    return "0.0.0.0" if where == "*" else where


def read_logs(table: Table) -> dict[str, str]:
    """``[logs]``: ``level`` (every service's) and role or service name -> level; each
    checked against ``LEVELS`` (which names exist, once the services are wired: ``apply``)."""
    out = {}
    for key in list(table.data):
        level = table.take(key, str).lower()
        if level not in LEVELS:
            fail(table.key(key), f"must be one of {list(LEVELS)}, got {level!r}")
        out[key] = level
    return out


def read_tracing(table: Table) -> tuple[float | None, str | None]:
    """``[tracing]``: ``rate`` (the share of requests traced, 0..1; 0 = off) and
    ``endpoint`` (OTLP/HTTP, e.g. ``http://collector:4318/v1/traces``)."""
    rate = table.take("rate", float, 0.0)
    endpoint = table.take("endpoint", str, None)
    table.finish()
    if not 0 <= rate <= 1:
        fail(table.key("rate"), f"must be in 0..1, got {rate}")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        fail(table.key("endpoint"), f"must be an http:// or https:// URL (OTLP/HTTP), got {endpoint!r}")
    return (rate or None), endpoint


def apply(services: list[Any], hosts: dict[str, str], binds: dict[str, str | None], logs: dict[str, str],
          tracing: tuple[float | None, str | None] = (None, None)) -> None:
    """Give each ``ServiceLaunch`` its bind address, metrics address, log level and tracing."""
    from keel.common.roles import ROLES

    one_machine = len(set(hosts.values())) == 1
    names = {s.name for s in services}
    for key in logs:
        if key != "level" and key not in names and key not in ROLES:
            fail(f"logs.{key}", f"not a role or a service of this spec; roles: {sorted(ROLES)}, "
                 f"services: {sorted(names)}")
    for svc in services:
        svc.bind = binds.get(svc.host)
        svc.metrics_address = metrics_address(hosts[svc.host], svc.bind, one_machine)
        level = logs.get(svc.name) or logs.get(svc.role) or logs.get("level")
        svc.log_level = None if level in (None, "info") else level
        svc.trace_rate, svc.trace_endpoint = tracing if tracing[0] else (None, None)
