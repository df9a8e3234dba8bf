"""The ragged batcher (``common.ragged``): padding to the batch's largest with masks,
shape buckets, outputs cut back per request, and the padding waste recorded."""
from __future__ import annotations

import numpy as np
import pytest

from keel.common.ragged import Waste, bucket_key, compare, cut, form_batches, pad
from keel.common.signature import Signature, TensorSpec, parse_input


def sig() -> Signature:
    return Signature((parse_input("dense:float32:2"), parse_input("ids:int64:1..40"),
                      parse_input("ids_mask:float32:mask=ids"), parse_input("text:bytes:scalar")),
                     (TensorSpec("p", "float32", (1,)), TensorSpec("per_id", "int64", (-1,), follows=(("ids", 0),))))


def req(n: int, text: bytes = b"t") -> dict:
    return {"dense": np.full(2, n, np.float32), "ids": np.arange(1, n + 1), "text": np.array(text, dtype=object)}


def model(inputs: dict) -> dict:
    """A stand-in that respects its mask: a masked sum, and each id doubled."""
    return {"p": (inputs["ids"] * inputs["ids_mask"]).sum(1, keepdims=True).astype(np.float32),
            "per_id": inputs["ids"] * 2}


def test_pad_to_the_largest_with_a_mask_and_cut_back():
    requests = [req(3), req(1), req(5, b"hello")]
    batch = pad(sig(), requests)
    assert list(batch.inputs) == ["dense", "ids", "ids_mask", "text"]  # signature order
    assert batch.inputs["ids"].shape == (3, 5) and batch.inputs["ids"][1].tolist() == [1, 0, 0, 0, 0]
    assert batch.inputs["ids_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.inputs["text"].tolist() == [b"t", b"t", b"hello"]
    assert all(type(t) is bytes for t in batch.inputs["text"])  # the values, not 0-d arrays holding them
    # ids: 9 real of 15; dense 6 of 6; text 3 of 3 -> 6 padded of 24
    assert (batch.real_elements, batch.padded_elements) == (18, 6) and batch.waste == pytest.approx(0.25)
    answers = cut(sig(), model(batch.inputs), batch)
    for request, answer in zip(requests, answers):  # each equals the model run on that request alone
        alone = pad(sig(), [request])
        assert alone.waste == 0.0
        want = model(alone.inputs)
        np.testing.assert_array_equal(answer["p"], want["p"][0])
        np.testing.assert_array_equal(answer["per_id"], want["per_id"][0])
        assert answer["per_id"].shape == request["ids"].shape


def test_buckets_group_equal_shapes_or_rounded_ones():
    requests = [req(n) for n in (3, 1, 3, 5, 4, 1)]
    exact = form_batches(sig(), requests, "bucket", max_batch=8)
    assert [b.indices for b in exact] == [[0, 2], [1, 5], [3], [4]]  # oldest bucket first
    assert all(b.padded.waste == 0.0 for b in exact)
    wide = form_batches(sig(), requests, "bucket", max_batch=8, bucket_width=4)
    assert [b.indices for b in wide] == [[0, 1, 2, 4, 5], [3]]
    assert wide[0].padded.inputs["ids"].shape == (5, 4) and wide[1].padded.inputs["ids"].shape == (1, 8)
    assert bucket_key(sig(), req(39), width=8)[1] == (40,)  # never past the dim's bound
    split = form_batches(sig(), requests, "bucket", max_batch=1)
    assert [b.indices for b in split] == [[0], [2], [1], [5], [3], [4]]


def test_pad_policy_takes_the_queue_in_order_and_waste_accumulates():
    requests = [req(n) for n in (2, 4, 4, 1, 3)]
    batches = form_batches(sig(), requests, "pad", max_batch=2)
    assert [b.indices for b in batches] == [[0, 1], [2, 3], [4]]
    waste = Waste()
    for b in batches:
        waste.add(b.padded)
    assert waste.batches == 3 and waste.padded_elements == 2 + 3 + 0
    assert waste.ratio == pytest.approx(5 / (waste.real_elements + 5))
    with pytest.raises(ValueError, match="unknown ragged batching policy"):
        form_batches(sig(), requests, "greedy")
    with pytest.raises(ValueError, match="at least one request"):
        pad(sig(), [])


def test_two_variable_dims_and_outputs_that_follow_none():
    s = Signature((parse_input("img:uint8:1..8,1..8"),),
                  (TensorSpec("rows", "float32", (-1,), follows=(("img", 0),)), TensorSpec("c", "float32", (3,))))
    a, b = np.ones((2, 5), np.uint8), np.ones((4, 3), np.uint8)
    batch = pad(s, [{"img": a}, {"img": b}])
    assert batch.inputs["img"].shape == (2, 4, 5)
    assert batch.padded_elements == 40 - 22
    outs = cut(s, {"rows": batch.inputs["img"].sum(2).astype(np.float32), "c": np.zeros((2, 3), np.float32)}, batch)
    assert outs[0]["rows"].tolist() == [5, 5] and outs[1]["rows"].tolist() == [3, 3, 3, 3]
    assert outs[0]["c"].shape == (3,)


def test_compare_runs_both_policies_over_the_same_queue():
    calls = []
    requests = [req(n) for n in (1, 2, 3, 3, 2, 1)]
    result = compare(sig(), requests, lambda inputs: calls.append(len(inputs["ids"])) or model(inputs),
                     max_batch=4, rounds=1)
    assert set(result) == {"pad", "bucket"}
    assert result["pad"]["batches"] == 2 and result["bucket"]["batches"] == 3 and result["bucket"]["waste"] == 0.0
    assert sorted(calls) == sorted([4, 2] + [2, 2, 2])
