"""The seeds' workloads as models with signatures (``training.recommender``,
``training.text_classifier``, ``training.localizer``), trained briefly here: each lands in
the store with its signature, and a padded batch of requests of mixed lengths, cut back
per request (``common.ragged``), answers each request as the model run on it alone."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from keel.common.containers import store_predictor
from keel.common.modelstore import ModelStore
from keel.common.named_containers import call
from keel.common.ragged import cut, form_batches, pad
from keel.common.signature import validate

pytestmark = pytest.mark.slow
torch.set_num_threads(1)  # tiny models: one thread is as fast and spins less on a shared machine


def served_alike(store: str, name: str, requests: list[dict], atol: float = 1e-5) -> list[dict]:
    """Each request's answer from one padded batch, checked against the request alone."""
    predictor = store_predictor(store, name, None)
    sig = ModelStore(store).manifest(name).signature_of()
    requests = [validate(sig, r) for r in requests]
    batch = pad(sig, requests)
    answers = cut(sig, call(predictor, sig, batch.inputs), batch)
    for request, answer in zip(requests, answers):
        alone = pad(sig, [request])
        want = cut(sig, call(predictor, sig, alone.inputs), alone)[0]
        assert set(answer) == set(want) == {o.name for o in sig.outputs}
        for key in want:
            if want[key].dtype == object:
                assert answer[key].tolist() == want[key].tolist()
            else:
                np.testing.assert_allclose(answer[key], want[key], rtol=1e-5, atol=atol)
    return answers


def test_recommender(tmp_path):
    from keel.training.recommender import generate, train_recommender

    store = str(tmp_path / "store")
    m = train_recommender(store, epochs=1, n_train=2048, n_test=512, progress=False, runs_dir=str(tmp_path / "runs"))
    sig = m.signature_of()
    assert [s.text() for s in sig.client_inputs] == ["dense:float32:13", "bag0:int64:1..40", "bag1:int64:1..40",
                                                     "bag2:int64:1..40"]
    assert sig.masks == {"bag0": "bag0_mask", "bag1": "bag1_mask", "bag2": "bag2_mask"}
    assert [(o.name, o.dtype, o.shape) for o in sig.outputs] == [("click", "float32", (1,))]
    assert 0.5 < m.metrics["test_auc"] <= 1.0 and m.metrics["bayes_auc"] > m.metrics["test_auc"] - 0.1
    data = generate(12, (1000, 300, 50), seed=3)
    requests = [{"dense": data["dense"][i], **{f"bag{b}": data[f"bag{b}"][i, :data[f"len{b}"][i]] for b in range(3)}}
                for i in range(12)]
    assert len({len(r["bag0"]) for r in requests}) > 3  # mixed lengths
    answers = served_alike(store, m.name, requests)
    assert all(0.0 <= a["click"][0] <= 1.0 for a in answers)
    # shape buckets answer the same as padding
    sig, predictor = m.signature_of(), store_predictor(store, m.name, None)
    for b in form_batches(sig, [validate(sig, r) for r in requests], "bucket", bucket_width=8):
        for i, got in zip(b.indices, cut(sig, call(predictor, sig, b.padded.inputs), b.padded)):
            np.testing.assert_allclose(got["click"], answers[i]["click"], rtol=1e-5, atol=1e-6)


def test_text_classifier_takes_bytes(tmp_path):
    from keel.training.text_classifier import generate, train_text_classifier

    store = str(tmp_path / "store")
    m = train_text_classifier(store, epochs=1, n_train=1024, n_test=256, progress=False, runs_dir=str(tmp_path / "runs"))
    sig = m.signature_of()
    assert [s.text() for s in sig.inputs] == ["text:bytes:scalar"]
    assert [(o.name, o.dtype, o.shape) for o in sig.outputs] == [("label", "bytes", ()), ("score", "float32", ())]
    assert (ModelStore(store).folder(m) / "container.py").is_file() and m.format == "python"
    texts, _ = generate(10, seed=5)
    answers = served_alike(store, m.name, [{"text": t} for t in texts + ["", "not good at all!"]])
    assert {a["label"].item() for a in answers} <= {b"positive", b"negative"}
    assert all(0.5 <= float(a["score"]) <= 1.0 for a in answers)


def test_localizer_and_its_parity_model(tmp_path):
    from keel.training.localizer import iou, train_localizer

    store = str(tmp_path / "store")
    deployed, parity = train_localizer(store, steps=20, parity_steps=20, progress=False, runs_dir=str(tmp_path / "runs"))
    sig = deployed.signature_of()
    assert [s.text() for s in sig.inputs] == ["image:float32:1,64,64"]
    assert [(o.name, o.shape) for o in sig.outputs] == [("logits", (10,)), ("box", (4,))]
    assert parity.role == "parity" and parity.parity == {"k": 2, "encoder": "add", "deployed": "mnist-loc/1"}
    assert parity.signature_of() == sig
    assert {"A_a", "A_d", "iou_a", "iou_d"} <= set(parity.metrics)
    images = np.random.default_rng(0).random((3, 1, 64, 64), dtype=np.float32)
    served_alike(store, deployed.name, [{"image": x} for x in images])
    boxes = np.array([[0, 0, 2, 2], [0, 0, 1, 1]], np.float32)
    np.testing.assert_allclose(iou(boxes, np.array([[1, 1, 3, 3], [0, 0, 1, 1]], np.float32)), [1 / 7, 1.0])
