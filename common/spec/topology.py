"""Topology: which Keel processes a resolved spec runs, where, and how their endpoints
connect. ``wire`` turns resolved models and per-role options into ``ServiceLaunch``es;
``ClusterSpec`` is the result every deployer (supervisord, systemd, the chaos harness,
``deploy.local``) starts from.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keel.common import config as cfg
from keel.common.roles import ROLES, from_dict
from keel.common.spec.gpus import place
from keel.common.spec.models import batch_policy, model_info
from keel.common.spec.ports import Ports
from keel.common.spec.tables import SpecError, fail


@dataclass
class ServiceLaunch:
    """One process of the cluster: what ``python -m keel.services.serve`` needs to start it."""

    name: str
    role: str
    host: str
    config: Any
    #: CURVE keys folder (``[cluster] curve_keys``); None = CURVE off
    curve_keys: str | None = None
    #: the address its TCP endpoints bind when it is not the one they advertise (a
    #: ``[hosts]`` entry's ``bind``: NAT, containers, pods); None = the advertised one
    bind: str | None = None
    #: the address its metrics and health port binds; None = loopback (one machine)
    metrics_address: str | None = None
    #: its log level (``[logs]``); None = info
    log_level: str | None = None
    #: OpenTelemetry (``[tracing]``): the share of requests traced (None = off) and the OTLP endpoint
    trace_rate: float | None = None
    trace_endpoint: str | None = None

    def argv(self, python: str = sys.executable, config: str | None = None) -> list[str]:
        """The command line; ``config``: what ``--config`` gets instead of the config as
        JSON (``@FILE``: supervisord's programs read theirs from the run_dir)."""
        argv = [python, "-m", "keel.services.serve", self.role, "--config", config or cfg.to_json(self.config)]
        for flag, value in (("--curve", self.curve_keys), ("--bind", self.bind),
                            ("--metrics-address", self.metrics_address), ("--log-level", self.log_level),
                            ("--trace-rate", self.trace_rate and str(self.trace_rate)),
                            ("--trace-endpoint", self.trace_endpoint)):
            if value:
                argv += [flag, value]
        return argv

    def endpoints(self) -> list[str]:
        """The endpoints this service binds (workers bind none; a frontend one per graph too)."""
        graphs = [g.endpoint for g in getattr(self.config, "graphs", {}).values()]
        return [e for e in (getattr(self.config, f) for f in ROLES[self.role].binds) if e is not None] + graphs


@dataclass
class ClusterSpec:
    name: str
    hosts: dict[str, str]
    store: str
    run_dir: str
    services: list[ServiceLaunch]
    client_endpoints: list[str]
    models: dict[str, dict]
    #: CURVE keys folder every service uses (``[cluster] curve_keys``); None = CURVE off
    curve_keys: str | None = None

    @property
    def local_client_endpoints(self) -> list[str]:
        """What a client on the cluster's machine connects to: on a cluster of one machine
        each frontend's ``ipc`` twin of its client endpoint (a cheaper hop than TCP;
        ``common.spec.ports``), else ``client_endpoints``."""
        local = {s.config.client_endpoint: s.config.local_client_endpoint for s in self.role("frontend")}
        return [local.get(ep) or ep for ep in self.client_endpoints]

    def by_host(self) -> dict[str, list[ServiceLaunch]]:
        """Services per host name, every host present (possibly with none), spec order."""
        out: dict[str, list[ServiceLaunch]] = {h: [] for h in self.hosts}
        for svc in self.services:
            out[svc.host].append(svc)
        return out

    def for_host(self, host: str) -> ClusterSpec:
        """The same cluster seen from ``host``: only its services, as ``keel up SPEC --host H``
        starts them under that host's own supervisord (the endpoints of the others stay
        wired in every config)."""
        if host not in self.hosts:
            raise SpecError(f"host {host!r} is not in [hosts] ({sorted(self.hosts)})")
        return dataclasses.replace(self, services=[s for s in self.services if s.host == host])

    def service(self, name: str) -> ServiceLaunch:
        for svc in self.services:
            if svc.name == name:
                return svc
        raise KeyError(f"no service {name!r} in cluster {self.name!r}; services: {[s.name for s in self.services]}")

    def role(self, role: str) -> list[ServiceLaunch]:
        """The services of one role ("frontend", "worker", ...), spec order."""
        return [s for s in self.services if s.role == role]

    def status_endpoints(self) -> dict[str, str]:
        """Service name -> endpoint answering a Status request (each role's ``status`` field)."""
        return {s.name: getattr(s.config, ROLES[s.role].status) for s in self.services if ROLES[s.role].status}

    def unready(self, ask: Callable[[str], dict | None]) -> list[str]:
        """Services not ready to serve yet, asking each status endpoint with ``ask``.

        A frontend is ready once it answers; the dispatcher once every worker of the spec
        has registered with it (workers load torch and their model first). ``ask`` takes
        an endpoint and returns its status info or None: the chaos harness asks from
        inside a network namespace, everyone else with ``common.transport.request_status``.
        """
        workers = len(self.role("worker"))
        out = []
        for name, endpoint in self.status_endpoints().items():
            info = ask(endpoint)
            # a standby dispatcher (manager failover) has no workers until it is promoted
            if info is None or ("workers" in info and info.get("active", True) and len(info["workers"]) < workers):
                out.append(name)
        return out


def _build(role: str, data: dict[str, Any], path: str) -> Any:
    try:
        return from_dict(role, data)
    except cfg.ConfigError as exc:
        raise SpecError(f"{path}: {exc}") from None


def _kairos_profile(models: dict[str, dict], given: dict[str, Any]) -> dict[str, Any]:
    """The dispatcher's Kairos profile options from the ``kairos``-emulated model, unless
    ``[dispatcher]`` gives them; one dispatcher policy serves every model, so such models
    must agree on the profile."""
    keys = ("kairos_model", "kairos_scale", "kairos_profile")
    emulated = {m: tuple(t[k] for k in keys) for m, t in models.items() if t["builtin"] == "kairos"}
    if not emulated or any(k in given for k in keys):
        return {}
    if len(set(emulated.values())) > 1:
        fail(f"models.{list(emulated)[-1]}.kairos_model", "kairos-emulated models must agree on kairos_model, "
             "kairos_scale and kairos_profile (one dispatcher policy); or set them in [dispatcher]")
    return dict(zip(keys, next(iter(emulated.values()))))


def wire(hosts: dict[str, str], ports: Ports, store: str, models: dict[str, dict], placement: dict[str, Any],
         options: dict[str, dict[str, Any]]) -> tuple[list[ServiceLaunch], list[str]]:
    """The services of a single-model-per-queue deployment (Clipper/ParM) and the client
    endpoints. ``placement``: ``frontend`` (list of hosts), ``dispatcher``, ``encoder``,
    ``decoder`` (a host each); ``options``: role -> options from its spec table. With no
    models (a spec of graphs only) just the frontends (and the gateway)."""

    def endpoint(host: str, owner: str) -> str:  # what clients and the operator reach
        return ports.tcp(hosts[host], owner)

    def hop(host: str, owner: str) -> str:  # what only the cluster's services connect to
        return ports.hop(hosts[host], owner)

    fe_hosts, disp_host = placement["frontend"], placement["dispatcher"]
    fe_names = ["frontend"] if len(fe_hosts) == 1 else [f"frontend-{i}" for i in range(len(fe_hosts))]
    fe_endpoints = [(endpoint(h, n), hop(h, n)) for n, h in zip(fe_names, fe_hosts)]
    query_ep, worker_ep = (hop(disp_host, "dispatcher"), hop(disp_host, "dispatcher")) if models else (None, None)
    coded = {m: t for m, t in models.items() if t["mode"] == "parm"}
    encoder_ep = hop(placement["encoder"], "encoder") if coded else None
    decoder_ep = hop(placement["decoder"], "decoder") if coded else None

    services: list[ServiceLaunch] = []

    def add(name: str, role: str, host: str, data: dict[str, Any], path: str) -> None:
        if ROLES[role].status == "status_endpoint":  # roles with no ROUTER of their own answer Status there
            data = {**data, "status_endpoint": endpoint(host, name)}
        services.append(ServiceLaunch(name, role, host, _build(role, {"name": name, **data}, path)))

    infos = {m: model_info(t) for m, t in models.items()}
    for n, h, (client_ep, pred_ep) in zip(fe_names, fe_hosts, fe_endpoints):
        local = {"local_client_endpoint": ports.local(client_ep)} if ports.ipc else {}
        add(n, "frontend", h, {**options["frontend"], "client_endpoint": client_ep, **local, "prediction_endpoint": pred_ep,
                               **({"dispatcher_query_endpoint": query_ep} if models else {}), "models": infos}, "frontend")
    if placement.get("gateway"):
        add("gateway", "gateway", placement["gateway"], {**options["gateway"], "models": infos,
                                                         "frontend_endpoints": [ports.local(c) for c, _ in fe_endpoints]},
            "gateway")
    if not models:
        return services, [c for c, _ in fe_endpoints]
    add("dispatcher", "dispatcher", disp_host,
        {**_kairos_profile(models, options["dispatcher"]), **options["dispatcher"], "query_endpoint": query_ep, "worker_endpoint": worker_ep,
         "encoder_endpoint": encoder_ep, "models": {m: batch_policy(t) for m, t in models.items()}}, "dispatcher")
    dispatcher = services[-1].config
    if coded:
        kinds = {t["encoder"] for t in coded.values()}
        if len(kinds) > 1:
            fail(f"models.{list(coded)[-1]}.encoder", f"coded models use {sorted(kinds)}; one encoder service serves all, so they must agree")
        add("encoder", "encoder", placement["encoder"],
            {**options["encoder"], "batch_endpoint": encoder_ep, "dispatcher_query_endpoint": query_ep,
             "parity_models": {m: t["parity_model"] for m, t in coded.items()}, "encoder": kinds.pop()}, "encoder")
        # which deployed version each parity model version reconstructs (ParM is exact only for its own)
        pairs = {m: {t["parity_version"]: t["version"]} for m, t in coded.items() if not t["builtin"]}
        add("decoder", "decoder", placement["decoder"], {**options["decoder"], "endpoint": decoder_ep,
                                                          "parity_versions": pairs}, "decoder")

    worker_options = options["worker"]
    for m, t in models.items():
        common = {**worker_options, **t["worker_options"], "store": store, "dispatcher_worker_endpoint": worker_ep,
                  "max_batch": t["max_batch"], "decoder_endpoint": decoder_ep if t["mode"] == "parm" else None}
        # sleep model: its cost; store model: a floor on its service time (common/config.py)
        common.update(fixed_ms=t["fixed_ms"], per_query_ms=t["per_query_ms"])
        if t["builtin"]:
            common.update(builtin=t["builtin"], builtin_input_shape=t["input_shape"], builtin_output_size=t["output_size"])
        if t["builtin"] == "kairos":
            common.update({k: t[k] for k in ("kairos_model", "kairos_scale", "kairos_profile")})
        deployed = {**common, "model": m, "role": "deployed"}
        if not t["builtin"]:
            deployed.update(store_name=t["store_name"], version=t["version"])
        # the table a bad worker option most likely came from
        where = f"models.{m}.worker" if t["worker_options"] else "worker" if worker_options else f"models.{m}"
        n_deployed = t["workers"] + (t["parity_workers"] if t["mode"] == "equal" else 0)
        first = len(services)
        for i in range(n_deployed):
            # Kairos pools: each worker declares its instance type and price
            declared = {"instance": t["pool"][i][0], "price": t["pool"][i][1]} if t["pool"] else {}
            host, placed = place(t, "gpu_slots", i, t["hosts"])  # on GPUs: its (host, GPU) slot
            add(f"worker-{m}-{i}", "worker", host, {**deployed, **declared, **placed}, where)
        if t["mode"] == "parm":
            parity = {**common, "model": t["parity_model"], "role": "parity"}
            if not t["builtin"]:
                parity.update(store_name=t["parity_store_name"], version=t["parity_version"])
            # parity workers continue the round-robin so they land beside, not on, the first deployed ones
            ph = t["parity_hosts"]
            for i in range(t["parity_workers"]):
                host, placed = place(t, "parity_gpu_slots", t["workers"] + i, ph)
                add(f"parity-{m}-{i}", "worker", host, {**parity, **placed}, where)
        disagree = cfg.heartbeats_agree(dispatcher, services[first].config)
        if disagree:
            fail(where if where != f"models.{m}" else "worker", f"heartbeat settings disagree with the dispatcher's: {disagree}")
    return services, [c for c, _ in fe_endpoints]


def attach_serf(services: list[ServiceLaunch], hosts: dict[str, str], store: str, run_dir: str,
                models: dict[str, dict]) -> None:
    """The dispatcher's SERF fields the spec knows (the models of ``serf`` and the hosts of
    ``serf_cores`` must be the spec's): each worker's host (for the per-host
    ``serf_cores``) and where a rolled-out version's profile
    is kept (the store and each model's store name, the run folder)."""
    disp = next((s.config for s in services if s.role == "dispatcher"), None)
    if disp is None or not (disp.serf or disp.serf_cores):
        return
    for model in disp.serf:
        if model not in models:
            fail(f"dispatcher.serf.{model}", f"no such model; models: {sorted(models)}")
    for host in disp.serf_cores:
        if host not in hosts:
            fail(f"dispatcher.serf_cores.{host}", f"no such host; hosts: {sorted(hosts)}")
    disp.serf_hosts = {s.name: s.host for s in services if s.role == "worker"}
    disp.serf_store, disp.serf_run_dir = store, run_dir
    disp.serf_names = {m: t["store_name"] for m, t in models.items() if not t["builtin"] and t.get("store_name")}
