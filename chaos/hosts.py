"""Named hosts that run processes and take faults: network namespaces, or loopback groups.

In netns mode (root with ``ip netns``) a host is a network namespace on a bridge with a
``tbf``-limited link (``chaos.netns``); a process runs inside it through
``ip netns exec``. In local mode a host is a group of processes on its own loopback
address (127.213.C.N, so that hosts never collide on ports); partitions and link limits
need namespaces and raise ``Unsupported`` there.

Every process is started in its own process group, logged to ``run_dir/logs/HOST/``,
and recorded in the run's ``Registry`` before anything else can fail. A host's faults
act on its ``service``, ``aux`` and ``shuffle`` processes; ``proxy`` processes are part
of the network, not of the host, and survive a host kill.

Example
-------
>>> cluster = Cluster(["a", "b"], run_dir=Path("runs/x"))          # doctest: +SKIP
>>> cluster.spawn("b", [sys.executable, "-m", "keel.chaos.probes", "echo", "--port", "9000"], "echo")  # doctest: +SKIP
>>> cluster.kill_host("b")                                          # doctest: +SKIP
>>> cluster.close()                                                 # doctest: +SKIP
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.chaos.netns import Network, in_netns
from keel.chaos.resources import ChaosError, Registry, alive, clean_stale, have_netns, list_netns
from keel.deploy.local import Launcher

#: kinds of process a host fault acts on
HOST_KINDS = ("service", "aux", "shuffle")


class Unsupported(ChaosError):
    """The fault needs network namespaces and this cluster runs on loopback."""


@dataclass
class Proc:
    name: str
    host: str
    kind: str
    argv: list[str]
    popen: subprocess.Popen
    log: Path
    start: int | None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        """Not yet exited (a stopped process is running)."""
        return self.popen.poll() is None


@dataclass
class Host:
    name: str
    address: str
    ns: str | None
    procs: list[Proc] = field(default_factory=list)
    #: (name, argv) of the services ``restart`` brings back
    launches: list[tuple[str, list[str]]] = field(default_factory=list)
    frozen: bool = False


def resolve_netns(netns: bool | str | None) -> tuple[bool, str]:
    """``netns`` of a config ("auto", True, False) -> (use namespaces, why)."""
    can, why = have_netns()
    if netns in (None, "auto"):
        return can, why
    if netns is True or netns in ("true", "on"):
        if not can:
            raise ChaosError(f"netns mode asked for but unavailable: {why}")
        return True, why
    return False, "local mode asked for"


class Cluster:
    """Hosts of one deployment; ``close`` removes every process and namespace it made."""

    def __init__(self, hosts: list[str], *, run_dir: Path, netns: bool | str | None = "auto",
                 link_mbit: float | None = None, registry: Registry | None = None, tag: str = "",
                 local_index: int = 0, clean: bool = True):
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ChaosError(f"host names must be unique and non-empty: {hosts}")
        if clean:
            clean_stale()
        self.netns, self.netns_reason = resolve_netns(netns)
        self.run_dir = Path(run_dir)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.own_registry = registry is None
        self.registry = registry or Registry.create()
        self.lock = threading.RLock()
        self.all_procs: list[Proc] = []
        self.network: Network | None = None
        self.hosts: dict[str, Host] = {}
        #: host -> its ``chaos.supervised.SupervisedHost``: services there run under supervisord
        self.supervised: dict[str, Any] = {}
        self.link_mbit, self.local_index = link_mbit, local_index
        try:
            if self.netns:
                self.network = Network(self.registry, link_mbit=link_mbit, tag=tag)
                addresses = self.network.build(hosts)
                for h in hosts:
                    self.hosts[h] = Host(h, addresses[h], self.network.ns[h])
            else:
                for i, h in enumerate(hosts):
                    self.hosts[h] = Host(h, f"127.213.{local_index}.{i + 2}", None)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ queries
    @property
    def mode(self) -> str:
        return "netns" if self.netns else "local"

    @property
    def addresses(self) -> dict[str, str]:
        return {h.name: h.address for h in self.hosts.values()}

    def add_host(self, name: str) -> Host:
        """One more host (a namespace on the bridge, or the next loopback address)."""
        with self.lock:
            if name in self.hosts:
                raise ChaosError(f"host {name!r} exists")
            if self.network is not None:
                self.hosts[name] = Host(name, self.network.add_host(name), self.network.ns[name])
            else:
                self.hosts[name] = Host(name, f"127.213.{self.local_index}.{len(self.hosts) + 2}", None)
            return self.hosts[name]

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise ChaosError(f"no host {name!r}; hosts: {sorted(self.hosts)}") from None

    def processes(self, host: str, kinds: tuple[str, ...] = HOST_KINDS) -> list[Proc]:
        with self.lock:
            return [p for p in self.host(host).procs if p.kind in kinds and p.running()]

    # ------------------------------------------------------------------ processes
    def spawn(self, host: str, argv: list[str], name: str, kind: str = "service", restartable: bool | None = None,
              env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None) -> Proc:
        """Start ``argv`` on ``host`` in its own process group; logs to run_dir/logs/HOST/NAME.log."""
        h = self.host(host)
        log = self.run_dir / "logs" / host / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        full = ["ip", "netns", "exec", h.ns, *argv] if h.ns else list(argv)
        with self.lock, open(log, "ab") as out:
            popen = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                     cwd=cwd)  # a host's own folder: its run_dir and store, as on a machine
            self.registry.add_proc(popen.pid)
            proc = Proc(name, host, kind, list(argv), popen, log, self.registry.procs.get(popen.pid))
            h.procs.append(proc)
            self.all_procs.append(proc)
            if restartable if restartable is not None else kind == "service":
                if (name, list(argv)) not in h.launches:
                    h.launches.append((name, list(argv)))
        return proc

    def signal(self, proc: Proc, sig: int) -> bool:
        if not proc.running():
            return False
        try:
            os.killpg(proc.pid, sig)  # the group: the process and anything it forked
            return True
        except ProcessLookupError:
            return False

    def _reap(self, procs: list[Proc], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in procs if p.running()]
            if not left:
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        for p in procs:
            self.registry.remove_proc(p.pid)
        return True

    def stop(self, proc: Proc, grace_s: float = 2.0) -> None:
        """SIGTERM (after SIGCONT, in case it is frozen), then SIGKILL after ``grace_s``."""
        self.signal(proc, signal.SIGCONT)
        self.signal(proc, signal.SIGTERM)
        if not self._reap([proc], grace_s):
            self.signal(proc, signal.SIGKILL)
            self._reap([proc], 5.0)

    # ------------------------------------------------------------------ host faults
    def kill_host(self, host: str, wait: bool = True) -> list[int]:
        """SIGKILL every process of the host; returns their pids once all are gone (at once
        unless ``wait``: a load generator that kills mid-stream must not pause)."""
        procs = self.processes(host)
        for p in procs:
            self.signal(p, signal.SIGKILL)
        if wait and not self._reap(procs, 5.0):
            raise ChaosError(f"host {host}: processes {[p.pid for p in procs if p.running()]} survived SIGKILL")
        self.host(host).frozen = False
        return [p.pid for p in procs]

    def freeze_host(self, host: str) -> list[int]:
        procs = self.processes(host)
        for p in procs:
            self.signal(p, signal.SIGSTOP)
        self.host(host).frozen = True
        return [p.pid for p in procs]

    def thaw_host(self, host: str) -> list[int]:
        procs = self.processes(host)
        for p in procs:
            self.signal(p, signal.SIGCONT)
        self.host(host).frozen = False
        return [p.pid for p in procs]

    def restart_host(self, host: str) -> list[Proc]:
        """Kill what runs on the host, then start its services again with the same argv."""
        self.kill_host(host)
        return [self.spawn(host, argv, name, "service") for name, argv in list(self.host(host).launches)]

    # ------------------------------------------------------------------ link faults
    def _net(self, what: str) -> Network:
        if self.network is None:
            raise Unsupported(f"{what} needs netns mode ({self.netns_reason})")
        return self.network

    def partition(self, host: str) -> None:
        self._net("partition").partition(self.host(host).name)

    def heal(self, host: str) -> None:
        self._net("heal").heal(self.host(host).name)

    def set_link_limit(self, host: str, mbit: float | None) -> None:
        self._net("a tbf link limit").set_limit(self.host(host).name, mbit)

    # ------------------------------------------------------------------ probing
    def socket(self, host: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket that lives inside ``host``'s network (a plain one in local mode)."""
        h = self.host(host)
        sock = in_netns(h.ns, lambda: socket.socket(socket.AF_INET, kind))
        if h.ns is None:
            # bind to the host's own loopback address so peers see where it came from
            sock.bind((h.address, 0))
        return sock

    def connect(self, host: str, address: str, port: int, timeout: float = 2.0) -> socket.socket:
        sock = self.socket(host)
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
        except OSError:
            sock.close()
            raise
        return sock

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL), delete namespaces. Idempotent."""
        for sup in list(self.supervised.values()):
            sup.close()
        with self.lock:
            procs = [p for p in self.all_procs if p.running()]
        for p in procs:
            self.signal(p, signal.SIGCONT)
            self.signal(p, signal.SIGTERM)
        if not self._reap(procs, 2.0):
            for p in procs:
                self.signal(p, signal.SIGKILL)
            self._reap(procs, 5.0)
        for p in self.all_procs:
            if not p.running():
                self.registry.remove_proc(p.pid)
        if self.network is not None:
            self.network.close()
        if self.own_registry and not self.leftovers():
            self.registry.close()

    def leftovers(self) -> list[str]:
        """What this cluster made that still exists; [] after a complete ``close``."""
        left = [f"process {p.name} ({p.pid})" for p in self.all_procs if p.running() or alive(p.pid, p.start)]
        if self.network is not None:
            present = set(list_netns())
            left += [f"netns {ns}" for ns in self.network.made if ns in present]
        if self.own_registry and self.registry.path.exists() and left:
            left.append(f"state file {self.registry.path}")
        return left


class HostLauncher(Launcher):
    """``deploy.local.Launcher`` over a ``Cluster``: every service on a host of its own name
    (made on first use), its signals host faults (SIGKILL: ``kill_host``, SIGSTOP:
    ``freeze_host``, SIGCONT: ``thaw_host``), and ``partition``/``heal`` of its host. The
    harness asks the services from inside a host of the cluster (``status_in``, or a ZeroMQ
    context made on an ``in_netns`` thread): netns addresses have no route from the root."""

    def __init__(self, cluster: Cluster):
        super().__init__(cluster.run_dir / "logs")
        self.cluster = cluster

    def address_of(self, name: str) -> str:
        host = self.cluster.hosts.get(name) or self.cluster.add_host(name)
        return host.address

    def log_path(self, name: str) -> Path:
        return self.cluster.run_dir / "logs" / name / f"{name}.log"

    def start(self, svc) -> subprocess.Popen:
        self.address_of(svc.name)
        proc = self.cluster.spawn(svc.name, svc.argv(), svc.name)
        self.procs[svc.name] = proc.popen
        return proc.popen

    def kill(self, name: str, sig: int = signal.SIGKILL, wait: bool = True) -> None:
        self.killed.add(name)
        if sig == signal.SIGKILL:
            self.cluster.kill_host(name, wait=wait)
        elif sig == signal.SIGSTOP:
            self.cluster.freeze_host(name)
        elif sig == signal.SIGCONT:
            self.cluster.thaw_host(name)
        else:
            for p in self.cluster.processes(name):
                self.cluster.signal(p, sig)

    def partition(self, name: str) -> None:
        self.cluster.partition(name)

    def heal(self, name: str) -> None:
        self.cluster.heal(name)
