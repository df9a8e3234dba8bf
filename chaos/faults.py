"""Fault plans (a TOML timeline or a seeded random draw) and the runner that applies them.

Kinds and their keys (``at_s`` is seconds after the workload starts):

================  ============================================================
kill              host; ``restart_after_s`` brings its services back
freeze / thaw     host (SIGSTOP / SIGCONT); freeze takes ``duration_s``
restart           host: kill, then start its services with the same argv
crash             host, ``service``: SIGKILL that one service of a host that runs
                  under supervisord (the experiment's ``supervised``), which
                  restarts it (``chaos.supervised``)
partition / heal  host (its link down / up); partition takes ``duration_s``
shuffle           ``hosts`` (default: all), ``concurrent`` (4), ``size_mb``
                  ([128, 256]), ``duration_s`` (required), ``link_mbit``
delay / undelay   host, ``delay_ms``, ``jitter_ms``; needs a proxy on the link
limit             host, ``mbit`` (a new tbf rate; 0 removes the limit)
rollout           ``model``, ``version`` (default the store's latest;
                  ``"previous"`` rolls back): ``keel model rollout`` of the
                  deployment, its workers one at a time, asked from the client
                  host
================  ============================================================

Timeline form::

    [[faults]]
    at_s = 5.0
    kind = "kill"
    host = "w1"

Random form (Poisson arrivals per kind; ``rates`` are events per second)::

    [faults_random]
    seed = 3
    duration_s = 30
    hosts = ["w1", "w2"]
    rates = { freeze = 0.1, kill = 0.02 }
    freeze = { duration_s = 1.0 }      # per-kind keys, as in the timeline

Every applied fault is logged with its wall-clock time, per deployment (mode).
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from keel.chaos.hosts import Cluster, Unsupported
from keel.chaos.resources import ChaosError
from keel.chaos.shuffle import ShuffleLoad

KINDS = ("kill", "freeze", "thaw", "restart", "partition", "heal", "shuffle", "delay", "undelay", "limit", "rollout",
         "crash")
_HOST_KINDS = set(KINDS) - {"shuffle", "rollout"}
# a fault with duration_s is undone by this kind at at_s + duration_s
_UNDO = {"freeze": "thaw", "partition": "heal", "delay": "undelay"}
MAX_PLAN_S = 3600.0


class PlanError(ValueError):
    """A fault plan that names an unknown kind or host, or misses a required key."""


@dataclass(order=True)
class Fault:
    at_s: float
    kind: str = field(compare=False)
    host: str | None = field(default=None, compare=False)
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class FaultPlan:
    faults: list[Fault]
    seed: int = 0

    @classmethod
    def from_config(cls, exp: dict, hosts: list[str], seed: int = 0) -> FaultPlan:
        """The plan of an experiment table: ``[[faults]]`` and/or ``[faults_random]``."""
        faults = [parse_fault(f, hosts, f"faults[{i}]") for i, f in enumerate(exp.get("faults", []))]
        rnd = exp.get("faults_random")
        if rnd:
            faults += random_plan(rnd, hosts, int(rnd.get("seed", seed))).faults
        return cls(expand(faults), seed)

    def to_list(self) -> list[dict]:
        return [f.to_dict() for f in self.faults]


def parse_fault(data: dict, hosts: list[str], where: str = "fault") -> Fault:
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in KINDS:
        raise PlanError(f"{where}.kind: must be one of {list(KINDS)}, got {kind!r}")
    try:
        at_s = float(data.pop("at_s"))
    except KeyError:
        raise PlanError(f"{where}.at_s: required") from None
    if not 0 <= at_s <= MAX_PLAN_S:
        raise PlanError(f"{where}.at_s: must be in [0, {MAX_PLAN_S}]")
    host = data.pop("host", None)
    if kind in _HOST_KINDS and host not in hosts:
        raise PlanError(f"{where}.host: {kind} needs one of {hosts}, got {host!r}")
    if kind == "shuffle":
        listed = data.setdefault("hosts", list(hosts))
        if len(listed) < 2 or any(h not in hosts for h in listed):
            raise PlanError(f"{where}.hosts: a shuffle needs two or more of {hosts}, got {listed}")
        if "duration_s" not in data:
            raise PlanError(f"{where}.duration_s: a shuffle must be bounded")
        data.setdefault("concurrent", 4)
        data.setdefault("size_mb", [128, 256])
    if kind == "delay" and "delay_ms" not in data:
        raise PlanError(f"{where}.delay_ms: required")
    if kind == "limit" and "mbit" not in data:
        raise PlanError(f"{where}.mbit: required")
    if kind == "crash" and not isinstance(data.get("service"), str):
        raise PlanError(f"{where}.service: a crash names the service it kills")
    if kind == "rollout" and not isinstance(data.get("model"), str):
        raise PlanError(f"{where}.model: a rollout names the model whose workers move")
    if float(data.get("duration_s", 0)) < 0:
        raise PlanError(f"{where}.duration_s: must be >= 0")
    return Fault(at_s, kind, host, data)


def expand(faults: list[Fault]) -> list[Fault]:
    """Add the undoing fault of each timed one (freeze -> thaw, kill -> restart...), sorted."""
    out = list(faults)
    for f in faults:
        if f.kind in _UNDO and "duration_s" in f.params:
            out.append(Fault(f.at_s + float(f.params["duration_s"]), _UNDO[f.kind], f.host, {"undoes": f.kind}))
        if f.kind == "kill" and "restart_after_s" in f.params:
            out.append(Fault(f.at_s + float(f.params["restart_after_s"]), "restart", f.host, {"undoes": "kill"}))
    return sorted(out)


def random_plan(cfg: dict, hosts: list[str], seed: int) -> FaultPlan:
    """Poisson fault arrivals per kind over ``duration_s``, reproducible from ``seed``."""
    rng = random.Random(seed)
    duration = float(cfg.get("duration_s", 0))
    if not 0 < duration <= MAX_PLAN_S:
        raise PlanError(f"faults_random.duration_s: must be in (0, {MAX_PLAN_S}]")
    eligible = cfg.get("hosts", hosts)
    faults = []
    for kind, rate in sorted(cfg.get("rates", {}).items()):
        if kind not in KINDS:
            raise PlanError(f"faults_random.rates.{kind}: unknown kind; kinds: {list(KINDS)}")
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= duration:
                break
            data = {"kind": kind, "at_s": round(t, 3), **cfg.get(kind, {})}
            if kind in _HOST_KINDS:
                data["host"] = rng.choice(eligible)
            faults.append(parse_fault(data, hosts, f"faults_random.{kind}"))
    return FaultPlan(sorted(faults), seed)


class FaultRunner:
    """Applies a plan to one or more clusters (one per mode) on a background thread.

    ``proxies[label][host]`` are the delay proxies placed on links (delay faults need one).
    ``specs[label]`` is the deployed spec and ``probe_host`` the host operator commands run
    from (rollout faults need both). ``events`` lists every applied fault: wall time, time
    since start, mode, outcome.
    """

    def __init__(self, plan: FaultPlan, clusters: dict[str, Cluster], proxies: dict[str, dict] | None = None,
                 specs: dict[str, Any] | None = None, probe_host: str = "client"):
        self.plan, self.clusters, self.proxies = plan, clusters, proxies or {}
        self.specs, self.probe_host = specs or {}, probe_host
        self.events: list[dict] = []
        self.loads: list[ShuffleLoad] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fault-runner", daemon=True)
        self.t0 = 0.0
        self.lock = threading.Lock()

    def start(self, t0: float | None = None) -> FaultRunner:
        """Start the timeline at wall time ``t0`` (default now)."""
        self.t0 = time.time() if t0 is None else t0
        self.thread.start()
        return self

    def _run(self) -> None:
        for fault in self.plan.faults:
            if self.stopping.wait(max(0.0, self.t0 + fault.at_s - time.time())):
                return
            for label, cluster in self.clusters.items():
                self.apply(fault, label, cluster)

    def apply(self, fault: Fault, label: str, cluster: Cluster) -> dict:
        """Apply one fault now and log it; failures are logged, never raised."""
        t = time.time()
        event = {"t_wall": t, "t_rel": t - self.t0 if self.t0 else 0.0, "at_s": fault.at_s, "mode": label,
                 "kind": fault.kind, "host": fault.host, "params": fault.params, "ok": True, "detail": ""}
        try:
            detail = self._do(fault, label, cluster)
            if isinstance(detail, dict):  # a crash: what the report's restart figures start from
                event["crash"], detail = detail, f"SIGKILL {detail['service']} (pid {detail['pid']})"
            event["detail"] = detail
        except Unsupported as exc:
            event.update(ok=None, detail=f"skipped: {exc}")
        except (ChaosError, OSError, ValueError) as exc:
            event.update(ok=False, detail=f"{type(exc).__name__}: {exc}")
        with self.lock:
            self.events.append(event)
        return event

    def _do(self, f: Fault, label: str, c: Cluster) -> str | dict:
        p = f.params
        if f.kind == "kill":
            return f"killed pids {c.kill_host(f.host)}"
        if f.kind == "crash":
            if f.host not in c.supervised:
                raise ChaosError(f"crash: {f.host} does not run under supervisord (list it in the experiment's supervised)")
            return c.supervised[f.host].crash(p["service"])
        if f.kind == "freeze":
            return f"stopped pids {c.freeze_host(f.host)}"
        if f.kind == "thaw":
            return f"continued pids {c.thaw_host(f.host)}"
        if f.kind == "restart":
            return f"started {[proc.name for proc in c.restart_host(f.host)]}"
        if f.kind == "partition":
            c.partition(f.host)
            return "link down"
        if f.kind == "heal":
            c.heal(f.host)
            return "link up"
        if f.kind == "limit":
            c.set_link_limit(f.host, float(p["mbit"]) or None)
            return f"tbf {p['mbit']} mbit"
        if f.kind in ("delay", "undelay"):
            proxy = self.proxies.get(label, {}).get(f.host)
            if proxy is None:
                raise Unsupported(f"no delay proxy on {f.host}'s links (declare the host in the experiment's proxied hosts)")
            delay, jitter = (float(p["delay_ms"]), float(p.get("jitter_ms", 0.0))) if f.kind == "delay" else (0.0, 0.0)
            proxy.set_delay(delay, jitter)
            return f"delay {delay} ms +- {jitter} ms"
        if f.kind == "shuffle":
            if "link_mbit" in p:
                for h in p["hosts"]:
                    c.set_link_limit(h, float(p["link_mbit"]))
            size = tuple(p["size_mb"])
            load = ShuffleLoad(c, p["hosts"], int(p["concurrent"]), (float(size[0]), float(size[-1])),
                               float(p["duration_s"]), seed=int(p.get("seed", self.plan.seed)),
                               max_s=float(p.get("max_s", 60.0))).start()
            with self.lock:
                self.loads.append(load)
            return f"{p['concurrent']} concurrent shuffles among {p['hosts']} for {p['duration_s']} s"
        if f.kind == "rollout":
            return self._rollout(p, label, c)
        raise PlanError(f"unknown fault kind {f.kind!r}")

    def _rollout(self, p: dict, label: str, c: Cluster) -> str:
        """``keel model rollout`` (or rollback) of one deployment, from the probe host."""
        import zmq

        from keel.chaos.netns import in_netns
        from keel.deploy.model_cli import RolloutError, previous_version, rollout

        spec = self.specs.get(label)
        if spec is None:
            raise Unsupported("no deployed spec given to the fault runner")

        def move() -> str:
            ctx = zmq.Context()  # made here: its I/O thread lives in the probe host's namespace
            try:
                version = p.get("version")
                if version == "previous":
                    version = previous_version(spec, p["model"], ctx)
                return rollout(spec, p["model"], None if version is None else str(version), float(p.get("timeout_s", 30.0)),
                               log=lambda _msg: None, ctx=ctx)
            finally:
                ctx.destroy(linger=0)

        try:
            return f"{p['model']}: every worker serves version {in_netns(c.host(self.probe_host).ns, move)}"
        except RolloutError as exc:
            raise ChaosError(f"rollout stopped: {exc}") from None

    def wait(self, timeout: float) -> bool:
        """Wait for the timeline to finish (shuffle loads may still run); True if it did."""
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def stop(self) -> list[dict]:
        """Stop the timeline and every shuffle; thaw frozen hosts and heal cut links."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(10.0)
        shuffles = []
        for load in self.loads:
            shuffles += [r.to_dict() for r in load.stop()]
        for cluster in self.clusters.values():
            for host in cluster.hosts.values():
                if host.frozen:
                    cluster.thaw_host(host.name)
            if cluster.network is not None:
                for host in list(cluster.network.down):
                    cluster.heal(host)
        return shuffles
