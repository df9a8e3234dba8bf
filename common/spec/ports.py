"""Port allocation of a cluster spec: sequential per address, so services sharing an
address never collide; metrics ports from their own base, checked against the endpoints."""
from __future__ import annotations

from keel.common.spec.tables import SpecError, fail


class Ports:
    """Sequential ports per address, from ``base``."""

    def __init__(self, base: int):
        self.base, self.next = base, {}

    def take(self, address: str, owner: str) -> int:
        port = self.next.get(address, self.base)
        self.next[address] = port + 1
        if port > 65535:
            raise SpecError(f"cluster.base_port: ports on {address} run past 65535 at {owner}")
        return port

    def last(self) -> int:
        return max(self.next.values(), default=self.base) - 1


def assign_metrics_ports(services: list, hosts: dict[str, str], metrics_base: int, endpoints: Ports) -> None:
    """Give every service a metrics port from ``metrics_base``, per address; one that
    lands on an endpoint port is an error of ``cluster.metrics_base_port``."""
    metrics = Ports(metrics_base)
    bound = {(hosts[s.host], int(ep.rsplit(":", 1)[1])) for s in services for ep in s.endpoints()}
    for svc in services:
        address = hosts[svc.host]
        port = svc.config.metrics_port = metrics.take(address, svc.name)
        if (address, port) in bound:
            fail("cluster.metrics_base_port", f"{svc.name}'s metrics port {port} collides with an endpoint port "
                 f"on {address}; endpoints use {endpoints.base}..{endpoints.last()}")
