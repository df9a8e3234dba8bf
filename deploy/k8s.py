"""``keel render-k8s SPEC --out DIR``: the Kubernetes manifests that run a cluster spec.

A spec names hosts; Kubernetes places pods. So the spec is wired as usual (TCP hops, no
``ipc``: every process has a pod of its own), then each endpoint's host is replaced by
the stable name of the pod that binds it, and every process binds ``*`` while it
advertises that name (``keel serve --bind``, ``common.transport``):

- a **Deployment** of one replica per stateless process (frontends, the gateway,
  dispatchers, encoder, decoder, workers, stateless graph operators), each behind a
  **Service** of its own name exposing the ports it binds and its metrics port. One per
  process, not one per role with ``replicas: n``: each worker has its own identity at the
  dispatcher (its name, its SERF host, its Kairos instance), so ``workers`` in the spec
  stays the one place that scales a model.
- a **StatefulSet** with a headless Service (stable names ``SET-0.SET``) for the manager's
  Raft replicas, for each stateful graph operator (ordinal 0 the primary, 1 the backup)
  and for the store service (models by content: workers fetch what their empty store
  lacks; a spec with store models and no ``[store]`` gets one); each member's config is
  chosen by its pod name, and its data (Raft journal, store) is on a volume claim.
- the spec and every process's config in a **ConfigMap**; probes on ``/healthz`` and
  ``/readyz`` of each metrics port; workers request CPU (slots x torch threads), memory
  and ``nvidia.com/gpu`` when their device is a GPU.
- ``Containerfile``: the image every pod runs (``--image``).

``deploy.k8s_check`` validates the manifests against the Kubernetes OpenAPI schemas
(the ``k8s`` extra, offline) and checks that every endpoint a process connects to is a
port of a Service that exists.

Example
-------
::

    keel render-k8s deploy/examples/noop.toml --out k8s/ --image registry.example/keel:0.1
    kubectl apply -f k8s/
"""
from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import orjson

from keel.common import config as cfg
from keel.common import operations
from keel.common.roles import ROLES, from_dict
from keel.common.spec import ClusterSpec, SpecError, load_spec
from keel.common.spec.tables import read_source

#: where a pod keeps the spec's run folder and model store, and the configs and keys
DATA, CONFIGS, CURVE = "/var/lib/keel", "/etc/keel", "/etc/keel-curve"
#: metrics (and health) port base when the spec sets none: probes need one
METRICS_BASE = 9100
_DNS = re.compile(r"[^a-z0-9-]+")


def k8s_name(name: str) -> str:
    """A DNS-1123 label for a Keel name (lower case, '-' for anything else)."""
    out = _DNS.sub("-", name.lower()).strip("-")[:63].rstrip("-")
    if not out:
        raise SpecError(f"{name!r} gives no Kubernetes name")
    return out


@dataclasses.dataclass
class Workload:
    """One Deployment (one member) or StatefulSet (members in ordinal order)."""

    name: str
    kind: str  # "Deployment" or "StatefulSet"
    members: list  # ServiceLaunch, in ordinal order

    def address(self, i: int) -> str:
        """The stable name other pods reach member ``i`` by."""
        return self.name if self.kind == "Deployment" else f"{self.name}-{i}.{self.name}"

    def config_key(self, i: int) -> str:
        return f"{self.name}.json" if self.kind == "Deployment" else f"{self.name}-{i}.json"


def workloads(spec: ClusterSpec) -> list[Workload]:
    """The spec's processes grouped into Deployments and StatefulSets (module docstring)."""
    out: list[Workload] = []
    sets: dict[str, Workload] = {}
    for svc in spec.services:
        role = getattr(svc.config, "role", None)
        if svc.role in ("manager", "store"):
            key = svc.role
        elif svc.role == "graph_operator" and role in ("primary", "backup"):
            key = f"op-{svc.config.operator}"
        else:
            out.append(Workload(k8s_name(svc.name), "Deployment", [svc]))
            continue
        if key not in sets:
            sets[key] = Workload(k8s_name(key), "StatefulSet", [])
            out.append(sets[key])
        # a stateful operator's primary first: ordinal 0 starts as the primary
        sets[key].members.insert(0 if role == "primary" else len(sets[key].members), svc)
    names = [w.name for w in out]
    for name in names:
        if names.count(name) > 1:
            raise SpecError(f"two processes would share the Kubernetes name {name!r}: rename one")
    return out


def bound(svc) -> list[tuple[str, int]]:
    """(address, port) of each TCP endpoint ``svc`` binds (its role's binds, a Raft port)."""
    c = svc.config
    endpoints = [getattr(c, f) for f in ROLES[svc.role].binds] + [g.endpoint for g in getattr(c, "graphs", {}).values()]
    out = []
    for ep in endpoints:
        if ep and ep.startswith("tcp://"):
            address, port = ep[len("tcp://"):].rsplit(":", 1)
            out.append((address, int(port)))
    if getattr(c, "raft_address", ""):
        address, port = c.raft_address.rsplit(":", 1)
        out.append((address, int(port)))
    return out


