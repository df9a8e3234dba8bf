"""Port allocation of a cluster spec: sequential per address, so services sharing an
address never collide; metrics ports from their own base, checked against the endpoints.

A hop between two of the cluster's own services (``Ports.hop``) is a ZeroMQ ``ipc``
endpoint when the whole cluster is on one machine: an abstract Unix socket (Linux; no
file, gone with its process, a second bind of the name refused as a port's is), named
after the cluster and the port the hop would have had: it skips the kernel's TCP path
(docs/results/core.md: 6% less CPU a request, one at a time). What clients and the
operator reach (client, status, manager, store endpoints) stays TCP."""
from __future__ import annotations

import hashlib
import ipaddress

from keel.common.spec.tables import SpecError, fail


class Ports:
    """Sequential ports per address, from ``base``; ``ipc``: a name for the cluster's
    hops on one machine (``ipc_name``), None for TCP hops."""

    def __init__(self, base: int, ipc: str | None = None):
        self.base, self.next, self.ipc = base, {}, ipc

    def take(self, address: str, owner: str) -> int:
        port = self.next.get(address, self.base)
        self.next[address] = port + 1
        if port > 65535:
            raise SpecError(f"cluster.base_port: ports on {address} run past 65535 at {owner}")
        return port

    def tcp(self, address: str, owner: str) -> str:
        return f"tcp://{address}:{self.take(address, owner)}"

    def hop(self, address: str, owner: str) -> str:
        """An endpoint only the cluster's own services connect to: ``ipc`` on one
        machine, else TCP. It takes a port either way, so the rest are numbered alike."""
        port = self.take(address, owner)
        return f"ipc://@keel-{self.ipc}-{port}" if self.ipc else f"tcp://{address}:{port}"

    def local(self, endpoint: str) -> str:
        """What a client on this machine connects to for the TCP ``endpoint`` the cluster
        binds: its ``ipc`` twin (named by its port) on one machine, else the endpoint."""
        return f"ipc://@keel-{self.ipc}-{endpoint.rsplit(':', 1)[1]}" if self.ipc else endpoint

    def last(self) -> int:
        return max(self.next.values(), default=self.base) - 1


def assign_metrics_ports(services: list, hosts: dict[str, str], metrics_base: int, endpoints: Ports) -> None:
    """Give every service a metrics port from ``metrics_base``, per address; one that
    lands on an endpoint port is an error of ``cluster.metrics_base_port``."""
    metrics = Ports(metrics_base)
    bound = {(hosts[s.host], int(ep.rsplit(":", 1)[1])) for s in services for ep in s.endpoints() if ep.startswith("tcp://")}
    for svc in services:
        address = hosts[svc.host]
        port = svc.config.metrics_port = metrics.take(address, svc.name)
        if (address, port) in bound:
            fail("cluster.metrics_base_port", f"{svc.name}'s metrics port {port} collides with an endpoint port "
                 f"on {address}; endpoints use {endpoints.base}..{endpoints.last()}")


def ipc_name(name: str, run_dir: str, addresses: list[str]) -> str | None:
    """The name the hops of a cluster on one machine share (see the module's docstring),
    or None when they go over TCP: hosts on more than one address (or one that is not
    loopback: a service on another machine may join it). Unique per cluster: its name
    and a digest of its run folder and address, so two clusters with their own run
    folders never meet, as two with the same ports would not on TCP either."""
    if len(set(addresses)) != 1 or not _loopback(addresses[0]):
        return None
    digest = hashlib.sha1(f"{run_dir}|{addresses[0]}".encode()).hexdigest()[:10]
    return f"{name[:40]}-{digest}"


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
