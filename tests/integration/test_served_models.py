"""The three seed models served from one spec, deploy/examples/models.toml (its store, ports
and run folder replaced): the recommender, the text classifier and the localizer under ParM
k = 2 (tests.support.seed_models: the localizer untrained, its weights from a fixed seed).
Each model is reached by the sync client, the async client, ``keel predict`` (a
subprocess) and the unmodified tritonclient http and grpc, and every answer equals the
model run offline on that request alone (floats to 1e-5). Last, with one deployed
localizer worker frozen (SIGSTOP), its queries come back as reconstructions that carry
both outputs, each equal to the decoder's formula offline, F_P(X_i + X_j) - F(X_j)."""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from keel.bench.served_models import EXAMPLE, spec_text
from keel.common.async_client import AsyncClient
from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.deploy.local import free_port, free_port_block
from tests.integration.test_oip_models import TEXTS, assert_same as assert_same_triton, concurrently, rec_request
from tests.integration.test_parm_named import offline as offline_model
from tests.support.seed_models import LOC, LOC_PARITY, REC, TEXT, canvas, seed_store

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PATIENT_MS = 20_000
STORE_NAMES = {"rec": REC, "text": TEXT, "loc": LOC}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return seed_store(tmp_path_factory.mktemp("served-models"))


@pytest.fixture(scope="module")
def cluster(module_launcher, store, tmp_path_factory):
    """The example spec as written, but for where it reads the store, its ports and run folder."""
    run = module_launcher("served")
    http, grpc = free_port(), free_port()
    text = spec_text(EXAMPLE, store=store, run_dir=str(run.log_dir), base_port=free_port_block(), http_port=http,
                     grpc_port=grpc)
    spec_file = tmp_path_factory.mktemp("served-spec") / "models.toml"
    spec_file.write_text(text)
    spec = load_spec(str(spec_file))
    assert spec.role("encoder") and spec.role("decoder")
    run.start_spec(spec)
    yield run, spec, spec_file, http, grpc
    assert "request failed" not in run.log_path("gateway").read_text(errors="replace")


@pytest.fixture(scope="module")
def offline(store):
    """Each model run in this process on one request alone: what every answer must equal."""
    models = {name: offline_model(store, store_name) for name, store_name in STORE_NAMES.items()}
    models["loc-parity"] = offline_model(store, LOC_PARITY)
    return lambda name, request: models[name](request)


