"""The ``[store]`` table of a cluster spec: store services, so hosts need no copy of the store.

::

    [store]
    hosts = ["h1"]            # one store service (replica) per host listed
    root = "published"        # the folder each replica serves (default: [cluster] store)
    max_chunk_bytes = 1048576 # ... and any other StoreConfig option

With a ``[store]`` table every store-backed worker gets the replicas' endpoints
(``store_endpoints``): a worker whose own store (``[cluster] store``, on its host) lacks
its version fetches it, checked by sha256, before it registers (``common.modelfetch``),
and ``load_spec`` asks the store service for the manifests a host's empty store lacks.
Each replica serves its own host's store (``root``, a folder of its own, lets the
store's host keep what it serves apart from what its workers fetch); ``keel model add
--publish`` (or ``keel model publish``) puts a version into every replica. Store endpoints take the first ports of
their host, so they are known before the models are read.
"""
from __future__ import annotations

from pathlib import Path

from keel.common import config as cfg
from keel.common.roles import from_dict
from keel.common.spec.ports import Ports
from keel.common.spec.tables import SpecError, Table, options
from keel.common.spec.topology import ServiceLaunch


def read_store(table: Table, hosts_of, first_host: str, hosts: dict[str, str], ports: Ports,
               store: str) -> list[ServiceLaunch]:
    """The store services of the ``[store]`` table, their endpoints allocated now."""
    placement = hosts_of(table, "hosts", [first_host])
    root = table.take("root", str, None)  # relative: from the cwd, like [cluster] store
    store = str(Path(root).absolute()) if root is not None else store
    if len(set(placement)) != len(placement):
        raise SpecError(f"{table.key('hosts')}: one store replica per host, got {placement}")
    extra = options("store", table)
    table.finish()
    services = []
    for i, host in enumerate(placement):
        name = f"store-{i + 1}"
        address = hosts[host]
        data = {**extra, "name": name, "store": store, "endpoint": ports.tcp(address, name),
                "status_endpoint": ports.tcp(address, name)}
        try:
            services.append(ServiceLaunch(name, "store", host, from_dict("store", data)))
        except cfg.ConfigError as exc:
            raise SpecError(f"store: {exc}") from None
    return services


def link_workers(services: list[ServiceLaunch], stores: list[ServiceLaunch]) -> None:
    """Point every store-backed worker at the store replicas."""
    endpoints = store_endpoints(stores)
    for svc in services:
        if svc.role == "worker" and svc.config.builtin is None:
            svc.config.store_endpoints = list(endpoints)


def store_endpoints(stores: list[ServiceLaunch]) -> list[str]:
    return [s.config.endpoint for s in stores]

