"""One front door, as a user meets it: deploy/examples/front-door.toml (a plain model with
ParM on, an application and a stateful graph) comes up with ``keel up`` under a real
supervisord, and the Python client (sync and async), ``keel predict``, tritonclient's HTTP
client and its gRPC client each reach all three -- keys, a pinned version -- and get the
same answers."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from keel.common.async_client import AsyncClient
from keel.common.client import Client
from keel.common.spec import load_spec
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port, free_port_block

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

if not (Path(sys.executable).parent / "supervisord").exists():
    pytest.skip("supervisord is not installed", allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "front-door.toml"
X = np.arange(1, 9, dtype=np.float32)


@pytest.fixture
def spec_path(tmp_path):
    """The example on free ports and its own run folder; ``keel down`` (and a SIGKILL by pid
    for anything left) at teardown."""
    from keel.deploy import supervisor

    text = EXAMPLE.read_text()
    text = re.sub(r"base_port = \d+", f'base_port = {free_port_block()}\nrun_dir = "{tmp_path / "run"}"', text)
    text = text.replace("http_port = 8000", f"http_port = {free_port()}").replace("grpc_port = 8001",
                                                                                   f"grpc_port = {free_port()}")
    path = tmp_path / "front-door.toml"
    path.write_text(text)
    yield str(path)
    pids = set()
    try:
        server = supervisor.rpc(tmp_path / "run")
        pids = {server.supervisor.getPID(), *(p["pid"] for p in server.supervisor.getAllProcessInfo() if p["pid"])}
    except Exception:
        pass
    keel(["down", str(path), "--wait", "30"])
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_every_door_reaches_a_model_an_application_and_a_graph_alike(spec_path, capsys):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    assert keel(["up", spec_path]) == 0
    spec = load_spec(spec_path)
    gateway = spec.service("gateway").config
    # each door calls the graph on a stream of its own (a fresh state each): the same answer
    calls = {"m": {"version": "1"}, "ensemble": {"key": "alice"}, "chain": {"key": None}}
    answers: dict[str, dict[str, np.ndarray]] = {name: {} for name in calls}
    stream = iter(range(100, 200))

    def args(name: str) -> dict:
        kw = dict(calls[name])
        if name == "chain":
            kw["key"] = str(next(stream))
        return kw

    with Client(spec.client_endpoints, timeout_ms=5000, raise_errors=True) as client:
        for name in calls:
            result = client.predict(name, X, **args(name))
            answers[name]["client"] = result.output
        assert client.predict("m", X).source in ("model", "cache")

    async def async_calls() -> None:
        async with AsyncClient(spec.client_endpoints, timeout_ms=5000, raise_errors=True) as client:
            for name in calls:
                answers[name]["async"] = (await client.predict(name, X, **args(name))).output

    asyncio.run(async_calls())

    capsys.readouterr()
    for name in calls:
        kw = args(name)
        argv = ["predict", "--spec", spec_path, name, "--input", json.dumps(X.tolist())]
        argv += [f"--{k}={v}" for k, v in kw.items()]
        assert keel(argv) == 0
        answers[name]["keel predict"] = np.asarray(json.loads(capsys.readouterr().out)["output"], np.float32)

    http = httpclient.InferenceServerClient(f"127.0.0.1:{gateway.http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway.grpc_port}")
    try:
        for door, module, client in (("http", httpclient, http), ("grpc", grpcclient, grpc)):
            for name in calls:
                assert client.is_model_ready(name)
                kw = args(name)
                tensor = module.InferInput("input", [1, 8], "FP32")
                tensor.set_data_from_numpy(X[None])
                result = client.infer(name, [tensor], model_version=kw.get("version", ""),
                                      parameters={"key": kw["key"]} if kw.get("key") else None)
                answers[name][door] = result.as_numpy("output")[0]
        assert [http.get_model_metadata(n)["parameters"]["keel_kind"] for n in calls] == ["model", "application", "graph"]
    finally:
        http.close()
        grpc.close()

    for name, by_door in answers.items():
        assert set(by_door) == {"client", "async", "keel predict", "http", "grpc"}
        first = by_door["client"]
        assert first is not None and first.shape == (4,)
        for door, output in by_door.items():
            np.testing.assert_allclose(output, first, rtol=1e-5, atol=1e-6, err_msg=f"{name} through {door}")
    np.testing.assert_allclose(answers["m"]["client"], X[:4])  # sleep answers its input's first values
