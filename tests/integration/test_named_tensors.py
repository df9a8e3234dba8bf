"""Named tensors through the ZeroMQ serving path, with real processes: a DLRM-style
recommender (dense float32[13] + three int64 id bags of 1..40 ids, masks filled by the
batcher) and a text classifier fed strings (bytes in; a label string and a score out; a
Python class tokenising). Every answer equals the model run offline on that request alone
(floats to 1e-5) under concurrent load with mixed lengths, for each ragged policy; each bad
input gets its own clear error over ZeroMQ while the cluster serves on."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from keel.common.async_client import AsyncClient
from keel.common.client import Client
from keel.common.containers import store_predictor
from keel.common.named_containers import call_rows
from keel.common.protocol import ErrorCode, Source
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block
from tests.support.seed_models import train_small

pytestmark = pytest.mark.slow

BAGS, MAX_IDS = 3, 40


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Small versions of the two models, trained in seconds from generated data."""
    return train_small(tmp_path_factory.mktemp("named-store"))


@pytest.fixture(scope="module")
def cluster(module_launcher, store):
    run = module_launcher("named")
    spec = load_spec({
        "cluster": {"name": "named", "store": store, "base_port": free_port_block(), "run_dir": str(run.log_dir)},
        "models": {"rec": {"store_name": "rec-dlrm", "ragged": "pad", "batch_delay_ms": 2.0},
                   "rec-bucket": {"store_name": "rec-dlrm", "ragged": "bucket", "bucket_width": 8},
                   "text": {"store_name": "text-gru"},
                   "echo": {"builtin": "sleep", "input_shape": [4], "output_size": 2}},
    })
    return run.start_spec(spec)


@pytest.fixture(scope="module")
def offline(store):
    """Each model run in this process on one request alone: what every answer must equal."""
    models = {}
    for name in ("rec-dlrm", "text-gru"):
        predictor = store_predictor(store, name, None)
        models[name] = (predictor, predictor.manifest.signature_of())

    def run(name: str, request: dict) -> dict:
        predictor, signature = models[name]
        return call_rows(predictor, signature, [request])[0][0]

    return run


def rec_request(rng: np.random.Generator) -> dict:
    out = {"dense": rng.standard_normal(13).astype(np.float32)}
    for b in range(BAGS):
        out[f"bag{b}"] = rng.integers(0, 50, int(rng.integers(1, MAX_IDS + 1))).astype(np.int64)
    return out


TEXTS = ["a great film, loved it", "terrible", "not bad at all, would watch again and again", "boring plot",
         "", "caf\u00e9 scenes were wonderful and the acting superb"]


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, value in want.items():
        if value.dtype.kind == "O":
            assert got[name].tolist() == value.tolist(), name
        else:
            assert got[name].shape == value.shape, name
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("model", ["rec", "rec-bucket"])
def test_recommender_answers_equal_the_model_alone_under_concurrent_mixed_lengths(cluster, offline, model):
    rng = np.random.default_rng(7)
    requests = [rec_request(rng) for _ in range(80)]
    with Client(cluster.client_endpoints, timeout_ms=20_000, raise_errors=True) as client:
        results = client.predict_batch(model, requests, window=40)
    for request, result in zip(requests, results):
        assert result.source in (Source.MODEL, Source.CACHE)
        assert_same(result.outputs, offline("rec-dlrm", request))
        assert result.output is result.outputs["click"]  # the one output


def test_async_client_and_text_classifier_fed_strings(cluster, offline):
    async def run() -> list:
        async with AsyncClient(cluster.client_endpoints, timeout_ms=20_000, raise_errors=True) as client:
            texts = [client.predict("text", {"text": t}) for t in TEXTS * 3]
            recs = [client.predict("rec", r) for r in (rec_request(np.random.default_rng(s)) for s in range(20))]
            return await asyncio.gather(*texts, *recs)

    results = asyncio.run(run())
    for text, result in zip(TEXTS * 3, results):
        want = offline("text-gru", {"text": np.array(text.encode(), dtype=object)})
        assert result.outputs["label"].tolist() in (b"negative", b"positive")
        assert_same(result.outputs, want)
        assert result.output is None  # two outputs: read them by name
    for seed, result in zip(range(20), results[len(TEXTS) * 3:]):
        assert_same(result.outputs, offline("rec-dlrm", rec_request(np.random.default_rng(seed))))