def requests_for(model: str, seed: int, n: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    if model == "rec":
        return [rec_request(rng) for _ in range(n)]
    if model == "text":
        return [{"text": np.array(TEXTS[i % len(TEXTS)].encode(), dtype=object)} for i in range(n)]
    return [{"image": canvas(rng)} for _ in range(n)]


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, value in want.items():
        if value.dtype.kind == "O":
            assert np.asarray(got[name], dtype=object).tolist() == value.tolist(), name
        else:
            np.testing.assert_allclose(np.reshape(got[name], value.shape), value, rtol=1e-5, atol=1e-5, err_msg=name)


def reconstruction_error(offline, requests: list[dict], j: int, outputs: dict) -> float:
    """How far a reconstruction of ``requests[j]`` is from the decoder's formula offline,
    F_P(X_i + X_j) - F(X_i), for the partner X_i it was coded with (None: a partial group,
    F_P(X_j) alone): the smallest error over every candidate."""
    x, errors = requests[j], []
    for i in [None, *(i for i in range(len(requests)) if i != j)]:
        fp = offline("loc-parity", {"image": x["image"] if i is None else x["image"] + requests[i]["image"]})
        other = {n: 0 for n in fp} if i is None else offline("loc", requests[i])
        errors.append(max(float(np.abs(np.reshape(outputs[n], fp[n].shape) - (fp[n] - other[n])).max()) for n in fp))
    return min(errors)


def assert_answer(offline, model: str, requests: list[dict], j: int, outputs: dict, source: str) -> None:
    """An answer equals the model alone on its request; under ParM (the localizer) a query
    the parity path beat its worker to is a reconstruction, both outputs by the formula."""
    assert set(outputs) == set(offline(model, requests[j])), source
    if source == Source.RECONSTRUCTION and model == "loc":
        assert reconstruction_error(offline, requests, j, outputs) < 1e-4, f"query {j} matches no coding partner"
        return
    assert source in (Source.MODEL, Source.CACHE), source
    assert_same(outputs, offline(model, requests[j]))


@pytest.mark.parametrize("model", ["rec", "text", "loc"])
def test_sync_and_async_clients_answer_as_the_model_alone(cluster, offline, client, model):
    _, spec, *_ = cluster
    requests = requests_for(model, 1, 24)
    results = client(spec.client_endpoints, timeout_ms=PATIENT_MS, raise_errors=True).predict_batch(model, requests,
                                                                                                   window=12)

    async def run() -> list:
        async with AsyncClient(spec.client_endpoints, timeout_ms=PATIENT_MS, raise_errors=True) as c:
            return await asyncio.gather(*(c.predict(model, r) for r in requests))

    answers = asyncio.run(run())
    for j, (a, b) in enumerate(zip(results, answers)):
        assert_answer(offline, model, requests, j, a.outputs, a.source)
        assert_answer(offline, model, requests, j, b.outputs, b.source)


@pytest.mark.parametrize("model", ["rec", "text", "loc"])
def test_keel_predict_answers_as_the_model_alone(cluster, offline, model):
    _, _, spec_file, *_ = cluster
    request = requests_for(model, 2, 1)[0]
    args = []
    for name, x in request.items():
        value = x.item().decode() if x.dtype.kind == "O" else x.tolist()
        args += ["--input", f"{name}={orjson.dumps(value).decode()}"]
    out = subprocess.run([str(Path(sys.executable).parent / "keel"), "predict", "--spec", str(spec_file), model, *args,
                          "--timeout-ms", str(PATIENT_MS)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    answer = orjson.loads(out.stdout)
    got = {n: np.array([v.encode() for v in np.ravel(v)], dtype=object).reshape(()) if isinstance(np.ravel(v)[0], str)
           else np.asarray(v, np.float32) for n, v in answer["outputs"].items()}
    assert_answer(offline, model, [request], 0, got, answer["source"])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_tritonclient_answers_as_the_model_alone(cluster, offline, transport):
    _, _, _, http, grpc = cluster
    lib = httpclient if transport == "http" else grpcclient
    c = lib.InferenceServerClient(f"127.0.0.1:{http if transport == 'http' else grpc}",
                                  **({"concurrency": 8} if transport == "http" else {}))
    try:
        for model in ("rec", "text", "loc"):
            requests = requests_for(model, 3, 12)
            for j, result in enumerate(concurrently(c, transport, model, requests)):
                response = result.get_response()
                sources = response["parameters"]["keel_sources"] if transport == "http" else \
                    response.parameters["keel_sources"].string_param.split(",")
                if sources[0] == Source.RECONSTRUCTION:
                    outputs = {n: result.as_numpy(n)[0] for n in ("logits", "box")}
                    assert_answer(offline, model, requests, j, outputs, sources[0])
                else:
                    assert sources[0] in (Source.MODEL, Source.CACHE), sources
                    assert_same_triton(result, offline(model, requests[j]))
    finally:
        c.close()


def test_a_frozen_localizer_workers_queries_are_reconstructed_both_outputs(cluster, offline, client):
    """Last in the module: it freezes a worker of the shared cluster (and thaws it)."""
    run, spec, *_ = cluster
    frozen = "worker-loc-0"
    run.kill(frozen, signal.SIGSTOP)
    try:
        c = client(spec.client_endpoints, timeout_ms=PATIENT_MS)
        rng = np.random.default_rng(9)
        requests, results = [], []
        deadline = time.monotonic() + 60
        while not any(r.source == Source.RECONSTRUCTION for r in results):
            assert time.monotonic() < deadline, f"no reconstruction within 60 s: {Counter(r.source for r in results)}"
            batch = [{"image": canvas(rng)} for _ in range(8)]
            requests.extend(batch)
            results.extend(c.predict_batch("loc", batch))
    finally:
        run.procs[frozen].send_signal(signal.SIGCONT)

    sources = Counter(r.source for r in results)
    assert set(sources) <= {Source.MODEL, Source.RECONSTRUCTION}, sources
    for j, r in enumerate(results):
        assert set(r.outputs) == {"logits", "box"}
        assert_answer(offline, "loc", requests, j, r.outputs, r.source)
        if r.source == Source.RECONSTRUCTION:  # rebuilt, not F's own answer
            want = offline("loc", requests[j])
            assert max(float(np.abs(r.outputs[n] - want[n]).max()) for n in want) > 1e-3
