"""The erasure code (common.erasure): exact round trips on linear models, grids, buffers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.common import erasure


def linear_model(n_in: int, n_out: int, seed: int = 0):
    """F(x) = x W: linear, so F(X_1 + ... + X_k) = sum F(X_i) and F itself is a perfect parity model."""
    w = np.random.default_rng(seed).standard_normal((n_in, n_out))
    return lambda x: x @ w


@pytest.mark.parametrize("k", [2, 3, 4])
def test_add_subtract_round_trip_is_exact_for_a_linear_model(k):
    rng = np.random.default_rng(k)
    queries = rng.random((k, 64))
    model = linear_model(64, 10)
    outputs = model(queries)
    parity_output = model(erasure.add_encode(queries))
    for j in range(k):
        available = np.delete(outputs, j, axis=0)
        np.testing.assert_allclose(erasure.subtract_decode(parity_output, available), outputs[j], atol=1e-9)


def test_subtract_decode_batched_matches_one_at_a_time():
    rng = np.random.default_rng(1)
    parity_outputs, available = rng.random((8, 10)), rng.random((3, 8, 10))
    batched = erasure.subtract_decode(parity_outputs, available)
    assert batched.shape == (8, 10)
    for b in range(8):
        np.testing.assert_allclose(batched[b], erasure.subtract_decode(parity_outputs[b], available[:, b]))


def test_add_encode_writes_into_out_buffer_and_accepts_separate_queries():
    rng = np.random.default_rng(2)
    queries = rng.random((4, 3, 16, 16), dtype=np.float32)
    out = np.full((3, 16, 16), np.nan, dtype=np.float32)
    parity = erasure.add_encode([q for q in queries], out=out)
    assert parity is out
    np.testing.assert_allclose(out, queries.sum(axis=0), rtol=1e-6)
    np.testing.assert_array_equal(erasure.add_encode(queries), out)


def test_subtract_decode_out_buffer():
    parity_output = np.array([10.0, 20.0, 30.0])
    out = np.empty(3)
    got = erasure.subtract_decode(parity_output, [np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])], out=out)
    assert got is out
    np.testing.assert_array_equal(out, [5.0, 13.0, 21.0])


def test_encoders_reject_empty_groups():
    with pytest.raises(ValueError):
        erasure.add_encode([])
    with pytest.raises(ValueError):
        erasure.concat_grid(0)
    with pytest.raises(ValueError):
        erasure.encode("xor", np.zeros((2, 4)))


@pytest.mark.parametrize("k,grid", [(1, (1, 1)), (2, (1, 2)), (3, (2, 2)), (4, (2, 2)), (5, (2, 3)), (9, (3, 3))])
def test_concat_grid(k, grid):
    assert erasure.concat_grid(k) == grid


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 224, 224)])
def test_concat_encode_keeps_the_query_shape(k, shape):
    images = np.random.default_rng(0).random((k, *shape), dtype=np.float32)
    parity = erasure.concat_encode(images)
    assert parity.shape == shape and parity.dtype == np.float32


def test_concat_encode_places_each_image_in_its_cell():
    # constant images make the downsampled cells equal to the constants
    k4 = np.stack([np.full((1, 8, 8), v, dtype=np.float32) for v in (1, 2, 3, 4)])
    p = erasure.concat_encode(k4)[0]
    np.testing.assert_array_equal(p[:4, :4], 1)
    np.testing.assert_array_equal(p[:4, 4:], 2)
    np.testing.assert_array_equal(p[4:, :4], 3)
    np.testing.assert_array_equal(p[4:, 4:], 4)
    # k = 2: side by side, full height
    p = erasure.concat_encode(k4[:2])[0]
    np.testing.assert_array_equal(p[:, :4], 1)
    np.testing.assert_array_equal(p[:, 4:], 2)
    # k = 3: the fourth cell is zero, even in a dirty out buffer
    out = np.full((1, 8, 8), 7.0, dtype=np.float32)
    assert erasure.concat_encode(k4[:3], out=out) is out
    p = out[0]
    np.testing.assert_array_equal(p[4:, 4:], 0)
    np.testing.assert_array_equal(p[4:, :4], 3)


def test_concat_downsampling_is_a_block_mean():
    image = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    group = np.concatenate([image] * 4)
    p = erasure.concat_encode(group)[0]
    np.testing.assert_allclose(p[:2, :2], image[0, 0].reshape(2, 2, 2, 2).mean(axis=(1, 3)))


def test_area_matrix_rows_average():
    for n_in, n_out in [(8, 4), (28, 14), (28, 9), (7, 3)]:
        m = erasure.area_matrix(n_in, n_out)
        assert m.shape == (n_out, n_in)
        np.testing.assert_allclose(m.sum(axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("encoder", ["add", "concat"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_torch_and_numpy_encoders_agree(encoder, k):
    images = np.random.default_rng(k).random((k, 5, 1, 28, 28), dtype=np.float32)  # k x batch of 5
    expected = erasure.encode(encoder, images)
    got = erasure.encode_torch(encoder, torch.from_numpy(images)).numpy()
    assert got.shape == (5, 1, 28, 28)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    for b in range(5):  # batched numpy equals one group at a time
        np.testing.assert_allclose(erasure.encode(encoder, images[:, b]), expected[b], rtol=1e-6)


@pytest.mark.parametrize("k", [2, 4])
def test_concat_decode_subtracts_probabilities(k):
    # a parity model whose softmax is exactly the mean of the group's softmaxes
    rng = np.random.default_rng(3)
    outputs = rng.standard_normal((k, 6, 10)) * 3
    probs = erasure.softmax(outputs)
    parity_output = np.log(probs.mean(axis=0))
    for j in range(k):
        recon = erasure.decode("concat", parity_output, np.delete(outputs, j, axis=0))
        np.testing.assert_allclose(recon, probs[j], atol=1e-9)
    # the add decoder is plain subtraction
    np.testing.assert_array_equal(
        erasure.decode("add", parity_output, outputs[1:]), erasure.subtract_decode(parity_output, outputs[1:])
    )


@settings(max_examples=50, deadline=None)
@given(
    k=st.integers(2, 6),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_add_round_trip_property(k, n, seed):
    rng = np.random.default_rng(seed)
    outputs = rng.standard_normal((k, n))
    parity_output = erasure.add_encode(outputs)  # the identity is a linear model
    j = int(rng.integers(k))
    np.testing.assert_allclose(erasure.subtract_decode(parity_output, np.delete(outputs, j, axis=0)), outputs[j], atol=1e-9)


def test_named_round_trip_through_a_linear_model_and_ints_refused():
    """encode_named then decode_named: with a linear F per output, the reconstruction is exact
    (the zero tail a shorter query is padded with adds nothing to the sum)."""
    from keel.common.erasure import decode_named, encode_named
    rng = np.random.default_rng(0)
    W = rng.random((6, 3), dtype=np.float32)
    qs = [{"x": rng.random(6, dtype=np.float32)}, {"x": rng.random(4, dtype=np.float32)}]
    F = lambda q: {"y": np.pad(q["x"], (0, 6 - len(q["x"]))) @ W, "z": q["x"][:1] * 2}  # noqa: E731
    P = encode_named("add", qs)
    assert P["x"].shape == (6,)
    got = decode_named("add", F(P), [F(qs[0])])
    np.testing.assert_allclose(got["y"], F(qs[1])["y"], rtol=1e-5)
    np.testing.assert_allclose(got["z"], F(qs[1])["z"], rtol=1e-5)
    with pytest.raises(ValueError, match="not floating point"):
        encode_named("add", [{"ids": np.arange(3)}, {"ids": np.arange(2)}])
