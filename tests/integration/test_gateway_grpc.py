"""The OIP v2 gateway's gRPC form against the unmodified ``tritonclient[grpc]``: real
gateway, frontend, dispatcher and worker processes of a spec whose ``[gateway]`` sets
``grpc_port``. Typed ``contents`` (which tritonclient's helpers never send) go through
tritonclient's own generated stub and messages.

This process loads tritonclient's protobuf package ``inference``; the gateway's own
generated modules define the same package, so only the gateway process loads them.
"""
from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import orjson
import pytest

from keel.common.spec import load_spec
from keel.deploy.local import free_port, free_port_block
from keel.deploy.preflight import bound_ports
from keel.deploy.units import render_systemd

grpcclient = pytest.importorskip("tritonclient.grpc")
grpc = pytest.importorskip("grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.slow

DIM, OUT = 8, 4
BODY_LIMIT = 64 * 1024
TOKEN = "carol-3c1d9e7a52"


def models() -> dict:
    # ``sleep`` answers its input's first OUT features; ``noop`` zeros
    return {"echo": {"builtin": "sleep", "input_shape": [DIM], "output_size": OUT, "workers": 1},
            "zeros": {"builtin": "noop", "input_shape": [DIM], "output_size": OUT, "workers": 1}}


@pytest.fixture(scope="module")
def gateway(module_launcher):
    run = module_launcher("gwgrpc")
    http, port = free_port(), free_port()
    spec = load_spec({
        "cluster": {"name": "gwgrpc", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": http, "grpc_port": port, "max_body_bytes": BODY_LIMIT},
        "frontend": {"cache_size": 0},
        "models": {**models(), "slow": {"builtin": "sleep", "fixed_ms": 2000.0, "input_shape": [DIM],
                                        "output_size": OUT, "deadline_ms": 5000}},
        "applications": {"pick": {"models": ["echo", "zeros"], "policy": "exp3"}},
    })
    run.start_spec(spec)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    yield client, port
    client.close()
    assert "request failed" not in run.log_path("gateway").read_text(errors="replace")  # no traceback of its own


def infer(client, x: np.ndarray, model: str = "echo", datatype: str = "FP32", **kwargs):
    inp = grpcclient.InferInput("input", list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], outputs=[grpcclient.InferRequestedOutput("output")], **kwargs)


def refused(code: str, call, *args, **kwargs) -> str:
    """The message of the call's refusal, which must carry gRPC status ``code``."""
    with pytest.raises(InferenceServerException) as exc:
        call(*args, **kwargs)
    assert exc.value.status() == f"StatusCode.{code}", (exc.value.status(), exc.value.message())
    return exc.value.message()


def test_spec_carries_grpc_port_to_the_gateway_and_preflight(tmp_path):
    spec = load_spec({"cluster": {"name": "g", "base_port": 7600, "run_dir": "/tmp/keel-g"},
                      "gateway": {"http_port": 8000, "grpc_port": 8001}, "models": models()})
    assert spec.service("gateway").config.grpc_port == 8001
    assert ("gateway", "grpc_port", "127.0.0.1", 8001) in bound_ports(spec)
    render_systemd(spec, "local", tmp_path, python="/usr/bin/python3", workdir="/srv/keel", etc_dir="/etc/keel")
    assert orjson.loads((tmp_path / "keel" / "gateway.json").read_bytes())["grpc_port"] == 8001
    off = load_spec({"cluster": {"name": "g", "base_port": 7600, "run_dir": "/tmp/keel-g"},
                     "gateway": {"http_port": 8000}, "models": models()})
    assert off.service("gateway").config.grpc_port is None
    assert [w for _, w, _, _ in bound_ports(off) if w == "grpc_port"] == []


def test_a_grpc_port_in_use_stops_the_gateway_at_start():
    """Not shared (grpc's SO_REUSEPORT is off) and not ignored: the gateway says why and exits 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = {"http_port": 0, "grpc_port": port, "frontend_endpoints": ["tcp://127.0.0.1:9"]}
        proc = subprocess.run([sys.executable, "-m", "keel.services.serve", "gateway", "--config",
                               orjson.dumps(config).decode()], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"grpc_port {port}: cannot listen on 127.0.0.1:{port}" in proc.stdout


def test_health_and_metadata(gateway):
    client, _ = gateway
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo") and client.is_model_ready("echo", "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready("echo", "9")
    assert client.get_server_metadata(as_json=True)["name"] == "keel"
    meta = client.get_model_metadata("echo", as_json=True)
    assert meta["versions"] == ["1"] and meta["platform"] == "keel"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [str(-1), str(DIM)]}]
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [str(-1), str(OUT)]}]
    refused("NOT_FOUND", client.get_model_metadata, "nope")
    refused("NOT_FOUND", client.get_model_metadata, "echo", "9")


def test_infer_raw_tensors(gateway):
    client, _ = gateway
    x = np.random.default_rng(1).random((5, DIM), dtype=np.float32)
    result = infer(client, x, request_id="req-7")
    np.testing.assert_allclose(result.as_numpy("output"), x[:, :OUT], rtol=1e-6)
    response = result.get_response()
    assert response.id == "req-7" and response.model_name == "echo" and response.model_version == "1"
    assert response.raw_output_contents and not response.outputs[0].contents.fp32_contents
    assert response.parameters["keel_sources"].string_param == ",".join(["model"] * 5)
    assert response.parameters["keel_versions"].string_param == ",".join(["1"] * 5)
    # another datatype the model can take safely (integers to its FP32) is converted
    ints = np.arange(2 * DIM, dtype=np.int32).reshape(2, DIM)
    np.testing.assert_allclose(infer(client, ints, datatype="INT32").as_numpy("output"), ints[:, :OUT])


def test_infer_typed_contents(gateway):
    _, port = gateway
    x = np.random.default_rng(2).random((3, DIM), dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="echo", id="typed")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request, timeout=30)
        assert not response.raw_output_contents and list(response.outputs[0].shape) == [3, OUT]
        out = np.array(response.outputs[0].contents.fp32_contents, np.float32).reshape(3, OUT)
        np.testing.assert_allclose(out, x[:, :OUT], rtol=1e-6)
        # INT64 values in int64_contents, converted to the model's FP32
        request = service_pb2.ModelInferRequest(model_name="echo")
        request.inputs.add(name="input", datatype="INT64", shape=[1, DIM]).contents.int64_contents.extend(range(DIM))
        response = stub.ModelInfer(request, timeout=30)
        assert list(response.outputs[0].contents.fp32_contents) == list(range(OUT))
        for datatype, field, values, why in (
                ("FP16", "fp32_contents", [0.0] * DIM, "only in raw_input_contents"),
                ("FP32", "fp32_contents", [0.0] * (DIM - 1), "do not fill shape"),
                ("INT8", "int_contents", [300] * DIM, "do not fit INT8")):
            request = service_pb2.ModelInferRequest(model_name="echo")
            getattr(request.inputs.add(name="input", datatype=datatype, shape=[1, DIM]).contents, field).extend(values)
            with pytest.raises(grpc.RpcError) as exc:
                stub.ModelInfer(request, timeout=30)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in exc.value.details(), datatype


def test_pinned_version_and_unknown_model(gateway):
    client, _ = gateway
    x = np.ones((1, DIM), np.float32)
    assert infer(client, x, model_version="1").get_response().model_version == "1"
    assert "version 9 is not served" in refused("NOT_FOUND", infer, client, x, model_version="9")
    assert "unknown model 'nope'" in refused("NOT_FOUND", infer, client, x, model="nope")


def test_bad_input_is_invalid_argument_and_the_gateway_keeps_serving(gateway):
    client, port = gateway
    ok = np.ones((2, DIM), np.float32)
    assert "shape" in refused("INVALID_ARGUMENT", infer, client, np.ones((2, DIM - 1), np.float32))
    assert "NaN" in refused("INVALID_ARGUMENT", infer, client, np.full((1, DIM), np.nan, np.float32))
    bad_type = grpcclient.InferInput("input", [1, DIM], "BYTES")
    bad_type.set_data_from_numpy(np.array([[b"x"] * DIM], dtype=np.object_))
    assert "datatype" in refused("INVALID_ARGUMENT", client.infer, "echo", [bad_type])
    refused("INVALID_ARGUMENT", infer, client, ok, model="echo", parameters={"key": 7})  # a key is a string
    # a raw tensor whose byte count does not hold its shape
    request = service_pb2.ModelInferRequest(model_name="echo")
    request.inputs.add(name="input", datatype="FP32", shape=[1, DIM])
    request.raw_input_contents.append(b"\0" * (4 * DIM - 1))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.RpcError) as exc:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bytes do not hold" in exc.value.details()
    # a message over max_body_bytes is refused by grpc itself, before any decoding
    big = np.ones((BODY_LIMIT // (4 * DIM) + 1, DIM), np.float32)
    refused("RESOURCE_EXHAUSTED", infer, client, big)
    np.testing.assert_allclose(infer(client, ok).as_numpy("output"), ok[:, :OUT])
    assert client.is_server_ready()


def test_deadline_parameter(gateway):
    """tritonclient's ``timeout`` (us) is each row's deadline: a model slower than it is refused in time."""
    client, _ = gateway
    message = refused("DEADLINE_EXCEEDED", infer, client, np.ones((1, DIM), np.float32), model="slow", timeout=300_000)
    assert "deadline" in message
    refused("INVALID_ARGUMENT", infer, client, np.ones((1, DIM), np.float32), model="slow", timeout=-5)


def test_application_with_a_key(gateway):
    client, _ = gateway
    x = np.eye(DIM, dtype=np.float32)[:2]
    result = infer(client, x, model="pick", parameters={"key": "alice"})
    assert result.as_numpy("output").shape == (2, OUT)
    assert set(result.get_response().parameters["keel_sources"].string_param.split(",")) <= {"model", "cache"}
    assert client.is_model_ready("pick")
    meta = client.get_model_metadata("pick", as_json=True)
    assert meta["inputs"][0]["shape"] == [str(-1), str(DIM)] and meta["outputs"][0]["shape"] == [str(-1), str(OUT)]
    assert "takes no key" in refused("INVALID_ARGUMENT", infer, client, x, model="echo", parameters={"key": "alice"})


@pytest.fixture(scope="module")
def guarded(module_launcher, tmp_path_factory):
    """A gateway with TLS and a bearer-token allow-list (the HTTP gateway's files)."""
    from tests.integration.test_gateway_tls import self_signed, write_tokens

    keys = tmp_path_factory.mktemp("keys")
    keys.chmod(0o700)
    cert, key = self_signed(keys)
    tokens = keys / "gateway.tokens"
    write_tokens(tokens, TOKEN)
    run = module_launcher("gwgrpctls")
    port = free_port()
    spec = load_spec({
        "cluster": {"name": "gwgrpctls", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": free_port(), "grpc_port": port, "tls_cert": str(cert), "tls_key": str(key),
                    "tokens_file": str(tokens)},
        "models": {"noop": {"builtin": "noop", "input_shape": [DIM], "output_size": OUT, "workers": 1}},
    })
    run.start_spec(spec)
    client = grpcclient.InferenceServerClient(f"localhost:{port}", ssl=True, root_certificates=str(cert))
    yield client, port, cert
    client.close()


def test_tokens_and_tls(guarded):
    client, port, cert = guarded
    x = np.ones((1, DIM), np.float32)
    # the server health methods are open, as the HTTP health paths
    assert client.is_server_live() and client.is_server_ready()
    assert "Bearer" in refused("UNAUTHENTICATED", infer, client, x, model="noop")
    refused("UNAUTHENTICATED", infer, client, x, model="noop", headers={"authorization": "Bearer not-a-token"})
    refused("UNAUTHENTICATED", client.get_model_metadata, "noop")
    good = {"authorization": f"Bearer {TOKEN}"}
    assert client.is_model_ready("noop", headers=good)
    np.testing.assert_array_equal(infer(client, x, model="noop", headers=good).as_numpy("output"),
                                  np.zeros((1, OUT), np.float32))
    plain = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")  # no TLS: no answer at all
    try:
        with pytest.raises(InferenceServerException) as exc:
            plain.is_server_live(client_timeout=10)
        assert exc.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"), exc.value.status()
    finally:
        plain.close()


def test_graph(module_launcher):
    run = module_launcher("gwgrpcgraph")
    port = free_port()
    graph = {"mode": "nspb", "input_shape": [4], "edges": [["frontend", "m"], ["m", "frontend"]],
             "operators": {"m": {"kind": "mlp", "input_shape": [4], "output_shape": [2]}}}
    spec = load_spec({
        "cluster": {"name": "gwgrpcgraph", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": free_port(), "grpc_port": port},
        "models": {"echo": {"builtin": "sleep", "input_shape": [4], "output_size": 2, "workers": 1}},
        "graph": graph,
    })
    run.start_spec(spec)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert client.is_model_ready("gwgrpcgraph")  # a spec's one [graph] is named after its cluster
        x = np.random.default_rng(3).normal(size=(3, 4)).astype(np.float32)
        result = infer(client, x, model="gwgrpcgraph", parameters={"key": "7"})
        assert result.as_numpy("output").shape == (3, 2)
    finally:
        client.close()


def test_a_full_frontend_is_resource_exhausted_and_the_gateway_keeps_serving(module_launcher):
    """The frontend's admission limit (``overloaded``) comes back as RESOURCE_EXHAUSTED; the
    requests admitted are answered, and the gateway serves the next ones."""
    from concurrent.futures import ThreadPoolExecutor

    run = module_launcher("gwgrpcfull")
    port = free_port()
    spec = load_spec({
        "cluster": {"name": "gwgrpcfull", "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": free_port(), "grpc_port": port},
        "frontend": {"cache_size": 0, "admission_limit": 2},
        "models": {"slow": {"builtin": "sleep", "fixed_ms": 800.0, "max_batch": 1, "input_shape": [DIM],
                            "output_size": OUT, "deadline_ms": 5000, "workers": 1}},
    })
    run.start_spec(spec)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    x = np.ones((1, DIM), np.float32)

    def call(i: int) -> str:
        try:
            infer(client, x + i, model="slow")
            return "OK"
        except InferenceServerException as exc:
            return exc.status()

    try:
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(call, range(8)))
        assert "StatusCode.RESOURCE_EXHAUSTED" in codes and "OK" in codes, codes
        assert set(codes) <= {"OK", "StatusCode.RESOURCE_EXHAUSTED"}, codes
        assert infer(client, x, model="slow").as_numpy("output").shape == (1, OUT)
    finally:
        client.close()
