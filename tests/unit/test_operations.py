"""Operating Keel across hosts: health and readiness on the metrics port, the bind vs
advertised address split, metrics on the host's address, log levels, ``keel logs``."""
from __future__ import annotations

import argparse
import io
import socket
import urllib.error
import urllib.request

import orjson
import pytest
import zmq

from keel.common import logs, metrics, operations, transport
from keel.common.spec import SpecError, load_spec
from keel.common.waiting import wait_until
from keel.deploy.logs import follow, log_paths, show

NOOP = {"m": {"builtin": "noop", "workers": 2}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the probes' TIME_WAIT aside
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_metrics_port_answers_health_readiness_and_metrics():
    m = metrics.Metrics("svc")
    m.counter("things_total", "things", metrics.MODEL_LABELS).labels(model="m", version="2").inc()
    ready = [False]
    port = free_port()
    m.serve(port, ready=lambda: ready[0])
    try:
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/readyz") == (503, "not ready\n")
        ready[0] = True
        assert get(port, "/readyz") == (200, "ok\n")
        status, text = get(port, "/metrics")
        assert status == 200 and 'keel_things_total{model="m",service="svc",version="2"} 1.0' in text
    finally:
        m.close()
    assert wait_until(lambda: port_free(port), 5.0)  # closed: the port is free again


def test_a_failing_readiness_check_is_not_ready():
    m = metrics.Metrics("svc")
    port = free_port()
    m.serve(port, ready=lambda: 1 / 0)
    try:
        assert get(port, "/readyz")[0] == 503
    finally:
        m.close()


def test_model_labels_only_for_a_model_target():
    from keel.common.config import ModelInfo

    models = {"m": ModelInfo(input_shape=[4], output_size=2, version="3")}
    assert metrics.model_labels(models, "m") == {"model": "m", "version": "3"}
    assert metrics.model_labels(models, "app") == {"model": "", "version": ""}


def test_a_host_binds_one_address_and_advertises_another():
    spec = load_spec({"hosts": {"a": {"address": "a.example", "bind": "0.0.0.0"}, "b": "10.1.0.3"},
                      "cluster": {"metrics_base_port": 9100}, "models": {"m": {"builtin": "noop", "hosts": ["b"]}}})
    fe, worker = spec.service("frontend"), spec.service("worker-m-0")
    assert fe.config.client_endpoint.startswith("tcp://a.example:")  # what others connect to
    assert worker.config.dispatcher_worker_endpoint.startswith("tcp://a.example:")
    assert (fe.bind, fe.metrics_address) == ("0.0.0.0", "0.0.0.0")
    assert (worker.bind, worker.metrics_address) == (None, "10.1.0.3")  # another host: its own address
    argv = fe.argv("python")
    assert argv[argv.index("--bind") + 1] == "0.0.0.0" and "--log-level" not in argv


def test_one_machine_keeps_metrics_on_loopback_and_flags_off():
    spec = load_spec({"cluster": {"metrics_base_port": 9100}, "models": NOOP})
    for svc in spec.services:
        assert svc.bind is None and svc.metrics_address is None
        assert "--bind" not in svc.argv("python") and "--metrics-address" not in svc.argv("python")


@pytest.mark.parametrize("hosts, error", [
    ({"a": {"address": "x"}, "b": {"address": "y", "bnd": "0.0.0.0"}}, "hosts.b.bnd: unknown key"),
    ({"a": {"bind": "0.0.0.0"}}, "hosts.a.address: required"),
    ({"a": {"address": "x", "bind": "999.1.1.1"}}, "hosts.a.bind"),
])
def test_a_bad_host_table_names_its_key(hosts, error):
    with pytest.raises(SpecError, match=error.replace(".", r"\.")):
        load_spec({"hosts": hosts, "models": {"m": {"builtin": "noop"}}})


def test_log_levels_per_role_and_per_service():
    spec = load_spec({"logs": {"level": "warning", "worker": "debug", "worker-m-1": "error"}, "models": NOOP})
    levels = {s.name: s.log_level for s in spec.services}
    assert levels == {"frontend": "warning", "dispatcher": "warning", "worker-m-0": "debug", "worker-m-1": "error"}
    with pytest.raises(SpecError, match=r"logs\.wrker: not a role or a service"):
        load_spec({"logs": {"wrker": "debug"}, "models": NOOP})
    with pytest.raises(SpecError, match=r"logs\.level: must be one of"):
        load_spec({"logs": {"level": "loud"}, "models": NOOP})


def test_serve_flags_set_bind_metrics_address_and_log_level(monkeypatch, capsys):
    monkeypatch.setattr(transport, "BIND_ADDRESS", None)
    monkeypatch.setattr(metrics, "ADDRESS", metrics.ADDRESS)
    monkeypatch.setattr(logs, "LEVEL", logs.LEVEL)
    monkeypatch.setenv("KEEL_LOG_LEVEL", "warning")
    parser = argparse.ArgumentParser()
    operations.add_arguments(parser)
    operations.apply(parser.parse_args(["--bind", "127.0.0.1", "--metrics-address", "0.0.0.0"]))
    assert (transport.BIND_ADDRESS, metrics.ADDRESS) == ("127.0.0.1", "0.0.0.0")
    log = logs.setup("svc", json=True)
    log.info("hidden")
    log.warning("shown")
    lines = [orjson.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["event"] for x in lines] == ["shown"]


def test_a_socket_binds_the_bind_address_and_is_reached_there(monkeypatch):
    monkeypatch.setattr(transport, "BIND_ADDRESS", "127.0.0.1")
    port = free_port()
    advertised = f"tcp://192.0.2.1:{port}"  # TEST-NET: not an address of this machine
    assert transport.bind_endpoint(advertised) == f"tcp://127.0.0.1:{port}"
    assert transport.bind_endpoint("ipc://@x") == "ipc://@x"
    ctx = zmq.Context()
    try:
        pull = transport.make_socket(ctx, zmq.PULL, bind=advertised)
        assert transport.endpoint_of(pull) == advertised  # what a reply_to names: the advertised one
        push = transport.make_socket(ctx, zmq.PUSH, connect=f"tcp://127.0.0.1:{port}")
        push.send(b"x")
        assert pull.poll(5000) and pull.recv() == b"x"
        pull.close(), push.close()
    finally:
        ctx.destroy(linger=0)


def test_keel_logs_shows_and_follows_by_service_and_role(tmp_path):
    spec = load_spec({"cluster": {"run_dir": str(tmp_path)}, "models": NOOP})
    (tmp_path / "logs").mkdir()
    for name in ("worker-m-0", "worker-m-1"):
        (tmp_path / "logs" / f"{name}.log").write_text(
            orjson.dumps({"event": "started", "level": "info"}).decode() + "\n"
            + orjson.dumps({"event": "slow", "level": "warning"}).decode() + "\n")
    paths = log_paths(spec, "worker")
    assert list(paths) == ["worker-m-0", "worker-m-1"]
    assert list(log_paths(spec, "frontend")) == ["frontend"]
    with pytest.raises(SpecError, match="no service or role 'wrker'"):
        log_paths(spec, "wrker")
    out = io.StringIO()
    assert show(paths, out, lines=10, level="warning") == 2
    assert out.getvalue().splitlines()[0].startswith("worker-m-0 | ") and '"slow"' in out.getvalue()

    out, rounds = io.StringIO(), [0]

    def stop() -> bool:  # append a line after the first round, stop after the third
        rounds[0] += 1
        if rounds[0] == 2:
            with open(paths["worker-m-1"], "a") as f:
                f.write("a line written later\n")
        return rounds[0] > 3

    follow(paths, out, stop=stop, interval_s=0.01)
    assert out.getvalue() == "worker-m-1 | a line written later\n"


def test_the_dashboard_reads_model_and_version_from_request_metrics_only():
    import json
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "keel-dashboard.json").read_text())
    rollout = [t["expr"] for p in dash["panels"] for t in p["targets"] if "version" in t["expr"]]
    assert len(rollout) >= 3
    for expr in rollout:  # the metrics that carry the labels (frontend requests, worker batches)
        assert set(re.findall(r"keel_[a-z_]+", expr)) <= {
            "keel_requests_total", "keel_request_seconds_bucket", "keel_worker_service_seconds_bucket",
            "keel_worker_batches_total", "keel_worker_batch_size_bucket"}, expr
    assert {"model", "version"} <= {v["name"] for v in dash["templating"]["list"]}


