"""``load_spec``: read the root tables of a cluster spec and hand them to the model
resolution (``common.spec.models``), port allocation (``common.spec.ports``) and wiring
(``common.spec.topology``)."""
from __future__ import annotations

import os
from pathlib import Path

from keel.common.modelstore import DEFAULT_STORE
from keel.common.spec.hosts import read_host
from keel.common.spec.models import read_model
from keel.common.spec.pools import read_pool_prices
from keel.common.spec.ports import Ports, assign_metrics_ports, ipc_name
from keel.common.spec.tables import NAME, SpecError, Table, check_address, fail, options, read_source, run_dir
from keel.common.spec.topology import ClusterSpec, attach_serf, wire
from keel.common.spec.manager import read_manager, wire_manager
from keel.common.spec.operations import apply as apply_operations
from keel.common.spec.operations import read_logs, read_tracing
from keel.common.spec.store import link_workers, read_store, store_endpoints


def load_spec(source: str | os.PathLike | dict, addresses: dict[str, str] | None = None) -> ClusterSpec:
    """Read, check and wire a cluster spec.

    Parameters
    ----------
    source
        A TOML file path, or a dict shaped like the parsed TOML.
    addresses
        Host name -> address, replacing those in ``[hosts]`` (the chaos harness passes
        the addresses of the network namespaces it made). Every name must be a host.

    Raises
    ------
    SpecError
        The message starts with the offending key path.
    """
    root = Table(read_source(source), "")

    cluster = Table(root.take("cluster", dict, {}), "cluster")
    name = cluster.take("name", str, "keel")
    if not NAME.match(name):
        fail("cluster.name", f"{name!r} must be letters, digits, '_', '.', '-'")
    store = str(Path(cluster.take("store", str, DEFAULT_STORE)).absolute())
    run_dir_ = run_dir(cluster.take("run_dir", str, None), name)
    base_port = cluster.take("base_port", int, 7000)
    metrics_base = cluster.take("metrics_base_port", int, None)
    curve_keys = cluster.take("curve_keys", str, None)  # CURVE on every socket (common.curve)
    ipc = cluster.take("ipc", bool, True)  # the hops of a cluster on one machine: ZeroMQ ipc (common.spec.ports)
    if curve_keys is not None:
        curve_keys = str(Path(curve_keys).absolute())
        if not (Path(curve_keys) / "service.key_secret").is_file():
            fail("cluster.curve_keys", f"{curve_keys} holds no service keys: run `keel keys generate {curve_keys}`")
    for key, port in (("base_port", base_port), ("metrics_base_port", metrics_base)):
        if port is not None and not 1 <= port <= 65535:
            fail(f"cluster.{key}", f"must be a port in 1..65535, got {port}")
    cluster.finish()

    hosts_table = Table(root.take("hosts", dict, {"local": "127.0.0.1"}), "hosts")
    hosts: dict[str, str] = {}
    host_gpus: dict[str, list[str]] = {}  # the GPUs each host offers (common.spec.gpus)
    binds: dict[str, str | None] = {}  # where a host's services bind, when not its address (common.spec.operations)
    for host in list(hosts_table.data):
        hosts[host], binds[host], host_gpus[host] = read_host(hosts_table, host)
        if not NAME.match(host):
            fail(f"hosts.{host}", "host names must be letters, digits, '_', '.', '-'")
    if not hosts:
        fail("hosts", "needs at least one host")
    for host, address in (addresses or {}).items():
        if host not in hosts:
            raise SpecError(f"addresses.{host}: not a host of [hosts] ({sorted(hosts)})")
        hosts[host] = address
    for host, address in hosts.items():
        check_address(f"hosts.{host}", address)
    first_host = next(iter(hosts))

    def host_of(table: Table, default: str) -> str:
        host = table.take("host", str, default)
        if host not in hosts:
            fail(table.key("host"), f"{host!r} is not in [hosts] ({sorted(hosts)})")
        return host

    def hosts_of(table: Table, key: str, default: list[str]) -> list[str]:
        listed = table.take(key, list[str], default)
        if not listed:
            fail(table.key(key), "must name at least one host")
        for h in listed:
            if h not in hosts:
                fail(table.key(key), f"{h!r} is not in [hosts] ({sorted(hosts)})")
        return listed

    placement, opts = {}, {}
    fe_table = Table(root.take("frontend", dict, {}), "frontend")
    if fe_table.has("host") and fe_table.has("hosts"):
        fail("frontend.hosts", "give host or hosts, not both")
    if fe_table.has("applications"):
        fail("frontend.applications", "applications are [applications.NAME] tables of their own")
    placement["frontend"] = hosts_of(fe_table, "hosts", [host_of(fe_table, first_host)])
    opts["frontend"] = options("frontend", fe_table)
    disp_table = Table(root.take("dispatcher", dict, {}), "dispatcher")
    placement["dispatcher"] = host_of(disp_table, first_host)
    opts["dispatcher"] = options("dispatcher", disp_table)
    for role in ("encoder", "decoder"):
        table = Table(root.take(role, dict, {}), role)
        placement[role] = host_of(table, placement["dispatcher"])
        opts[role] = options(role, table)
    opts["worker"] = options("worker", Table(root.take("worker", dict, {}), "worker"))
    # Every optional table is taken (None when absent), so an unknown one's error lists them all.
    gateway = root.take("gateway", dict, None)
    if gateway is not None:  # the OIP v2 HTTP gateway (services.gateway), beside the first frontend
        gw_table = Table(gateway, "gateway")
        placement["gateway"] = host_of(gw_table, placement["frontend"][0])
        opts["gateway"] = options("gateway", gw_table)

    ports = Ports(base_port, ipc_name(name, run_dir_, list(hosts.values())) if ipc else None)
    store_table = root.take("store", dict, None)  # store services: their endpoints first, the models may need them
    stores = [] if store_table is None else read_store(Table(store_table, "store"), hosts_of, first_host, hosts, ports, store)
    pool_prices = read_pool_prices(Table(root.take("pools", dict, {}), "pools"))
    graphs = _read_graphs(root, name, hosts)
    models_table = Table(root.take("models", dict, {}) if graphs else root.take("models", dict), "models")
    if not models_table.data and not graphs:
        fail("models", "needs at least one [models.NAME] table (or a [graphs.NAME] table)")
    from keel.common.modelfetch import Manifests  # ZeroMQ: imported when a spec is read, not by keel --help

    # a host's store may start empty: the store service (or the folder it serves, here) knows
    manifests = Manifests(store, store_endpoints(stores), stores[0].config.store if stores else None, curve_keys)
    models = {}
    for model in list(models_table.data):
        models_table.take(model, dict)
        models[model] = read_model(model, Table(models_table.data[model], f"models.{model}"), manifests, list(hosts),
                                   hosts_of, pool_prices, host_gpus)
    manager_table = root.take("manager", dict, None)
    manager = read_manager(Table(manager_table, "manager"), hosts_of, first_host) if manager_table is not None else None
    applications = root.take("applications", dict, None)
    if applications is not None:  # model selection (Clipper §5): common.spec.applications
        from keel.common.spec.applications import read_applications

        applications = read_applications(applications, list(models))
    for graph in graphs:
        if graph in models or graph in (applications or {}):
            fail(f"graphs.{graph}", f"{graph!r} is also a model's or an application's name; a target has one name")
    log_levels = read_logs(Table(root.take("logs", dict, {}), "logs"))
    traces = read_tracing(Table(root.take("tracing", dict, {}), "tracing"))
    root.finish()

    services, client_endpoints = wire(hosts, ports, store, models, placement, opts)
    attach_serf(services, hosts, store, run_dir_, models)
    if applications:
        from keel.common.spec.applications import attach

        attach(applications, services, run_dir_)
    if manager is not None:
        wire_manager(services, hosts, ports, manager, run_dir_)
    if graphs:
        from keel.common.spec.graph import wire_graphs

        services += wire_graphs(graphs, services, hosts, ports, placement["frontend"][0])
    if stores:
        link_workers(services, stores)
        services[:0] = stores
    if metrics_base is not None:
        assign_metrics_ports(services, hosts, metrics_base, ports)
    for svc in services:
        svc.curve_keys = curve_keys
    apply_operations(services, hosts, binds, log_levels, traces)
    return ClusterSpec(name=name, hosts=hosts, store=store, run_dir=run_dir_, services=services,
                       client_endpoints=client_endpoints, models=models, curve_keys=curve_keys)


def _read_graphs(root: Table, cluster: str, hosts: dict[str, str]) -> dict:
    """The spec's HAMS service graphs by name (``common.spec.graph``): ``[graphs.NAME]``
    tables, and a single ``[graph]`` table (the older form) named after the cluster; each
    graph's ``host`` one of ``hosts``."""
    from keel.common.spec.graph import read_graph

    def read(table: dict, prefix: str):
        graph = read_graph(table, prefix)
        if graph.host is not None and graph.host not in hosts:
            fail(f"{prefix}.host", f"{graph.host!r} is not in [hosts] ({sorted(hosts)})")
        return graph

    graphs = {}
    single = root.take("graph", dict, None)
    if single is not None:
        graphs[cluster] = read(single, "graph")
    for graph, table in (root.take("graphs", dict, None) or {}).items():
        if not NAME.match(graph):
            fail(f"graphs.{graph}", f"{graph!r} must be letters, digits, '_', '.', '-'")
        if graph in graphs:
            fail(f"graphs.{graph}", f"the [graph] table is already the graph named {graph!r} (the cluster's name)")
        if not isinstance(table, dict):
            fail(f"graphs.{graph}", "must be a table")
        graphs[graph] = read(table, f"graphs.{graph}")
    return graphs
