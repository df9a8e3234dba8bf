"""``keel render-k8s``: the manifests that run a spec on Kubernetes, checked without a
cluster: each against the Kubernetes OpenAPI schema (the ``kubernetes-validate``
package ships it: offline) and their wiring (every endpoint a process binds or
connects to is a port of a Service that exists)."""
from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import orjson
import pytest

from keel.common.spec import SpecError
from keel.deploy.k8s import render, write
from keel.deploy.k8s_check import pods, schema_errors, wiring_errors

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
#: every example whose models need no store here (local.toml's are trained first)
SPECS = ["noop", "parm", "gateway", "manager", "selection", "hams-gru", "hams-join", "front-door"]


def spec(name: str) -> dict:
    raw = tomllib.loads((EXAMPLES / f"{name}.toml").read_text())
    if "manager" in raw:
        raw["manager"]["password"] = "not-a-secret"  # Raft across pods needs one
    return raw


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict]:
    return {name: render(spec(name), image="registry.example/keel:1") for name in SPECS}


def kinds(manifests: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for doc in manifests.values():
        if isinstance(doc, dict):
            out.setdefault(doc["kind"], set()).add(doc["metadata"]["name"])
    return out


@pytest.mark.parametrize("name", SPECS)
def test_every_manifest_is_valid_kubernetes_and_every_endpoint_is_a_service(rendered, name):
    pytest.importorskip("kubernetes_validate", reason="the k8s extra (pip install 'keel[k8s]') ships the schemas")
    manifests = rendered[name]
    assert schema_errors(manifests) == []
    assert wiring_errors(manifests) == []


def test_stateless_processes_are_deployments_stateful_ones_statefulsets(rendered):
    k = kinds(rendered["manager"])
    assert k["StatefulSet"] == {"manager"}
    assert {"frontend", "dispatcher", "dispatcher-b", "worker-noop-0", "worker-noop-1"} == k["Deployment"]
    assert k["Service"] == k["Deployment"] | {"manager"}
    manager = rendered["manager"]["service-manager.json"]
    assert manager["spec"]["clusterIP"] == "None" and manager["spec"]["publishNotReadyAddresses"]
    k = kinds(rendered["hams-join"])  # stateful operators: primary and backup; stateless: a Deployment
    assert {"op-g", "op-mix"} <= k["StatefulSet"] and "op-m" in k["Deployment"]


def test_statefulset_members_share_ports_and_reach_each_other_by_stable_names(rendered):
    configs = {address: config for _, address, _, config in pods(rendered["manager"]) if address.startswith("manager-")}
    assert sorted(configs) == ["manager-0.manager", "manager-1.manager", "manager-2.manager"]
    ports = {a: c["raft_address"].rsplit(":", 1)[1] for a, c in configs.items()}
    assert len(set(ports.values())) == 1  # one pod template
    assert {c["metrics_port"] for c in configs.values()} == {rendered["manager"]["statefulset-manager.json"][
        "spec"]["template"]["spec"]["containers"][0]["ports"][-1]["containerPort"]}
    one = configs["manager-0.manager"]
    assert set(one["raft_partners"]) == {f"manager-1.manager:{ports['manager-1.manager']}",
                                         f"manager-2.manager:{ports['manager-2.manager']}"}
    assert one["journal_file"].startswith("/var/lib/keel/run/")  # on the member's volume claim
    primary, backup = [c for _, a, _, c in pods(rendered["hams-gru"]) if a.startswith("op-g2-")]
    assert (primary["role"], backup["role"]) == ("primary", "backup")


def test_pods_bind_every_interface_advertise_their_names_and_are_probed(rendered):
    manifests = rendered["gateway"]
    for doc in manifests.values():
        if isinstance(doc, dict) and doc["kind"] == "Deployment":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["KEEL_BIND"] == "*" and env["KEEL_METRICS_ADDRESS"] == "0.0.0.0"
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["image"] == "registry.example/keel:1"
    gateway = orjson.loads(manifests["00-configmap.json"]["data"]["gateway.json"])
    assert gateway["http_host"] == "0.0.0.0" and all(ep.startswith("tcp://frontend:") for ep in gateway["frontend_endpoints"])
    assert gateway["http_port"] in {p["port"] for p in manifests["service-gateway.json"]["spec"]["ports"]}
    assert "spec.json" in manifests["00-configmap.json"]["data"]  # the spec itself


def test_workers_request_cpu_memory_and_a_gpu_when_their_device_is_one():
    raw = spec("noop")
    raw.setdefault("worker", {}).update(slots=2, torch_threads=2, device="cuda")
    manifests = render(raw, worker_memory="3Gi")
    worker = manifests["deployment-worker-noop-0.json"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert worker["requests"] == {"cpu": "4", "memory": "3Gi", "nvidia.com/gpu": "1"}
    assert worker["limits"]["nvidia.com/gpu"] == "1"
    frontend = manifests["deployment-frontend.json"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in frontend["requests"]


def test_a_missing_service_or_port_is_a_wiring_error(rendered):
    manifests = copy.deepcopy(rendered["noop"])
    del manifests["service-dispatcher.json"]
    errors = wiring_errors(manifests)
    assert any("connects to dispatcher:" in e and "no Service dispatcher" in e for e in errors), errors
    manifests = copy.deepcopy(rendered["manager"])
    manifests["statefulset-manager.json"]["spec"]["replicas"] = 2
    assert any("no StatefulSet manager with a member 2" in e for e in wiring_errors(manifests))


def test_a_manifest_kubernetes_would_refuse_is_a_schema_error(rendered):
    pytest.importorskip("kubernetes_validate", reason="the k8s extra (pip install 'keel[k8s]') ships the schemas")
    manifests = copy.deepcopy(rendered["noop"])
    manifests["deployment-frontend.json"]["spec"]["replicas"] = "one"
    manifests["service-frontend.json"]["spec"]["prots"] = []
    errors = schema_errors(manifests)
    assert len(errors) == 2 and any("replicas" in e for e in errors) and any("prots" in e for e in errors), errors


def test_raft_across_pods_needs_a_password():
    raw = tomllib.loads((EXAMPLES / "manager.toml").read_text())
    with pytest.raises(SpecError, match="set \\[manager\\] password"):
        render(raw)


def test_render_k8s_writes_the_folder(tmp_path, capsys):
    from keel.deploy.keel import main

    assert main(["render-k8s", str(EXAMPLES / "noop.toml"), "--out", str(tmp_path / "k8s")]) == 0
    files = sorted(p.name for p in (tmp_path / "k8s").iterdir())
    assert "Containerfile" in files and "00-configmap.json" in files and "deployment-dispatcher.json" in files
    assert "kubectl apply -f" in capsys.readouterr().out
    text = orjson.loads((tmp_path / "k8s" / "00-configmap.json").read_text())["data"]["spec.toml"]
    assert text == (EXAMPLES / "noop.toml").read_text()
    assert write({"x.json": {"a": 1}}, tmp_path / "w")[0].read_text() == '{\n  "a": 1\n}\n'


def test_store_models_get_a_store_service_and_hops_stay_tcp():
    from keel.deploy.k8s import _prepared

    raw = {"hosts": {"a": "10.0.0.1"}, "models": {"digits": {"store_name": "digits-mlp"}}}
    prepared = _prepared(raw)
    assert prepared["store"] == {"hosts": ["a"]}  # workers fetch by content into their empty store
    assert prepared["cluster"]["ipc"] is False and prepared["cluster"]["metrics_base_port"] == 9100
    assert "store" not in raw and "cluster" not in raw  # the caller's spec is left as it was
    assert "store" not in _prepared({"models": {"m": {"builtin": "noop"}}})