def test_tracing_from_the_spec_reaches_every_service_and_its_environment():
    spec = load_spec({"tracing": {"rate": 0.25, "endpoint": "http://collector:4318/v1/traces"}, "models": NOOP})
    for svc in spec.services:
        argv = svc.argv("python")
        assert argv[argv.index("--trace-rate") + 1] == "0.25"
        assert argv[argv.index("--trace-endpoint") + 1] == "http://collector:4318/v1/traces"
        assert operations.environment(svc)["KEEL_TRACE_RATE"] == "0.25"
    assert all(s.trace_rate is None for s in load_spec({"tracing": {"rate": 0}, "models": NOOP}).services)
    with pytest.raises(SpecError, match=r"tracing\.rate: must be in 0\.\.1"):
        load_spec({"tracing": {"rate": 2.0}, "models": NOOP})
    with pytest.raises(SpecError, match=r"tracing\.endpoint: must be an http"):
        load_spec({"tracing": {"rate": 0.5, "endpoint": "collector:4317"}, "models": NOOP})


def test_a_traceparent_is_checked_on_the_wire():
    import numpy as np

    from keel.common import protocol, tracing
    from keel.common.protocol import Predict

    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert tracing.valid(good) and not tracing.valid("00-xyz") and not tracing.valid(None)
    msg = Predict(request_id="r", model="m", input=np.zeros(2, np.float32), traceparent=good)
    assert protocol.decode(protocol.encode(msg)).traceparent == good
    with pytest.raises(protocol.ProtocolError, match="traceparent"):
        protocol.decode(protocol.encode(Predict(request_id="r", model="m", input=np.zeros(2, np.float32),
                                                traceparent="not-a-context")))


def test_the_gateway_passes_a_valid_traceparent_on_and_ignores_a_malformed_one(monkeypatch):
    import asyncio
    import types

    import numpy as np

    from keel.common.config import GatewayConfig, ModelInfo
    from keel.services.inference import Inference

    seen = []

    class Client:  # the gateway's AsyncClient, as far as infer uses it
        async def predict(self, name, row, **kw):
            seen.append(kw["traceparent"])
            return types.SimpleNamespace(output=np.zeros(2, np.float32), version="1", source="model",
                                         error=None, error_code=None, models=None, confidence=None, latency_ms=1.0)

    inference = Inference(GatewayConfig(models={"m": ModelInfo(input_shape=[4], output_size=2)}), Client())

    async def target(name, version):
        return {"kind": "model", "key": False, "input_shape": [4], "input_dtype": "float32", "versions": ["1"]}

    monkeypatch.setattr(inference, "target_or_spec", target)
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for given in (good, "garbage", None):
        asyncio.run(inference.infer("m", np.zeros((1, 4), np.float32), traceparent=given))
    assert seen == [good, None, None]
