"""A Keel cluster spec started on the hosts of a ``Cluster``.

The spec's ``[hosts]`` names are kept and their addresses replaced by the cluster's
(namespace IPs, or loopback addresses in local mode); each service's argv runs on its
host in its own process group with its log under the run directory. ``start`` returns
once every frontend answers a status request and the dispatcher has every worker
registered, asked from inside the client host so that netns mode needs no route from
the root namespace.

Example
-------
>>> dep = Deployment(cluster, spec_dict, probe_host="client").start(timeout_s=60)  # doctest: +SKIP
>>> dep.frontends                                                                  # doctest: +SKIP
['tcp://10.213.0.2:7000']
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

from keel.chaos.hosts import Cluster
from keel.chaos.netns import in_netns
from keel.chaos.resources import ChaosError
from keel.common.waiting import wait_until

MODES = ("none", "equal", "parm")


def spec_for_mode(spec: dict, mode: str, overrides: dict | None = None) -> dict:
    """The spec with ``mode`` applied: ``overrides`` deep-merged when given, else every
    model that has ``k`` gets ``mode = MODE`` (ParM vs Equal-Resources, §6.1)."""
    out = copy.deepcopy(spec)
    if overrides:
        deep_merge(out, overrides)
        return out
    if mode not in MODES:
        raise ChaosError(f"mode {mode!r} is not one of {MODES}; give [mode_overrides.{mode}] to define it")
    for model in out.get("models", {}).values():
        if model.get("k"):
            model["mode"] = mode
    return out


def deep_merge(dst: dict, src: dict) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            deep_merge(dst[key], value)
        else:
            dst[key] = copy.deepcopy(value)


def status_in(cluster: Cluster, host: str, endpoint: str, timeout_s: float) -> dict | None:
    """``request_status`` asked from inside ``host`` (a fresh ZeroMQ context made there,
    so its I/O thread, which opens the TCP connection, lives in that namespace)."""
    import zmq

    from keel.common.transport import request_status

    def ask() -> dict | None:
        ctx = zmq.Context()
        try:
            return request_status(endpoint, timeout_s, ctx=ctx)
        finally:
            ctx.term()

    return in_netns(cluster.host(host).ns, ask)


class Deployment:
    def __init__(self, cluster: Cluster, spec: dict, probe_host: str, supervised: list[str] | tuple[str, ...] = ()):
        from keel.common.spec import load_spec

        self.cluster, self.probe_host, self.supervised = cluster, probe_host, list(supervised)
        self.raw = spec
        hosts = list(spec.get("hosts", {"local": None}))
        missing = [h for h in hosts if h not in cluster.hosts]
        if missing:
            raise ChaosError(f"spec hosts {missing} are not hosts of the cluster {sorted(cluster.hosts)}")
        self.spec = load_spec(spec, {h: cluster.addresses[h] for h in hosts})
        self.frontends = list(self.spec.client_endpoints)

    def start(self, timeout_s: float = 60.0) -> Deployment:
        for host, launches in self.spec.by_host().items():
            if host in self.supervised:  # as `keel up` runs them: supervisord restarts what dies
                from keel.chaos.supervised import SupervisedHost

                self.cluster.supervised[host] = SupervisedHost(self.cluster, host, self.spec, launches)
                self.cluster.supervised[host].start(timeout_s)
                continue
            for svc in launches:
                self.cluster.spawn(host, svc.argv(), svc.name, kind="service")
        pending: list[str] = []

        def ready() -> bool:
            dead = [p.name for h in self.cluster.hosts for p in self.cluster.host(h).procs
                    if p.kind == "service" and not p.running()]
            if dead:
                raise ChaosError(f"services exited during start-up: {dead}; logs in {self.cluster.run_dir / 'logs'}")
            pending[:] = self.spec.unready(lambda ep: status_in(self.cluster, self.probe_host, ep, 0.5))
            return not pending

        if not wait_until(ready, timeout_s, interval_s=0.05):
            raise ChaosError(f"not ready after {timeout_s} s: {sorted(pending)}; logs in {self.cluster.run_dir / 'logs'}")
        return self

    def predictors(self, models: list[str]) -> dict[str, Any]:
        """Offline predictors of ``models``, built as their deployed workers build them
        (builtin costs set to zero: they change the time a prediction takes, not its value);
        a store model also has one per store version, keyed ``model@version``."""
        from keel.common.containers import build_predictor

        out = {}
        for svc in self.spec.role("worker"):
            cfg = svc.config
            if cfg.model in models and cfg.role == "deployed" and cfg.model not in out:
                if cfg.builtin:
                    cfg = dataclasses.replace(cfg, fixed_ms=0.0, per_query_ms=0.0)
                out[cfg.model] = build_predictor(cfg)
                if not cfg.builtin:  # a store model: every version, as "model@version", for rollouts
                    from keel.common.modelstore import ModelStore

                    for version in ModelStore(cfg.store).versions(cfg.store_name or cfg.model):
                        out[f"{cfg.model}@{version}"] = build_predictor(dataclasses.replace(cfg, version=version))
        return out

    def input_shape(self, model: str) -> list[int]:
        return list(self.spec.models[model]["input_shape"])
