"""Model versions over HTTP across ``keel model rollout``: real gateway, frontend (cache
on), dispatcher and two worker processes serving a TorchScript model from the store.

The gateway's versions are the ones the workers serve now, not the spec's at ``keel up``;
a request pinned to a version is answered by that version or refused with a 4xx JSON
error, also while the rollout moves the workers one at a time."""
from __future__ import annotations

import threading
import urllib.error
import urllib.request

import numpy as np
import orjson
import pytest
import torch

from keel.common.spec import load_spec
from keel.deploy.keel import main as keel
from keel.deploy.local import free_port, free_port_block
from tests.support.models import Scale

pytestmark = pytest.mark.slow


def expected(x: np.ndarray, version: str) -> list[float]:
    return [float(x.sum()) + (100.0 if version == "2" else 0.0), 3.0 * float(x[0])]


def call(port: int, path: str, doc: dict | None = None) -> tuple[int, dict]:
    data = None if doc is None else orjson.dumps(doc)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="GET" if doc is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, orjson.loads(err.read())


def infer_doc(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": x.tolist()}],
            "parameters": {"timeout_ms": 10_000}}


@pytest.fixture
def cluster(tmp_path, launcher, capsys):
    """scale v1 served by two workers behind the gateway; v2 added to the store afterwards,
    as a newcomer does before ``keel model rollout``."""
    store = str(tmp_path / "store")
    torch.jit.save(torch.jit.script(Scale()), tmp_path / "v1.pt")
    assert keel(["model", "add", "scale", str(tmp_path / "v1.pt"), "--input-shape", "4", "--store", store]) == 0
    run = launcher("versions")
    port = free_port()
    spec_file = tmp_path / "versions.toml"
    spec_file.write_text(f'[cluster]\nname = "versions"\nstore = "{store}"\nbase_port = {free_port_block()}\n'
                         f'run_dir = "{run.log_dir}"\n[gateway]\nhttp_port = {port}\n'
                         '[frontend]\ncache_size = 1000\n[models.scale]\nworkers = 2\n')
    run.start_spec(load_spec(str(spec_file)))
    torch.jit.save(torch.jit.script(Scale(100.0)), tmp_path / "v2.pt")
    assert keel(["model", "add", "scale", str(tmp_path / "v2.pt"), "--input-shape", "4", "--store", store]) == 0
    capsys.readouterr()
    return spec_file, port


def test_versions_follow_a_rollout(cluster):
    spec_file, port = cluster
    xs = np.random.default_rng(0).random((4, 4), dtype=np.float32)
    assert call(port, "/v2/models/scale")[1]["versions"] == ["1"]
    for x in xs:  # fill the cache with version 1's answers
        status, body = call(port, "/v2/models/scale/versions/1/infer", infer_doc(x))
        assert status == 200 and body["model_version"] == "1"
        np.testing.assert_allclose(body["outputs"][0]["data"], expected(x, "1"), rtol=1e-5)
    assert keel(["model", "rollout", str(spec_file), "scale", "--version", "2"]) == 0

    status, meta = call(port, "/v2/models/scale")
    assert status == 200 and meta["versions"] == ["2"]
    assert call(port, "/v2/models/scale/versions/2")[0] == 200
    status, body = call(port, "/v2/models/scale/versions/1")
    assert status == 404 and "version" in body["error"]
    for x in xs:  # the same inputs again: version 2 answers, never version 1's cached answer
        status, body = call(port, "/v2/models/scale/versions/2/infer", infer_doc(x))
        assert status == 200 and body["model_version"] == "2", body
        np.testing.assert_allclose(body["outputs"][0]["data"], expected(x, "2"), rtol=1e-5)
        status, body = call(port, "/v2/models/scale/versions/1/infer", infer_doc(x))
        assert status == 404 and "version 1" in body["error"], body
        status, body = call(port, "/v2/models/scale/infer", infer_doc(x))
        assert status == 200 and body["model_version"] == "2"
        np.testing.assert_allclose(body["outputs"][0]["data"], expected(x, "2"), rtol=1e-5)


def test_a_pinned_version_is_answered_by_it_or_refused_during_a_rollout(cluster):
    """Pinned requests race the rollout: each is answered by the version it names or refused."""
    spec_file, port = cluster
    xs = np.random.default_rng(1).random((8, 4), dtype=np.float32)  # few inputs: the cache answers many
    seen: list[tuple[str, int, dict, int]] = []
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set() and i < 2000:
            version = "1" if i % 2 else "2"
            status, body = call(port, f"/v2/models/scale/versions/{version}/infer", infer_doc(xs[i % len(xs)]))
            seen.append((version, status, body, i % len(xs)))
            i += 1

    loader = threading.Thread(target=load)
    loader.start()
    try:
        assert keel(["model", "rollout", str(spec_file), "scale", "--version", "2"]) == 0
        n = len(seen)
        while len(seen) < n + 20 and loader.is_alive():
            loader.join(0.05)
    finally:
        stop.set()
        loader.join(60)
    assert seen and any(status == 200 for _, status, _, _ in seen)
    for version, status, body, i in seen:
        if status == 200:
            assert body["model_version"] == version and body["parameters"]["keel_versions"] == [version], body
            np.testing.assert_allclose(body["outputs"][0]["data"], expected(xs[i], version), rtol=1e-5)
        else:
            # 404: the frontends said it is not served; 409: the rollout moved a worker under the request
            assert status in (404, 409) and f"version {version}" in body["error"], (status, body)
