"""What ``keel up`` checks before it starts anything, so that an operator's mistake ends in
one line instead of a service dying in a restart loop: every port the spec binds on this
machine is free, every store version it serves matches its manifest's sha256, and every
GPU its workers ask for is on this host.

Example
-------
>>> check_ports(load_spec("deploy/examples/local.toml"))   # doctest: +SKIP
"""
from __future__ import annotations

import errno
import socket
from typing import Any

from keel.common.modelstore import ModelStore, ModelStoreError
from keel.common.roles import ROLES


class PreflightError(RuntimeError):
    """A spec that cannot start here as things stand; the message says what is in the way."""


def bound_ports(spec: Any) -> list[tuple[str, str, str, int]]:
    """(service, what, address, port) for every TCP port the spec's services bind: ZeroMQ
    endpoints, the gateway's HTTP and gRPC ports, metrics ports, the manager's Raft port."""
    out = []
    for svc in spec.services:
        c = svc.config
        for field in ROLES[svc.role].binds:
            endpoint = getattr(c, field, None) or ""
            if endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[1].isdigit():
                address, port = endpoint[len("tcp://"):].rsplit(":", 1)
                out.append((svc.name, field, svc.bind or address, int(port)))  # where it binds, not advertises
        for what in ("http_port", "grpc_port"):  # the gateway's: OIP v2 over HTTP, and over gRPC
            if getattr(c, what, None):
                out.append((svc.name, what, c.http_host, getattr(c, what)))
        if getattr(c, "metrics_port", None):
            out.append((svc.name, "metrics_port", svc.metrics_address or "127.0.0.1", c.metrics_port))
        raft = getattr(c, "raft_address", "")
        if raft and raft.rsplit(":", 1)[-1].isdigit():
            address, port = raft.rsplit(":", 1)
            out.append((svc.name, "raft_address", address, int(port)))
    return out


def _in_use(address: str, port: int) -> bool:
    """Whether another socket listens on (address, port). An address that is not this
    machine's (a multi-host spec) is not ours to judge."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: TIME_WAIT is no conflict
        try:
            s.bind((address if address not in ("*", "") else "0.0.0.0", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def check_ports(spec: Any) -> None:
    """Raise ``PreflightError`` naming the first port the spec binds that is in use."""
    for service, what, address, port in bound_ports(spec):
        if _in_use(address, port):
            hint = (f"change [gateway] {what}" if what in ("http_port", "grpc_port")
                    else "change [cluster] metrics_base_port" if what == "metrics_port"
                    else "change [cluster] base_port")
            raise PreflightError(f"port {port} on {address} ({service} {what}) is in use by another process: "
                                 f"stop it, or {hint}")


def check_devices(spec: Any, present: list[str] | None = None) -> None:
    """Raise ``PreflightError`` naming the first worker whose GPU this host does not have
    (``present``: the host's GPUs, ``common.devices.present_gpus`` when None), the check a
    worker would make at start, made before anything starts."""
    from keel.common.devices import missing, present_gpus

    gpu_workers = [svc for svc in spec.role("worker") if getattr(svc.config, "device", "cpu") != "cpu"]
    if not gpu_workers:
        return
    present = present_gpus() if present is None else present
    for svc in gpu_workers:
        why = missing(svc.config, present)
        if why is not None:
            raise PreflightError(f"{svc.name} asks for {why}: fix [hosts] gpus or the model's gpus/device, "
                                 "or run it on a GPU host")


def check_store(spec: Any) -> None:
    """Raise ``PreflightError`` when a store version a worker of the spec would load is
    missing a file or does not match its manifest (a worker would exit at start)."""
    store = ModelStore(spec.store)
    seen = set()
    for svc in spec.role("worker"):
        c = svc.config
        name, version = getattr(c, "store_name", None), getattr(c, "version", None)
        if getattr(c, "builtin", None) or not name or (name, version) in seen:
            continue
        if getattr(c, "store_endpoints", None) and not store.has(name, version):
            continue  # fetched from the store service at start, checked there (common.modelfetch)
        seen.add((name, version))
        try:
            store.artifact(store.manifest(name, version))
        except ModelStoreError as exc:
            raise PreflightError(f"model store {store.root}: {exc}") from None
