"""The trained models of the seeds' workloads through the gateway, with the unmodified
tritonclient http and grpc: the DLRM-style recommender (dense float32[13] + three int64 id
bags of 1..40, their masks filled by the batcher and hidden from clients) and the text
classifier fed strings (bytes in; a label string and a score out). Each request, of its
own lengths, sent concurrently, equals the model run offline on it alone (floats to 1e-5).

This process loads tritonclient's protobuf package ``inference``; only the gateway
process loads Keel's own generated modules of the same package."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from keel.common.containers import store_predictor
from keel.common.named_containers import call_rows
from keel.common.spec import load_spec
from keel.deploy.local import free_port, free_port_block
from tests.support.seed_models import train_small

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BAGS, MAX_IDS = 3, 40
TEXTS = ["a great film, loved it", "terrible", "not bad at all, would watch again", "", "caf\u00e9 scenes, superb"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Small versions of the two models, trained in seconds from generated data."""
    return train_small(tmp_path_factory.mktemp("oip-models"))


@pytest.fixture(scope="module")
def ports(module_launcher, store):
    run = module_launcher("oipmodels")
    http, grpc = free_port(), free_port()
    spec = load_spec({
        "cluster": {"name": "oipmodels", "store": store, "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "gateway": {"http_port": http, "grpc_port": grpc},
        "models": {"rec": {"store_name": "rec-dlrm", "ragged": "pad", "batch_delay_ms": 2.0},
                   "text": {"store_name": "text-gru"}},
    })
    run.start_spec(spec)
    yield http, grpc
    assert "request failed" not in run.log_path("gateway").read_text(errors="replace")


@pytest.fixture(scope="module")
def offline(store):
    models = {name: store_predictor(store, name, None) for name in ("rec-dlrm", "text-gru")}

    def run(name: str, request: dict) -> dict:
        predictor = models[name]
        return call_rows(predictor, predictor.manifest.signature_of(), [request])[0][0]

    return run


def rec_request(rng: np.random.Generator) -> dict:
    out = {"dense": rng.standard_normal(13).astype(np.float32)}
    for b in range(BAGS):
        out[f"bag{b}"] = rng.integers(0, 50, int(rng.integers(1, MAX_IDS + 1))).astype(np.int64)
    return out


def triton_inputs(lib, request: dict) -> list:
    """One request as one row: each tensor with a batch axis of 1."""
    made = []
    for name, x in request.items():
        x = x[None]
        datatype = "BYTES" if x.dtype == object else {"float32": "FP32", "int64": "INT64"}[x.dtype.name]
        inp = lib.InferInput(name, list(x.shape), datatype)
        inp.set_data_from_numpy(x)
        made.append(inp)
    return made


def assert_same(result, want: dict) -> None:
    for name, value in want.items():
        got = result.as_numpy(name)
        assert got is not None and got.shape == (1, *value.shape), (name, got)
        if value.dtype.kind == "O":
            assert np.asarray(got[0], dtype=object).tolist() == value.tolist(), name
        else:
            np.testing.assert_allclose(got[0], value, rtol=1e-5, atol=1e-5, err_msg=name)


def concurrently(client, transport: str, model: str, requests: list[dict]) -> list:
    """Every request in flight at once: tritonclient.http's own async calls (gevent: no
    threads of ours), grpc's blocking calls from threads."""
    if transport == "http":
        pending = [client.async_infer(model, triton_inputs(httpclient, r)) for r in requests]
        return [call.get_result() for call in pending]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda r: client.infer(model, triton_inputs(grpcclient, r)), requests))


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_recommender_and_text_classifier_equal_the_models_alone(ports, offline, transport):
    lib = httpclient if transport == "http" else grpcclient
    client = lib.InferenceServerClient(f"127.0.0.1:{ports[0] if transport == 'http' else ports[1]}",
                                       **({"concurrency": 8} if transport == "http" else {}))
    try:
        meta = client.get_model_metadata("rec") if transport == "http" else \
            client.get_model_metadata("rec", as_json=True)
        assert [t["name"] for t in meta["inputs"]] == ["dense", "bag0", "bag1", "bag2"]  # no masks: the batcher's
        rng = np.random.default_rng(11)
        recs = [rec_request(rng) for _ in range(24)]
        texts = [{"text": np.array(t.encode(), dtype=object)} for t in TEXTS * 2]
        rec_results, text_results = concurrently(client, transport, "rec", recs), concurrently(client, transport,
                                                                                               "text", texts)
        for request, result in zip(recs, rec_results):
            assert_same(result, offline("rec-dlrm", request))
        for request, result in zip(texts, text_results):
            assert result.as_numpy("label")[0] in (b"negative", b"positive")
            assert_same(result, offline("text-gru", request))
    finally:
        client.close()
