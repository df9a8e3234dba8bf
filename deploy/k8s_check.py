"""Checks of what ``deploy.k8s`` renders, made without a cluster.

- ``schema_errors``: every manifest against the Kubernetes OpenAPI schemas (strict: an
  unknown field is an error), from the ``kubernetes-validate`` package, which ships them:
  no network (the ``k8s`` extra).
- ``wiring_errors``: every endpoint a process binds is a port of its own pod's Service,
  and every endpoint it connects to is a port of a Service that exists (for
  ``SET-i.SET``: a headless Service of a StatefulSet with more than i replicas); every
  Service selects a workload's pods and every probe names a port the container has.

Example
-------
>>> from keel.deploy.k8s import render               # doctest: +SKIP
>>> manifests = render("deploy/examples/noop.toml")  # doctest: +SKIP
>>> wiring_errors(manifests), schema_errors(manifests)  # doctest: +SKIP
([], [])
"""
from __future__ import annotations

from typing import Any

import orjson

from keel.common.roles import ROLES

#: Kubernetes version whose schemas the manifests are checked against (None: the newest shipped)
VERSION: str | None = None


def schema_errors(manifests: dict[str, Any], version: str | None = VERSION) -> list[str]:
    """'FILE: error' for each manifest the Kubernetes OpenAPI schema refuses."""
    import kubernetes_validate
    from kubernetes_validate import utils

    version = version or utils.latest_version()
    out = []
    for name, doc in manifests.items():
        if isinstance(doc, str):  # the Containerfile
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            out.append(f"{name}: {exc.message} at {'.'.join(map(str, exc.path))}")
        except utils.SchemaNotFoundError as exc:
            out.append(f"{name}: no schema: {exc}")
    return out


def _walk(value: Any):
    """Every string in ``value`` (dict keys too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(k)
            yield from _walk(v)


def _binds(role: str, config: dict) -> set[str]:
    """The ``HOST:PORT`` this process binds (its role's bind fields, graphs, Raft)."""
    eps = [config.get(f) for f in ROLES[role].binds] + [g["endpoint"] for g in (config.get("graphs") or {}).values()]
    out = {ep[len("tcp://"):] for ep in eps if ep and ep.startswith("tcp://")}
    if config.get("raft_address"):
        out.add(config["raft_address"])
    return out


def _connects(role: str, config: dict, binds: set[str]) -> set[str]:
    """The ``HOST:PORT`` it connects to: every other TCP endpoint and Raft partner it names."""
    if role == "frontend" and not config.get("models"):  # graphs only: its dispatcher field is a default it never uses
        config = {k: v for k, v in config.items() if k != "dispatcher_query_endpoint"}
    out = {s[len("tcp://"):] for s in _walk(config) if s.startswith("tcp://")}
    out |= set((config.get("raft_partners") or {}).keys())
    return out - binds


def pods(manifests: dict[str, Any]) -> list[tuple[str, str, str, dict]]:
    """(workload, pod address, role, config) of every pod the workloads run."""
    config_map = next(d for d in manifests.values() if isinstance(d, dict) and d["kind"] == "ConfigMap")
    out = []
    for doc in manifests.values():
        if not isinstance(doc, dict) or doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        name = doc["metadata"]["name"]
        command = doc["spec"]["template"]["spec"]["containers"][0]["command"]
        role, config = command[3], command[command.index("--config") + 1].rsplit("/", 1)[1]
        for i in range(doc["spec"]["replicas"]):
            pod = name if doc["kind"] == "Deployment" else f"{name}-{i}"
            key = config.replace("$(POD_NAME)", pod)
            address = name if doc["kind"] == "Deployment" else f"{name}-{i}.{name}"
            out.append((name, address, role, orjson.loads(config_map["data"][key])))
    return out


def wiring_errors(manifests: dict[str, Any]) -> list[str]:
    """What would not connect once applied (module docstring); empty when all does."""
    docs = [d for d in manifests.values() if isinstance(d, dict)]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    workloads = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    ports = {name: {p["port"] for p in s["spec"]["ports"]} for name, s in services.items()}
    errors = []

    def reachable(endpoint: str) -> str | None:
        """Why ``HOST:PORT`` is not a Service's port, or None when it is."""
        host, _, port = endpoint.rpartition(":")
        service, ordinal = host, None
        if "." in host:  # SET-i.SET: a member of a StatefulSet, through its headless Service
            member, _, service = host.partition(".")
            ordinal = member[len(service) + 1:] if member.startswith(service + "-") else None
            if ordinal is None or not ordinal.isdigit():
                return f"{host} is neither a Service nor a StatefulSet member's name"
        if service not in services:
            return f"no Service {service}"
        if int(port) not in ports[service]:
            return f"Service {service} has no port {port}"
        if ordinal is not None:
            workload = workloads.get(service)
            if workload is None or workload["kind"] != "StatefulSet" or int(ordinal) >= workload["spec"]["replicas"]:
                return f"no StatefulSet {service} with a member {ordinal}"
            if services[service]["spec"].get("clusterIP") != "None":
                return f"Service {service} is not headless"
        return None

    for workload, address, role, config in pods(manifests):
        binds = _binds(role, config)
        for endpoint in sorted(binds):
            if endpoint.rpartition(":")[0] != address:
                errors.append(f"{workload}: binds {endpoint}, not at its own name {address}")
            elif (why := reachable(endpoint)) is not None:
                errors.append(f"{workload}: binds {endpoint}, which others cannot reach: {why}")
        for endpoint in sorted(_connects(role, config, binds)):
            if (why := reachable(endpoint)) is not None:
                errors.append(f"{workload}: connects to {endpoint}: {why}")
    for name, service in services.items():
        selector = service["spec"].get("selector", {})
        if not any(selector.items() <= w["spec"]["template"]["metadata"]["labels"].items() for w in workloads.values()):
            errors.append(f"Service {name} selects no workload's pods")
    for name, workload in workloads.items():
        container = workload["spec"]["template"]["spec"]["containers"][0]
        named = {p.get("name") for p in container["ports"]}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            port = container.get(probe, {}).get("httpGet", {}).get("port")
            if port is None or (isinstance(port, str) and port not in named):
                errors.append(f"{name}: {probe} names no port of its container")
    return errors
