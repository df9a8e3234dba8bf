"""A group of manager replicas as real processes on this host (tests, the manager
benchmark, the HAMS experiments): ``LocalGroup``."""
from __future__ import annotations

import signal
from pathlib import Path

from keel.common.control import ManagerClient, replica_configs
from keel.common.spec import ServiceLaunch
from keel.common.waiting import wait_until
from keel.deploy.local import Launcher, free_port_block


class LocalGroup:
    """``n`` manager replicas as processes of ``launcher`` (journals under ``journal_dir``)."""

    def __init__(self, launcher: Launcher, journal_dir: str | Path, n: int = 3, ports: list[int] | None = None,
                 ctx=None, **options):
        self.launcher, self.ctx = launcher, ctx  # ctx: the ZeroMQ context the probes ask from
        self.ports = ports or _free_ports(3 * n)
        names = [f"manager-{i + 1}" for i in range(n)]  # each replica on the launcher's address for it
        self.cfgs = replica_configs(self.ports, journal_dir=str(journal_dir), names=names,
                                    hosts=[launcher.address_of(name) for name in names], **options)
        self.names = [c.name for c in self.cfgs]
        self.endpoints = [c.endpoint for c in self.cfgs]
        self.publish_endpoints = [c.publish_endpoint for c in self.cfgs]
        self.probe = ManagerClient(self.endpoints, ctx=ctx)

    def close(self) -> None:
        """Close the probe's sockets (the processes are the launcher's to stop)."""
        self.probe.close()

    def start(self, i: int | None = None) -> None:
        for j in range(len(self.cfgs)) if i is None else [i]:
            self.launcher.killed.discard(self.names[j])
            self.launcher.start(ServiceLaunch(self.names[j], "manager", "local", self.cfgs[j]))

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        self.launcher.kill(self.names[i], sig)

    def alive(self, i: int) -> bool:
        proc = self.launcher.procs.get(self.names[i])
        return proc is not None and proc.poll() is None

    def client(self, **kwargs) -> ManagerClient:
        return ManagerClient(self.endpoints, **{"ctx": self.ctx, **kwargs})

    def infos(self, timeout_s: float = 0.3) -> list[dict | None]:
        return [self.probe.ask(e, "leader", timeout_s=timeout_s) if self.alive(i) else None
                for i, e in enumerate(self.endpoints)]

    def leader(self, timeout_s: float = 10.0) -> int:
        """The index of the replica that leads and that every live replica names."""
        def agreed() -> int | None:
            infos = self.infos()
            leaders = [i for i, info in enumerate(infos) if info and info["is_leader"]]
            named = {info["leader"] for info in infos if info}
            if len(leaders) == 1 and named == {self.endpoints[leaders[0]]}:
                return leaders[0] + 1
            return None

        found = wait_until(agreed, timeout_s, interval_s=0.02)
        if not found:
            raise TimeoutError(f"no agreed leader in {timeout_s} s: {self.infos()}; logs in {self.launcher.log_dir}")
        return found - 1

    def snapshots(self) -> list[dict | None]:
        return [self.probe.ask(e, "snapshot", timeout_s=1.0) if self.alive(i) else None
                for i, e in enumerate(self.endpoints)]

    def wait_equal(self, timeout_s: float = 10.0) -> bool:
        """Whether every live replica reports the same state within ``timeout_s``."""
        def equal() -> bool:
            snaps = [s for i, s in enumerate(self.snapshots()) if self.alive(i)]
            return bool(snaps) and None not in snaps and all(s == snaps[0] for s in snaps)

        return bool(wait_until(equal, timeout_s, interval_s=0.05))


def _free_ports(n: int) -> list[int]:
    """Below the ephemeral range: a port picked there can be taken by an outgoing connection
    before the replica binds it."""
    base = free_port_block(n)
    return list(range(base, base + n))
