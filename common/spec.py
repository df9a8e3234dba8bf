"""The cluster spec: one TOML file that says which Keel processes run where.

``load_spec`` reads it (or a dict of the same shape), checks every key, allocates ports,
wires each service's endpoints to its peers, and returns a ``ClusterSpec``: a list of
``ServiceLaunch`` (name, role, host, validated config) that ``keel up`` hands to
supervisord and the chaos harness starts itself. Every error is a ``SpecError`` whose
message starts with the key path at fault, e.g. ``models.digits.k: must be 0 or >= 2``.

Format (full reference in docs/deploy.md)::

    [cluster]
    name = "local"            # default "keel"
    store = "store"           # model store; relative paths are taken from the cwd
    run_dir = "runs/local"    # default "runs/<name>"
    base_port = 7000          # bound endpoints get base_port, base_port+1, ... per address
    metrics_base_port = 9100  # optional: one prometheus port per service, per address

    [hosts]                   # default: local = "127.0.0.1"
    local = "127.0.0.1"

    [frontend]                # host = "local" or hosts = [...] (one frontend each);
    cache_size = 0            # any other key is a FrontendConfig option

    [dispatcher]              # host, plus DispatcherConfig options
    [encoder] / [decoder]     # host (default: the dispatcher's), plus their options
    [worker]                  # WorkerConfig options for every worker

    [models.digits]
    store_name = "digits-mlp" # or builtin = "noop" | "sleep"
    workers = 4
    k = 2                     # ParM coding-group size; mode = "none" | "equal" | "parm"

Example
-------
>>> spec = load_spec({"models": {"m": {"builtin": "noop", "workers": 2}}})
>>> [s.name for s in spec.services]
['frontend', 'dispatcher', 'worker-m-0', 'worker-m-1']
"""
from __future__ import annotations

from collections.abc import Callable

import dataclasses
import math
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import config as cfg
from common.modelstore import DEFAULT_STORE, ModelStore, ModelStoreError


class SpecError(ValueError):
    """A cluster spec that cannot be deployed; the message names the key path at fault."""