def _rewrite(value: Any, fn) -> Any:
    """``value`` (a config as plain data) with ``fn`` applied to every string, keys too."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_rewrite(v, fn) for v in value]
    if isinstance(value, dict):
        return {fn(k) if isinstance(k, str) else k: _rewrite(v, fn) for k, v in value.items()}
    return value


def _prepared(source: Any) -> dict:
    """The spec's tables as Kubernetes runs them: TCP hops, metrics ports, a store
    service when store models need one."""
    raw = copy.deepcopy(read_source(source))
    cluster = raw.setdefault("cluster", {})
    cluster["ipc"] = False
    cluster.setdefault("metrics_base_port", METRICS_BASE)
    store_models = any(isinstance(m, dict) and not m.get("builtin") for m in raw.get("models", {}).values())
    if store_models and "store" not in raw:
        raw["store"] = {"hosts": [next(iter(raw.get("hosts", {"local": None})))]}
    return raw


def configs(spec: ClusterSpec, loads: list[Workload]) -> dict[str, tuple[str, dict]]:
    """Config key -> (role, config as plain data) of every pod, its endpoints naming pods."""
    addresses = {}
    for w in loads:
        # every member of a StatefulSet listens on the first's ports (one pod template;
        # the spec numbered them apart only because its hosts shared an address)
        first = [port for _, port in bound(w.members[0])]
        for i, svc in enumerate(w.members):
            for (address, port), own in zip(bound(svc), first):
                addresses[(address, port)] = f"{w.address(i)}:{own}"
    paths = [(spec.run_dir, f"{DATA}/run"), (spec.store, f"{DATA}/store")]

    def fn(text: str) -> str:
        scheme = "tcp://" if text.startswith("tcp://") else ""
        address, _, port = text[len(scheme):].rpartition(":")
        if port.isdigit() and (address, int(port)) in addresses:
            return scheme + addresses[(address, int(port))]
        for old, new in paths:
            if text == old or text.startswith(old + "/"):
                return new + text[len(old):]
        return text

    out = {}
    for w in loads:
        for i, svc in enumerate(w.members):
            data = _rewrite(orjson.loads(cfg.to_json(svc.config)), fn)
            data["metrics_port"] = w.members[0].config.metrics_port
            if svc.role == "gateway":
                data["http_host"] = "0.0.0.0"  # a pod's port, reached through its Service
            try:
                from_dict(svc.role, copy.deepcopy(data))
            except cfg.ConfigError as exc:
                hint = "; set [manager] password: pods reach each other over the pod network" if exc.key == "password" else ""
                raise SpecError(f"{svc.name}: its Kubernetes config is not valid: {exc}{hint}") from None
            out[w.config_key(i)] = (svc.role, data)
    return out


def _ports(svc) -> list[int]:
    ports = [p for _, p in bound(svc)]
    c = svc.config
    ports += [getattr(c, f) for f in ("http_port", "grpc_port") if getattr(c, f, None)]
    return sorted(set(ports))


def _resources(svc, memory: str) -> dict:
    c = svc.config
    if svc.role != "worker":
        return {"requests": {"cpu": "250m", "memory": "256Mi"}}
    cpu = str(max(1, c.slots * c.torch_threads))
    out = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    if c.device.startswith("cuda"):  # one GPU a worker (its CUDA_VISIBLE_DEVICES is the pod's)
        out["requests"]["nvidia.com/gpu"] = out["limits"]["nvidia.com/gpu"] = "1"
    return out


def _container(w: Workload, svc, image: str, memory: str, curve: bool) -> dict:
    config = f"@{CONFIGS}/{w.config_key(0)}" if w.kind == "Deployment" else f"@{CONFIGS}/$(POD_NAME).json"
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "KEEL_BIND", "value": "*"}, {"name": "KEEL_METRICS_ADDRESS", "value": "0.0.0.0"},
           {"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": k, "value": v} for k, v in operations.environment(svc).items()
            if k not in ("KEEL_BIND", "KEEL_METRICS_ADDRESS")]  # log level, tracing: as the spec says
    if curve:
        env.append({"name": "KEEL_CURVE_KEYS", "value": CURVE})
    mounts = [{"name": "config", "mountPath": CONFIGS, "readOnly": True}, {"name": "data", "mountPath": DATA}]
    if curve:
        mounts.append({"name": "curve", "mountPath": CURVE, "readOnly": True})
    metrics = svc.config.metrics_port
    probe = {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5, "failureThreshold": 3}
    return {
        "name": svc.role.replace("_", "-"), "image": image,
        "command": ["python", "-m", "keel.services.serve", svc.role, "--config", config],
        "env": env,
        "ports": [{"name": f"p{p}", "containerPort": p} for p in _ports(svc)]
                 + [{"name": "metrics", "containerPort": metrics}],
        "readinessProbe": probe,
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10, "failureThreshold": 3},
        # a worker loads torch and its model (maybe fetched) before it registers: up to 5 minutes
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 5, "failureThreshold": 60},
        "resources": _resources(svc, memory),
        "volumeMounts": mounts,
    }


def _labels(cluster: str, w: Workload) -> dict:
    return {"app.kubernetes.io/name": "keel", "app.kubernetes.io/instance": cluster, "keel.io/workload": w.name}


def _workload(w: Workload, cluster: str, config_map: str, image: str, memory: str, curve: bool) -> dict:
    svc = w.members[0]
    labels = _labels(cluster, w)
    volumes = [{"name": "config", "configMap": {"name": config_map}}]
    if curve:
        volumes.append({"name": "curve", "secret": {"secretName": f"{cluster}-curve", "defaultMode": 0o440}})
    if w.kind == "Deployment":
        volumes.append({"name": "data", "emptyDir": {}})
    template = {"metadata": {"labels": {**labels, "keel.io/role": svc.role},
                             "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(svc.config.metrics_port)}},
                "spec": {"containers": [_container(w, svc, image, memory, curve)], "volumes": volumes,
                         "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "fsGroup": 65534},
                         "terminationGracePeriodSeconds": 10}}
    spec = {"replicas": len(w.members), "selector": {"matchLabels": labels}, "template": template}
    if w.kind == "StatefulSet":
        spec.update(serviceName=w.name, podManagementPolicy="Parallel",  # Raft replicas find each other
                    volumeClaimTemplates=[{"metadata": {"name": "data"}, "spec": {
                        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}])
    return {"apiVersion": "apps/v1", "kind": w.kind, "metadata": {"name": w.name, "labels": labels}, "spec": spec}


def _service(w: Workload, cluster: str) -> dict:
    svc = w.members[0]
    ports = _ports(svc)
    spec: dict = {"selector": _labels(cluster, w),
                  "ports": [{"name": f"p{p}", "port": p, "targetPort": p} for p in ports]
                           + [{"name": "metrics", "port": svc.config.metrics_port, "targetPort": "metrics"}]}
    if w.kind == "StatefulSet":  # headless: SET-i.SET names each member; known before it is ready (Raft)
        spec.update(clusterIP="None", publishNotReadyAddresses=True)
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": w.name, "labels": _labels(cluster, w)}, "spec": spec}


CONTAINERFILE = """\
# The image every Keel pod runs (`keel render-k8s` wrote this beside the manifests).
# Build it from the Keel source tree, e.g.  podman build -f K8S_DIR/Containerfile -t IMAGE .
FROM python:3.11-slim
WORKDIR /opt/keel
COPY . /opt/keel
# torch first, pinned as scripts/setup.sh pins it (a GPU image: its CUDA build instead)
RUN pip install --no-cache-dir "torch==2.13.0" && pip install --no-cache-dir /opt/keel
# the pods run as this user (their securityContext); their data volume is its group's
USER 65534
"""

def render(source: Any, *, image: str = "keel:latest", worker_memory: str = "1Gi") -> dict[str, dict | str]:
    """File name -> manifest (a dict) or text (the Containerfile) for the spec ``source``."""
    raw = _prepared(source)
    spec = load_spec(raw)
    cluster = k8s_name(spec.name)
    loads = workloads(spec)
    pods = configs(spec, loads)
    config_map = f"{cluster}-config"
    text = Path(source).read_text() if not isinstance(source, dict) else orjson.dumps(source).decode()
    data = {"spec.toml" if not isinstance(source, dict) else "spec.json": text}
    data.update({key: orjson.dumps(config, option=orjson.OPT_INDENT_2).decode() for key, (_, config) in pods.items()})
    out: dict[str, dict | str] = {"00-configmap.json": {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_map, "labels": {"app.kubernetes.io/name": "keel", "app.kubernetes.io/instance": cluster}},
        "data": data}}
    curve = spec.curve_keys is not None
    for w in loads:
        out[f"{w.kind.lower()}-{w.name}.json"] = _workload(w, cluster, config_map, image, worker_memory, curve)
        out[f"service-{w.name}.json"] = _service(w, cluster)
    out["Containerfile"] = CONTAINERFILE
    return out


def write(manifests: dict[str, dict | str], out_dir: str | Path) -> list[Path]:
    """Write what ``render`` made into ``out_dir`` (kubectl apply -f takes the folder)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, body in manifests.items():
        path = out / name
        path.write_text(body if isinstance(body, str) else orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
        written.append(path)
    return written
