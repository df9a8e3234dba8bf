"""The process roles of Keel: one row per role, everything else derives from this table.

A row says, for one role: its config dataclass (``common.config``), its service class as
an import string (``common/`` never imports ``services/``), the config fields holding
the endpoints it binds, the config fields a cluster spec sets itself (naming them in a
spec table is an error), the nested tables of its config (model name -> options), the
field whose endpoint answers a Status request, and its start order under supervisord.

``services.serve`` builds a process from a row; ``keel serve`` takes its choices from
``ROLES``; ``from_dict`` builds a role's config from a plain dict; the cluster spec
reads binds, spec-set fields and status endpoints here; ``deploy.supervisor`` reads the
start order. A new role (manager, statemgr) is one new row.

Example
-------
>>> ROLES["dispatcher"].binds
('query_endpoint', 'worker_endpoint')
>>> role("worker").service
'keel.services.worker:Worker'
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

from keel.common import config as cfg


@dataclass(frozen=True)
class Role:
    """One process role of Keel."""

    name: str
    #: the config dataclass (``common.config``)
    config: type
    #: "module:Class" of the process; imported only when a process of this role starts
    service: str
    #: config fields holding the endpoints this role binds (others connect to them)
    binds: tuple[str, ...] = ()
    #: config fields a cluster spec sets itself (name, endpoints, models, ports...)
    spec_sets: frozenset[str] = frozenset()
    #: config field -> dataclass of each value of that table (model name -> options)
    nested: dict[str, type] = field(default_factory=dict)
    #: config field whose endpoint answers a Status request; None = this role answers none
    status: str | None = None
    #: supervisord starts lower numbers first: what others connect to comes up first
    priority: int = 500

    def service_class(self) -> type:
        """The process class (imports its module)."""
        module, _, name = self.service.partition(":")
        return getattr(importlib.import_module(module), name)

    def build(self, config: Any) -> Any:
        """The process of this role for ``config``."""
        return self.service_class()(config)


_COMMON_SET = {"name", "metrics_port"}

ROLES: dict[str, Role] = {r.name: r for r in (
    Role("frontend", cfg.FrontendConfig, "keel.services.frontend:Frontend",
         binds=("client_endpoint", "local_client_endpoint", "prediction_endpoint"),
         spec_sets=frozenset(_COMMON_SET | {"client_endpoint", "local_client_endpoint", "prediction_endpoint",
                                            "dispatcher_query_endpoint", "models",
                                            "graphs"}),
         nested={"models": cfg.ModelInfo, "graphs": cfg.GraphRouteConfig}, status="client_endpoint", priority=300),
    Role("dispatcher", cfg.DispatcherConfig, "keel.services.dispatcher:Dispatcher",
         binds=("query_endpoint", "worker_endpoint"),
         spec_sets=frozenset(_COMMON_SET | {"query_endpoint", "worker_endpoint", "encoder_endpoint", "models",
                                            "serf_hosts", "serf_store", "serf_run_dir", "serf_names"}),
         nested={"models": cfg.BatchPolicy}, status="worker_endpoint", priority=100),
    Role("worker", cfg.WorkerConfig, "keel.services.worker:Worker",
         binds=("status_endpoint",), status="status_endpoint",
         spec_sets=frozenset(_COMMON_SET | {"status_endpoint",
             "model", "version", "role", "store", "store_name", "builtin", "builtin_input_shape",
             "builtin_output_size", "fixed_ms", "per_query_ms", "dispatcher_worker_endpoint", "decoder_endpoint",
             "max_batch", "store_endpoints"}),
         priority=400),
    Role("encoder", cfg.EncoderConfig, "keel.services.encoder:Encoder",
         binds=("batch_endpoint", "status_endpoint"), status="status_endpoint",
         spec_sets=frozenset(_COMMON_SET | {"batch_endpoint", "status_endpoint", "dispatcher_query_endpoint", "parity_models",
                                            "encoder"}),
         priority=200),
    Role("decoder", cfg.DecoderConfig, "keel.services.decoder:Decoder",
         binds=("endpoint", "status_endpoint"), status="status_endpoint",
         spec_sets=frozenset(_COMMON_SET | {"endpoint", "status_endpoint", "parity_versions"}), priority=200),
    Role("manager", cfg.ManagerConfig, "keel.services.manager.service:Manager",
         binds=("endpoint", "publish_endpoint"), status="endpoint",
         spec_sets=frozenset(_COMMON_SET | {"raft_address", "raft_partners", "endpoint", "publish_endpoint",
                                            "journal_file", "preferred_leader"}),
         priority=50),
    Role("gateway", cfg.GatewayConfig, "keel.services.gateway:Gateway",
         binds=("status_endpoint",), status="status_endpoint",
         spec_sets=frozenset(_COMMON_SET | {"status_endpoint", "frontend_endpoints", "models"}),
         nested={"models": cfg.ModelInfo}, priority=450),
    # HAMS service graphs: a stateful operator's primary and backup (each with its statemgr) and
    # stateless operators are one role; the frontends (their graph route) number and hold requests.
    Role("graph_operator", cfg.GraphOperatorConfig, "keel.services.graph.operator:GraphOperator",
         binds=("endpoint", "status_endpoint"), status="status_endpoint",
         spec_sets=frozenset(_COMMON_SET | {"endpoint", "status_endpoint", "operator", "role", "epoch", "graph", "peers",
                                            "frontends"}),
         priority=350),
    # models by content across hosts: serves the host's store to workers that lack a version
    Role("store", cfg.StoreConfig, "keel.services.store:StoreService",
         binds=("endpoint", "status_endpoint"), status="status_endpoint",
         spec_sets=frozenset(_COMMON_SET | {"endpoint", "status_endpoint", "store"}), priority=20),
)}


def role(name: str) -> Role:
    """The row of role ``name``; an unknown name is a ``ConfigError`` listing the roles."""
    try:
        return ROLES[name]
    except KeyError:
        raise cfg.ConfigError(f"unknown service role {name!r}; roles: {sorted(ROLES)}") from None


def from_dict(name: str, data: dict[str, Any]) -> Any:
    """The validated config of role ``name`` from a plain dict; unknown keys and values of
    the wrong type are errors."""
    row = role(name)
    data = dict(data)
    for key, nested in row.nested.items():
        if key not in data:
            continue
        if not isinstance(data[key], dict):
            raise cfg.ConfigError(f"{name}: {key} must be a table of model name -> options, got {data[key]!r}")
        data[key] = {model: cfg.make(nested, value, f"{name}: model {model}: ") for model, value in data[key].items()}
    known = {f.name for f in dataclasses.fields(row.config)}
    unknown = set(data) - known
    if unknown:
        raise cfg.ConfigError(f"{name}: unknown option(s) {sorted(unknown)}; options: {sorted(known)}")
    config = cfg.make(row.config, data, f"{name}: ")
    config.validate()
    return config


CONFIGS: dict[str, type] = {r.name: r.config for r in ROLES.values()}
"""role -> its config class"""