@dataclass
class ServiceLaunch:
    """One process of the cluster: what ``python -m services.serve`` needs to start it."""

    name: str
    role: str
    host: str
    config: Any

    def argv(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", "services.serve", self.role, "--config", cfg.to_json(self.config)]

    def endpoints(self) -> list[str]:
        """The endpoints this service binds (workers bind none)."""
        return [getattr(self.config, f) for f in _BINDS.get(self.role, ())]


_BINDS = {"frontend": ("client_endpoint", "prediction_endpoint"), "dispatcher": ("query_endpoint", "worker_endpoint"),
          "encoder": ("batch_endpoint",), "decoder": ("endpoint",)}


@dataclass
class ClusterSpec:
    name: str
    hosts: dict[str, str]
    store: str
    run_dir: str
    services: list[ServiceLaunch]
    client_endpoints: list[str]
    models: dict[str, dict]

    def by_host(self) -> dict[str, list[ServiceLaunch]]:
        """Services per host name, every host present (possibly with none), spec order."""
        out: dict[str, list[ServiceLaunch]] = {h: [] for h in self.hosts}
        for svc in self.services:
            out[svc.host].append(svc)
        return out

    def service(self, name: str) -> ServiceLaunch:
        for svc in self.services:
            if svc.name == name:
                return svc
        raise KeyError(f"no service {name!r} in cluster {self.name!r}; services: {[s.name for s in self.services]}")

    def role(self, role: str) -> list[ServiceLaunch]:
        """The services of one role ("frontend", "worker", ...), spec order."""
        return [s for s in self.services if s.role == role]

    def status_endpoints(self) -> dict[str, str]:
        """Service name -> endpoint answering a Status request (frontends, dispatcher)."""
        out = {s.name: s.config.client_endpoint for s in self.role("frontend")}
        out.update({s.name: s.config.worker_endpoint for s in self.role("dispatcher")})
        return out

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
            if info is None or ("workers" in info and len(info["workers"]) < workers):
                out.append(name)
        return out


# --------------------------------------------------------------------------- reading

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_REQUIRED = object()
_MODES = ("none", "equal", "parm")
# Config fields the spec sets itself: naming them in a passthrough table is an error.
_MANAGED = {
    "frontend": {"name", "client_endpoint", "prediction_endpoint", "dispatcher_endpoint", "models", "metrics_port"},
    "dispatcher": {"name", "query_endpoint", "worker_endpoint", "encoder_endpoint", "models", "metrics_port"},
    "encoder": {"name", "batch_endpoint", "dispatcher_endpoint", "parity_models", "encoder", "metrics_port"},
    "decoder": {"name", "endpoint", "metrics_port"},
    "worker": {
        "name", "model", "version", "role", "store", "store_name", "builtin", "builtin_input_shape",
        "builtin_output_size", "fixed_ms", "per_query_ms", "dispatcher_endpoint", "decoder_endpoint",
        "max_batch", "metrics_port",
    },
}


def _kind_ok(value: Any, kind: str) -> bool:
    if kind == "int":
        return type(value) is int
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "table":
        return isinstance(value, dict)
    if kind.startswith("list["):
        inner = kind[5:-1]
        return isinstance(value, list) and all(_kind_ok(v, inner) for v in value)
    raise AssertionError(kind)


_KIND_WORDS = {"int": "an integer", "number": "a number", "str": "a string", "bool": "true or false",
               "table": "a table", "list[int]": "a list of integers", "list[str]": "a list of strings",
               "list[number]": "a list of numbers"}


class _Table:
    """One TOML table being read: typed ``take``s, then ``finish`` refuses what is left."""

    def __init__(self, data: Any, path: str):
        if not isinstance(data, dict):
            raise SpecError(f"{path}: must be a table, got {type(data).__name__}")
        self.data, self.path, self.taken = data, path, set()

    def key(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def take(self, key: str, kind: str, default: Any = _REQUIRED) -> Any:
        self.taken.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise SpecError(f"{self.key(key)}: required")
            return default
        value = self.data[key]
        if not _kind_ok(value, kind):
            raise SpecError(f"{self.key(key)}: must be {_KIND_WORDS[kind]}, got {value!r}")
        return float(value) if kind == "number" else value

    def has(self, key: str) -> bool:
        return key in self.data

    def rest(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in self.taken}

    def finish(self) -> None:
        extra = sorted(set(self.data) - self.taken)
        if extra:
            raise SpecError(f"{self.key(extra[0])}: unknown key; known keys here: {sorted(self.taken)}")


def _fail(path: str, msg: str) -> None:
    raise SpecError(f"{path}: {msg}")


def _options(role: str, table: _Table) -> dict[str, Any]:
    """The untaken keys of ``table`` as config options of ``role``, checked by name."""
    options = table.rest()
    known = {f.name for f in dataclasses.fields(cfg.CONFIGS[role])}
    for key in sorted(options):
        if key in _MANAGED[role]:
            _fail(table.key(key), f"is set by the spec itself and cannot be given (see docs/deploy.md)")
        if key not in known:
            _fail(table.key(key), f"unknown key; {role} options: {sorted(known - _MANAGED[role])}")
    table.taken.update(options)
    return options


def _build(role: str, data: dict[str, Any], path: str) -> Any:
    try:
        return cfg.from_dict(role, data)
    except cfg.ConfigError as exc:
        raise SpecError(f"{path}: {exc}") from None


class _Ports:
    """Sequential ports per address, so services sharing an address never collide."""

    def __init__(self, base: int):
        self.base, self.next, self.used = base, {}, {}

    def take(self, address: str, owner: str) -> int:
        port = self.next.get(address, self.base)
        self.next[address] = port + 1
        if port > 65535:
            raise SpecError(f"cluster.base_port: ports on {address} run past 65535 at {owner}")
        return port


# --------------------------------------------------------------------------- loading


def _read(source: str | os.PathLike | dict) -> dict:
    if isinstance(source, dict):
        return source
    path = Path(source)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None


def _run_dir(given: str | None, name: str) -> str:
    return str(Path(given if given is not None else f"runs/{name}").absolute())


def run_dir_of(source: str | os.PathLike | dict) -> str:
    """The absolute run_dir of a spec, read without checking the rest of it (so that
    ``keel down`` works even when, say, the model store has gone)."""
    cluster = _read(source).get("cluster", {})
    if not isinstance(cluster, dict):
        raise SpecError("cluster: must be a table")
    name, given = cluster.get("name", "keel"), cluster.get("run_dir")
    if not isinstance(name, str) or not (given is None or isinstance(given, str)):
        raise SpecError("cluster.name and cluster.run_dir must be strings")
    return _run_dir(given, name)


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
    root = _Table(_read(source), "")

    cluster = _Table(root.take("cluster", "table", {}), "cluster")
    name = cluster.take("name", "str", "keel")
    if not _NAME.match(name):
        _fail("cluster.name", f"{name!r} must be letters, digits, '_', '.', '-'")
    store = str(Path(cluster.take("store", "str", DEFAULT_STORE)).absolute())
    run_dir = _run_dir(cluster.take("run_dir", "str", None), name)
    base_port = cluster.take("base_port", "int", 7000)
    metrics_base = cluster.take("metrics_base_port", "int", None)
    for key, port in (("base_port", base_port), ("metrics_base_port", metrics_base)):
        if port is not None and not 1 <= port <= 65535:
            _fail(f"cluster.{key}", f"must be a port in 1..65535, got {port}")
    cluster.finish()

    hosts_table = _Table(root.take("hosts", "table", {"local": "127.0.0.1"}), "hosts")
    hosts: dict[str, str] = {}
    for host in list(hosts_table.data):
        hosts[host] = hosts_table.take(host, "str")
        if not _NAME.match(host):
            _fail(f"hosts.{host}", "host names must be letters, digits, '_', '.', '-'")
    if not hosts:
        _fail("hosts", "needs at least one host")
    for host, address in (addresses or {}).items():
        if host not in hosts:
            raise SpecError(f"addresses.{host}: not a host of [hosts] ({sorted(hosts)})")
        hosts[host] = address
    for host, address in hosts.items():
        if not address or any(c in address for c in " /:"):
            _fail(f"hosts.{host}", f"must be an address such as 127.0.0.1, got {address!r}")
    first_host = next(iter(hosts))

    def host_of(table: _Table, default: str) -> str:
        host = table.take("host", "str", default)
        if host not in hosts:
            _fail(table.key("host"), f"{host!r} is not in [hosts] ({sorted(hosts)})")
        return host

    def hosts_of(table: _Table, key: str, default: list[str]) -> list[str]:
        listed = table.take(key, "list[str]", default)
        if not listed:
            _fail(table.key(key), "must name at least one host")
        for h in listed:
            if h not in hosts:
                _fail(table.key(key), f"{h!r} is not in [hosts] ({sorted(hosts)})")
        return listed

    fe_table = _Table(root.take("frontend", "table", {}), "frontend")
    if fe_table.has("host") and fe_table.has("hosts"):
        _fail("frontend.hosts", "give host or hosts, not both")
    fe_hosts = hosts_of(fe_table, "hosts", [host_of(fe_table, first_host)])
    fe_options = _options("frontend", fe_table)
    disp_table = _Table(root.take("dispatcher", "table", {}), "dispatcher")
    disp_host = host_of(disp_table, first_host)
    disp_options = _options("dispatcher", disp_table)
    side = {}
    for role in ("encoder", "decoder"):
        table = _Table(root.take(role, "table", {}), role)
        side[role] = (host_of(table, disp_host), _options(role, table))
    worker_options = _options("worker", _Table(root.take("worker", "table", {}), "worker"))

    models_table = _Table(root.take("models", "table"), "models")
    if not models_table.data:
        _fail("models", "needs at least one [models.NAME] table")
    models = {}
    for model in list(models_table.data):
        models_table.take(model, "table")
        models[model] = _read_model(model, _Table(models_table.data[model], f"models.{model}"),
                                    store, list(hosts), hosts_of)
    root.finish()

    # ---- ports and endpoints
    ports = _Ports(base_port)

    def endpoint(host: str, owner: str) -> str:
        return f"tcp://{hosts[host]}:{ports.take(hosts[host], owner)}"

    n_fe = len(fe_hosts)
    fe_names = ["frontend"] if n_fe == 1 else [f"frontend-{i}" for i in range(n_fe)]
    fe_endpoints = [(endpoint(h, n), endpoint(h, n)) for n, h in zip(fe_names, fe_hosts)]
    query_ep, worker_ep = endpoint(disp_host, "dispatcher"), endpoint(disp_host, "dispatcher")
    coded = {m: t for m, t in models.items() if t["mode"] == "parm"}
    encoder_ep = endpoint(side["encoder"][0], "encoder") if coded else None
    decoder_ep = endpoint(side["decoder"][0], "decoder") if coded else None

    services: list[ServiceLaunch] = []

    def add(name: str, role: str, host: str, data: dict[str, Any], path: str) -> None:
        services.append(ServiceLaunch(name, role, host, _build(role, {"name": name, **data}, path)))

    model_infos = {m: {k: t[k] for k in ("input_shape", "output_size", "input_dtype", "version",
                                         "default_output", "deadline_ms")} for m, t in models.items()}
    for n, h, (client_ep, pred_ep) in zip(fe_names, fe_hosts, fe_endpoints):
        add(n, "frontend", h, {**fe_options, "client_endpoint": client_ep, "prediction_endpoint": pred_ep,
                               "dispatcher_endpoint": query_ep, "models": model_infos}, "frontend")
    policies = {}
    for m, t in models.items():
        policies[m] = {k: t[k] for k in ("max_batch", "fixed_batch", "batch_delay_ms", "aimd_step", "aimd_backoff")}
        policies[m]["batch_budget_ms"] = t["batch_budget_ms"]
        if t["mode"] == "parm":
            policies[m].update(k=t["k"], parity_model=t["parity_model"])
    add("dispatcher", "dispatcher", disp_host,
        {**disp_options, "query_endpoint": query_ep, "worker_endpoint": worker_ep,
         "encoder_endpoint": encoder_ep, "models": policies}, "dispatcher")
    if coded:
        kinds = {t["encoder"] for t in coded.values()}
        if len(kinds) > 1:
            _fail(f"models.{list(coded)[-1]}.encoder", f"coded models use {sorted(kinds)}; one encoder service serves all, so they must agree")
        add("encoder", "encoder", side["encoder"][0],
            {**side["encoder"][1], "batch_endpoint": encoder_ep, "dispatcher_endpoint": query_ep,
             "parity_models": {m: t["parity_model"] for m, t in coded.items()}, "encoder": kinds.pop()}, "encoder")
        add("decoder", "decoder", side["decoder"][0], {**side["decoder"][1], "endpoint": decoder_ep}, "decoder")

    for m, t in models.items():
        common = {**worker_options, **t["worker_options"], "store": store, "dispatcher_endpoint": worker_ep,
                  "max_batch": t["max_batch"], "decoder_endpoint": decoder_ep if t["mode"] == "parm" else None}
        # sleep model: its cost; store model: a floor on its service time (common/config.py)
        common.update(fixed_ms=t["fixed_ms"], per_query_ms=t["per_query_ms"])
        if t["builtin"]:
            common.update(builtin=t["builtin"], builtin_input_shape=t["input_shape"], builtin_output_size=t["output_size"])
        deployed = {**common, "model": m, "role": "deployed"}
        if not t["builtin"]:
            deployed.update(store_name=t["store_name"], version=t["version"])
        # the table a bad worker option most likely came from
        where = f"models.{m}.worker" if t["worker_options"] else "worker" if worker_options else f"models.{m}"
        n_deployed = t["workers"] + (t["parity_workers"] if t["mode"] == "equal" else 0)
        for i in range(n_deployed):
            add(f"worker-{m}-{i}", "worker", t["hosts"][i % len(t["hosts"])], deployed, where)
        if t["mode"] == "parm":
            parity = {**common, "model": t["parity_model"], "role": "parity"}
            if not t["builtin"]:
                parity.update(store_name=t["parity_store_name"], version=t["parity_version"])
            # parity workers continue the round-robin so they land beside, not on, the first deployed ones
            ph = t["parity_hosts"]
            for i in range(t["parity_workers"]):
                add(f"parity-{m}-{i}", "worker", ph[(t["workers"] + i) % len(ph)], parity, where)

    if metrics_base is not None:
        metrics = _Ports(metrics_base)
        bound = {(hosts[s.host], p) for s in services for p in _bound_ports(s)}
        for svc in services:
            port = svc.config.metrics_port = metrics.take(hosts[svc.host], svc.name)
            if (hosts[svc.host], port) in bound:
                _fail("cluster.metrics_base_port", f"{svc.name}'s metrics port {port} collides with an endpoint port "
                      f"on {hosts[svc.host]}; endpoints use {base_port}..{max(ports.next.values()) - 1}")

    return ClusterSpec(name=name, hosts=hosts, store=store, run_dir=run_dir, services=services,
                       client_endpoints=[c for c, _ in fe_endpoints], models=models)


def _bound_ports(svc: ServiceLaunch) -> list[int]:
    return [int(ep.rsplit(":", 1)[1]) for ep in svc.endpoints()]


def _read_model(model: str, t: _Table, store: str, all_hosts: list[str], hosts_of: Any) -> dict[str, Any]:
    """The resolved table of one ``[models.NAME]``: every option filled, checked, store-backed."""
    if not _NAME.match(model):
        _fail(t.path, "model names must be letters, digits, '_', '.', '-'")
    out: dict[str, Any] = {}
    builtin = out["builtin"] = t.take("builtin", "str", None)
    if builtin not in (None, "noop", "sleep"):
        _fail(t.key("builtin"), f'must be "noop" or "sleep", got {builtin!r}')
    if builtin and t.has("store_name"):
        _fail(t.key("store_name"), "a builtin model has no store_name; give one or the other")
    out["store_name"] = t.take("store_name", "str", None if builtin else model)
    version = t.take("version", "str", None) if not isinstance(t.data.get("version"), int) else str(t.take("version", "int"))
    shape = t.take("input_shape", "list[int]", None)
    output_size = t.take("output_size", "int", None)
    dtype = t.take("input_dtype", "str", None)
    for key in ("fixed_ms", "per_query_ms"):
        out[key] = t.take(key, "number", 0.0)
        if t.has(key) and builtin == "noop":
            _fail(t.key(key), 'the builtin "noop" model has no cost to set')
        if out[key] < 0:
            _fail(t.key(key), "must be >= 0")
    mstore = ModelStore(store)
    if builtin:
        out.update(version="1", input_shape=shape or [64], output_size=output_size or 10, input_dtype=dtype or "float32")
    else:
        try:
            manifest = mstore.manifest(out["store_name"], version)
        except ModelStoreError as exc:
            key = "version" if mstore.has(out["store_name"]) else "store_name"
            raise SpecError(f"{t.key(key)}: {exc}") from None
        for key, given, stored in (("input_shape", shape, manifest.input_shape), ("output_size", output_size, manifest.output_size),
                                   ("input_dtype", dtype, manifest.input_dtype)):
            if given is not None and given != stored:
                _fail(t.key(key), f"{given!r} but store model {manifest.name}/{manifest.version} has {stored!r}")
        out.update(version=manifest.version, input_shape=list(manifest.input_shape), output_size=manifest.output_size,
                   input_dtype=manifest.input_dtype)
    if any(d <= 0 for d in out["input_shape"]) or not out["input_shape"]:
        _fail(t.key("input_shape"), f"must be positive integers, got {out['input_shape']}")
    if out["output_size"] <= 0:
        _fail(t.key("output_size"), "must be > 0")

    # serving: the frontend's deadline default and the dispatcher's batching
    out["deadline_ms"] = t.take("deadline_ms", "number", cfg.ModelInfo.deadline_ms)
    out["batch_budget_ms"] = t.take("batch_budget_ms", "number",
                                    out["deadline_ms"] if t.has("deadline_ms") else cfg.BatchPolicy.batch_budget_ms)
    out["max_batch"] = t.take("max_batch", "int", cfg.BatchPolicy.max_batch)
    out["fixed_batch"] = t.take("fixed_batch", "int", None)
    out["batch_delay_ms"] = t.take("batch_delay_ms", "number", cfg.BatchPolicy.batch_delay_ms)
    out["aimd_step"] = t.take("aimd_step", "int", cfg.BatchPolicy.aimd_step)
    out["aimd_backoff"] = t.take("aimd_backoff", "number", cfg.BatchPolicy.aimd_backoff)
    out["default_output"] = t.take("default_output", "list[number]", None)
    for key, ok, msg in (
        ("deadline_ms", out["deadline_ms"] > 0, "must be > 0"),
        ("batch_budget_ms", out["batch_budget_ms"] > 0, "must be > 0"),
        ("max_batch", out["max_batch"] >= 1, "must be >= 1"),
        ("fixed_batch", out["fixed_batch"] is None or 1 <= out["fixed_batch"] <= out["max_batch"], "must be in 1..max_batch"),
        ("batch_delay_ms", out["batch_delay_ms"] >= 0, "must be >= 0"),
        ("aimd_step", out["aimd_step"] >= 1, "must be >= 1"),
        ("aimd_backoff", 0 < out["aimd_backoff"] < 1, "must be in (0, 1)"),
        ("default_output", out["default_output"] is None or len(out["default_output"]) == out["output_size"],
         f"needs output_size = {out['output_size']} values"),
    ):
        if not ok:
            _fail(t.key(key), msg)
    if out["default_output"] is not None:
        out["default_output"] = [float(v) for v in out["default_output"]]

    # placement and ParM
    out["workers"] = t.take("workers", "int", 1)
    if out["workers"] < 1:
        _fail(t.key("workers"), "must be >= 1")
    out["hosts"] = hosts_of(t, "hosts", all_hosts)
    out["parity_hosts"] = hosts_of(t, "parity_hosts", out["hosts"])
    k = out["k"] = t.take("k", "int", 0)
    if k == 1 or k < 0:
        _fail(t.key("k"), "must be 0 or >= 2")
    mode = out["mode"] = t.take("mode", "str", "parm" if k else "none")
    if mode not in _MODES:
        _fail(t.key("mode"), f"must be one of {list(_MODES)}, got {mode!r}")
    if mode == "none" and k:
        _fail(t.key("mode"), f'"none" with k = {k}; set mode = "parm" or "equal", or drop k')
    if mode != "none" and not k:
        _fail(t.key("k"), f'mode "{mode}" needs k >= 2')
    # ParM §6.1: m/k parity workers; Equal-Resources gets as many extra deployed ones
    out["parity_workers"] = math.ceil(out["workers"] / k) if k else 0
    out["encoder"] = t.take("encoder", "str", "add")
    if out["encoder"] not in ("add", "concat"):
        _fail(t.key("encoder"), f'must be "add" or "concat", got {out["encoder"]!r}')
    out["parity_model"] = f"{model}-parity" if mode == "parm" else None
    out["parity_store_name"] = t.take("parity_store_name", "str", None)
    out["parity_version"] = t.take("parity_version", "str", None)
    for key in ("parity_store_name", "parity_version", "parity_hosts"):
        if t.has(key) and mode != "parm":
            _fail(t.key(key), 'only used with mode = "parm"')
    if mode == "parm" and not builtin:
        key = "parity_store_name" if t.has("parity_store_name") else "k"
        out["parity_store_name"] = out["parity_store_name"] or f"{out['store_name']}-parity"
        try:
            pm = mstore.manifest(out["parity_store_name"], out["parity_version"])
        except ModelStoreError as exc:
            raise SpecError(f"{t.key(key)}: parity model: {exc}") from None
        for key, value in (("k", k), ("encoder", out["encoder"])):
            trained = (pm.parity or {}).get(key)
            if trained is not None and trained != value:
                _fail(t.key(key), f"{value!r} but parity model {pm.name}/{pm.version} was trained for {key} = {trained!r}")
        out["parity_version"] = pm.version
    wt = _Table(t.take("worker", "table", {}), t.key("worker"))
    out["worker_options"] = _options("worker", wt)
    t.finish()
    return out