def good() -> dict:
    return rec_request(np.random.default_rng(1))


@pytest.mark.parametrize("change, match", [
    (lambda r: r.pop("bag1"), r"missing input\(s\) 'bag1'"),
    (lambda r: r.update(extra=np.zeros(2, np.float32)), r"unknown input\(s\) 'extra'"),
    (lambda r: r.update(bag0_mask=np.ones(3, np.float32)), "a mask the batcher fills"),
    (lambda r: r.update(bag0=np.array([1.5, 2.0])), "takes int64"),
    (lambda r: r.update(bag2=np.arange(MAX_IDS + 1)), "dim 0 is 41, over its bound 40"),
    (lambda r: r.update(bag2=np.arange(0)), "dim 0 is 0, under its minimum 1"),
    (lambda r: r["dense"].__setitem__(3, np.nan), "contains NaN"),
    (lambda r: r.update(dense=np.zeros(12, np.float32)), r"shape \[12\] is not \[13\]"),
    (lambda r: r.update(dense=np.array([b"x"] * 13, dtype=object)), "takes float32; got bytes"),
])
def test_each_bad_input_gets_its_own_error_and_the_cluster_serves_on(cluster, offline, change, match):
    request = good()
    change(request)
    with Client(cluster.client_endpoints, timeout_ms=20_000) as client:
        result = client.predict("rec", request)
        assert result.error_code == ErrorCode.BAD_REQUEST and result.source == Source.ERROR
        assert result.error and __import__("re").search(match, result.error), result.error
        ok = client.predict("rec", good())
        assert ok.ok
        assert_same(ok.outputs, offline("rec-dlrm", good()))


def test_a_one_input_model_takes_named_inputs_and_answers_outputs(cluster):
    with Client(cluster.client_endpoints, timeout_ms=20_000, raise_errors=True) as client:
        x = np.arange(4, dtype=np.float32)
        plain = client.predict("echo", x)
        named = client.predict("echo", {"input": x})
        assert named.output.tolist() == plain.output.tolist() == [0.0, 1.0]
        assert list(named.outputs) == ["output"]
        refused = client.predict("echo", {"pixels": x}, raise_errors=False)
        assert refused.error_code == ErrorCode.BAD_REQUEST and "takes one input, 'input'" in refused.error
        text = client.predict("text", {"text": "great"})  # a one-input named model: a bare value too
        assert text.outputs["label"].tolist() in (b"negative", b"positive")
        bare = client.predict("text", np.array(b"great", dtype=object))
        assert bare.outputs["label"].tolist() == text.outputs["label"].tolist()


def test_the_cache_and_deduplication_key_on_every_input(cluster):
    with Client(cluster.client_endpoints, timeout_ms=20_000, raise_errors=True) as client:
        a = good()
        b = {**a, "bag2": np.concatenate([a["bag2"], [1]])}  # only the last bag differs
        first, again, other = (client.predict("rec", r) for r in (a, a, b))
        assert again.source == Source.CACHE and first.outputs["click"].tolist() == again.outputs["click"].tolist()
        assert other.source == Source.MODEL
        # the same request id with another input is refused (de-duplication's digest covers all inputs)
        client.predict("rec", a, request_id="dup-1")
        reused = client.predict("rec", b, request_id="dup-1", raise_errors=False)
        assert reused.error_code == ErrorCode.BAD_REQUEST and "reused with a different input" in reused.error


def test_the_pad_worker_records_its_padding_waste_in_its_status(cluster):
    from keel.common.transport import request_status

    with Client(cluster.client_endpoints, timeout_ms=20_000, raise_errors=True) as client:
        client.predict_batch("rec", [rec_request(np.random.default_rng(100 + s)) for s in range(30)], window=30)
    workers = [request_status(ep, 2.0) or {} for ep in cluster.status_endpoints().values()]
    rec = [w for w in workers if w.get("role") == "worker" and w.get("model") == "rec"]
    assert rec and rec[0]["padded_batches"] > 0 and 0.0 <= rec[0]["padding_waste"] < 1.0
    echo = [w for w in workers if w.get("role") == "worker" and w.get("model") == "echo"]
    assert echo and echo[0]["padded_batches"] == 0  # the one-tensor path pads nothing
