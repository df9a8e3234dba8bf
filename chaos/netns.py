"""Hosts as network namespaces: one namespace per host, joined through a bridge namespace.

Topology (netns mode)::

    [host a]eth0 ==veth== h0[bridge ns: br0]h1 ==veth== eth0[host b]   ...

Every host's link is the veth pair between it and the bridge. A ``tc tbf`` on both ends
of a link limits the host's upload (host side) and download (bridge side) to the same
rate. A partition sets the bridge end down: packets are dropped, TCP connections stall
and resume after the heal, as on a cut cable. The subnet (``SUBNET``.0/24) exists only
inside these namespaces; nothing is added to the root namespace.

``in_netns(ns, fn)`` runs ``fn`` on a short-lived thread that has joined ``ns``, so the
harness can open sockets inside a host without starting a process: a socket belongs to
the namespace it was created in for its whole life.

Example
-------
>>> net = Network(registry, link_mbit=1000)              # doctest: +SKIP
>>> addresses = net.build(["a", "b"])                     # doctest: +SKIP
>>> sock = in_netns(net.ns["a"], socket.socket)           # doctest: +SKIP
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable

from keel.chaos.resources import ChaosError, Registry, delete_netns, run

#: the /24 the namespaces use; private, and present only inside namespaces we made
SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def in_netns(ns: str | None, fn: Callable[[], Any]) -> Any:
    """``fn()`` evaluated inside network namespace ``ns`` (here when ``ns`` is None)."""
    if ns is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            _setns(f"/run/netns/{ns}")
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    # the thread dies right after, so its namespace never leaks into other work
    thread = threading.Thread(target=target, name=f"netns-{ns}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def tbf_args(mbit: float) -> list[str]:
    """``tc`` arguments of a token bucket at ``mbit`` Mbit/s with a burst of ~4 ms."""
    rate_bytes = mbit * 1e6 / 8
    burst = int(max(64 * 1024, rate_bytes * 0.004))
    return ["tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", "50ms"]


class Network:
    """The namespaces, veths and qdiscs of one cluster; ``close`` removes all of them."""

    def __init__(self, registry: Registry, link_mbit: float | None = None, subnet: str = SUBNET, tag: str = ""):
        self.registry, self.link_mbit, self.subnet = registry, link_mbit, subnet
        self.tag = tag
        self.bridge = registry.ns_name(f"{tag}-bridge" if tag else "-bridge")
        self.ns: dict[str, str] = {}
        self.addresses: dict[str, str] = {}
        self.ports: dict[str, str] = {}  # host -> its veth end in the bridge namespace
        self.limits: dict[str, float | None] = {}
        self.down: set[str] = set()
        self.made: list[str] = []  # every namespace name ever created, for leftover checks

    def _ns(self, name: str) -> str:
        ns = self.registry.ns_name(f"{self.tag}-{name}" if self.tag else name)
        run(["ip", "netns", "add", ns])
        self.registry.add_netns(ns)
        self.made.append(ns)
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        return ns

    def build(self, hosts: list[str]) -> dict[str, str]:
        """Make the bridge and one namespace per host; returns host -> address."""
        if len(hosts) > 250:
            raise ChaosError("at most 250 hosts fit the /24")
        run(["ip", "netns", "add", self.bridge])
        self.registry.add_netns(self.bridge)
        self.made.append(self.bridge)
        run(["ip", "-n", self.bridge, "link", "set", "lo", "up"])
        run(["ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", self.bridge, "link", "set", "br0", "up"])
        for host in hosts:
            self.add_host(host)
        return dict(self.addresses)

    def add_host(self, host: str) -> str:
        idx = len(self.ns)
        ns = self._ns(host)
        port = f"h{idx}"
        address = f"{self.subnet}.{idx + 2}"
        # both ends are created inside their namespaces: nothing ever exists in the root one
        run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.bridge])
        run(["ip", "-n", self.bridge, "link", "set", port, "master", "br0", "up"])
        run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        self.ns[host], self.addresses[host], self.ports[host] = ns, address, port
        self.set_limit(host, self.link_mbit)
        return address

    def set_limit(self, host: str, mbit: float | None) -> None:
        """Limit the host's link to ``mbit`` Mbit/s each way (None removes the limit)."""
        for ns, dev in ((self.ns[host], "eth0"), (self.bridge, self.ports[host])):
            if mbit is None:
                if self.limits.get(host) is not None:
                    run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            else:
                run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf_args(mbit)])
        self.limits[host] = mbit

    def partition(self, host: str) -> None:
        """Cut the host's link: nothing passes until ``heal``."""
        run(["ip", "-n", self.bridge, "link", "set", self.ports[host], "down"])
        self.down.add(host)

    def heal(self, host: str) -> None:
        run(["ip", "-n", self.bridge, "link", "set", self.ports[host], "up"])
        self.down.discard(host)

    def qdiscs(self, host: str) -> str:
        return run(["tc", "-n", self.ns[host], "qdisc", "show", "dev", "eth0"], check=False).stdout

    def close(self) -> None:
        """Delete every namespace (their veths and qdiscs go with them). Idempotent."""
        for ns in list(self.made):
            if ns in self.registry.namespaces:
                delete_netns(ns)
                self.registry.remove_netns(ns)
        self.ns.clear()
