"""The ``[manager]`` table of a cluster spec: three manager replicas and dispatcher failover.

::

    [manager]
    hosts = ["m1", "m2", "m3"]     # one replica per host (default: the first host, three times)
    standby_dispatcher = "fe2"     # optional: a standby dispatcher on this host
    journal_dir = "runs/x/manager" # default: RUN_DIR/manager
    preferred_leader = "manager-1" # optional: that replica leads after start-up
    password = "..."               # required when the hosts' addresses are not loopback
    heartbeat_interval_s = 0.03    # ... and any other ManagerConfig option

With a ``[manager]`` table every frontend, worker and dispatcher learns the active
dispatcher from the manager (``manager``), and the replicas start first.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from keel.common import config as cfg
from keel.common.roles import from_dict
from keel.common.spec.ports import Ports
from keel.common.spec.tables import SpecError, Table, fail, options
from keel.common.spec.topology import ServiceLaunch

FOLLOWERS = ("frontend", "worker", "dispatcher")


def read_manager(table: Table, hosts_of, first_host: str) -> dict[str, Any]:
    """The ``[manager]`` table's placement and options."""
    placement = hosts_of(table, "hosts", [first_host] * 3)
    if len(placement) not in (3, 5):
        fail(table.key("hosts"), f"a manager group has 3 (or 5) replicas, got {len(placement)}")
    standby = table.take("standby_dispatcher", str, None)
    if standby is not None:
        hosts_of(Table({"standby_dispatcher": [standby]}, table.path), "standby_dispatcher", [])
    journal_dir = table.take("journal_dir", str, None)
    preferred = table.take("preferred_leader", str, None)
    names = [f"manager-{i + 1}" for i in range(len(placement))]
    if preferred is not None and preferred not in names:
        fail(table.key("preferred_leader"), f"must name a replica: {names}")
    return {"hosts": placement, "standby_dispatcher": standby, "journal_dir": journal_dir,
            "preferred_leader": preferred, "options": options("manager", table)}


def wire_manager(services: list[ServiceLaunch], hosts: dict[str, str], ports: Ports, manager: dict[str, Any],
                 run_dir: str) -> None:
    """Add the replicas (first) and the standby dispatcher; point every follower at them."""
    placement = manager["hosts"]
    names = [f"manager-{i + 1}" for i in range(len(placement))]
    raft, control, publish = [], [], []
    for name, host in zip(names, placement):
        address = hosts[host]
        raft.append(f"{address}:{ports.take(address, name)}")
        control.append(ports.tcp(address, name))
        publish.append(ports.tcp(address, name))
    journal_dir = manager["journal_dir"] or f"{run_dir}/manager"
    replicas = []
    for i, (name, host) in enumerate(zip(names, placement)):
        data = {**manager["options"], "name": name, "raft_address": raft[i], "endpoint": control[i],
                "publish_endpoint": publish[i], "journal_file": f"{journal_dir}/{name}.journal",
                "raft_partners": {raft[j]: control[j] for j in range(len(names)) if j != i}}
        if manager["preferred_leader"]:
            data["preferred_leader"] = raft[names.index(manager["preferred_leader"])]
        try:
            replicas.append(ServiceLaunch(name, "manager", host, from_dict("manager", data)))
        except cfg.ConfigError as exc:
            raise SpecError(f"manager: {exc}") from None
    link = {"manager": cfg.ManagerLinkConfig(control, publish)}
    for svc in services:
        if svc.role in FOLLOWERS:
            svc.config = dataclasses.replace(svc.config, **link)
            if svc.role == "dispatcher":
                svc.config.host = svc.host
    standby = manager["standby_dispatcher"]
    if standby is not None:
        active = next(s for s in services if s.role == "dispatcher")
        address = hosts[standby]
        config = dataclasses.replace(
            active.config, name="dispatcher-b", host=standby, standby=True,
            query_endpoint=ports.hop(address, "dispatcher-b"), worker_endpoint=ports.hop(address, "dispatcher-b"))
        services.insert(services.index(active) + 1, ServiceLaunch("dispatcher-b", "dispatcher", standby, config))
    services[:0] = replicas
