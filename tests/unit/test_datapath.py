"""The data path and the memory guard on the CPU: the stream per slot is a null context,
outputs are the module's, autocast runs at the lower precision, and a simulated
out-of-memory error (``torch.cuda.OutOfMemoryError`` raised above a batch size) splits the
batch, lowers the ceiling, and ends in ``QueryTooLarge`` for one query that does not fit."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from keel.common.architectures import build
from keel.common.containers import TorchPredictor
from keel.common.datapath import DataPath, MemoryGuard, QueryTooLarge, is_oom, warm_up, warmup_rows
from keel.common.modelstore import ModelStore


class Fits:
    """A model that runs out of device memory above ``limit`` queries, as a GPU would."""

    input_shape, output_size = [3], 3

    def __init__(self, limit: int):
        self.limit, self.sizes = limit, []

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        self.sizes.append(len(inputs))
        if len(inputs) > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return inputs.astype(np.float32) * 2


def rows(n: int) -> np.ndarray:
    return np.arange(n * 3, dtype=np.float32).reshape(n, 3)


def test_out_of_memory_is_recognised_and_other_errors_are_not():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))  # cuBLAS/cuDNN and older kernels
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom(ValueError("out of memory"))


def test_a_batch_that_does_not_fit_is_split_and_the_ceiling_lowered():
    model, guard = Fits(3), MemoryGuard(64)
    out = guard.run(model.predict_batch, rows(8))
    np.testing.assert_array_equal(out, rows(8) * 2)  # every query answered, in order
    assert guard.ceiling == 2 and guard.splits == 2 and guard.lowered(64) == 2
    assert max(s for s in model.sizes[3:]) <= 3  # after the two failures, only batches that fit
    model.sizes.clear()
    np.testing.assert_array_equal(guard.run(model.predict_batch, rows(5)), rows(5) * 2)
    assert model.sizes == [2, 2, 1]  # above the ceiling: run in chunks of it, no failure first
    assert guard.splits == 2


def test_one_query_that_does_not_fit_gets_a_clear_error_and_the_guard_serves_on():
    guard = MemoryGuard(64)
    with pytest.raises(QueryTooLarge, match="one query alone does not fit"):
        guard.run(Fits(0).predict_batch, rows(4))
    assert guard.too_large == 1 and guard.ceiling == 1
    np.testing.assert_array_equal(guard.run(Fits(1).predict_batch, rows(2)), rows(2) * 2)


def test_other_errors_are_not_retried():
    calls = []

    def broken(x):
        calls.append(len(x))
        raise ValueError("bad input")

    guard = MemoryGuard(64)
    with pytest.raises(ValueError):
        guard.run(broken, rows(8))
    assert calls == [8] and guard.ceiling == 64 and guard.lowered(64) is None


def test_warm_up_runs_the_largest_batch_and_lowers_a_ceiling_that_does_not_fit():
    assert warmup_rows(None, "cuda", 32) == 32 and warmup_rows(None, "cpu", 32) == 0 and warmup_rows(4, "cpu", 32) == 4
    model, guard = Fits(5), MemoryGuard(16)
    warm_up(model, guard, 16)
    assert model.sizes[0] == 16 and guard.ceiling == 4


def test_on_the_cpu_the_stream_is_a_null_context_and_outputs_are_the_modules():
    torch.manual_seed(0)
    module = build("mlp", in_features=6, n_classes=3, hidden=[8]).eval()
    path = DataPath(torch, "cpu")
    assert isinstance(path.stream(), contextlib.nullcontext)
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    with torch.inference_mode():
        want = module(torch.from_numpy(x)).numpy()
        got = path.run(module, x)
    np.testing.assert_array_equal(got, want)
    stats = path.stats()
    assert stats["batches"] == 1 and stats["streams"] == 0 and stats["copy_ms"] == 0.0 and stats["pinned_bytes"] == 0


def test_autocast_runs_at_the_lower_precision_and_answers_float32():
    torch.manual_seed(0)
    module = build("mlp", in_features=6, n_classes=3, hidden=[8]).eval()
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    with torch.inference_mode():
        want = DataPath(torch, "cpu").run(module, x)
        got = DataPath(torch, "cpu", autocast="bfloat16").run(module, x)
    assert got.dtype == np.float32
    assert not np.array_equal(got, want)  # bfloat16 keeps 8 bits of mantissa
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)


def test_a_store_model_runs_through_its_data_path(tmp_path):
    torch.manual_seed(0)
    arch = {"in_features": 6, "n_classes": 3, "hidden": [8]}
    module = build("mlp", **arch).eval()
    store = str(tmp_path / "store")
    ModelStore(store).save("mlp", module, arch="mlp", arch_config=arch, input_shape=[6], output_size=3)
    predictor = TorchPredictor(store, "mlp", None)
    x = np.random.default_rng(2).standard_normal((7, 6)).astype(np.float32)
    with torch.inference_mode():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(predictor.predict_batch(x), want, rtol=1e-6, atol=1e-6)
    assert predictor.path.stats()["batches"] == 1


def test_buffer_sets_are_reused_grown_and_reserved_per_slot():
    # the GPU's bookkeeping, with ordinary host memory (page-locking needs a CUDA driver)
    path = DataPath(torch, "cpu")
    first = path._take()
    small = path._pinned(first, "host_in", (4, 3), torch.float32)
    assert small.shape == (4, 3)
    again = path._pinned(first, "host_in", (2, 3), torch.float32)
    assert again.data_ptr() == small.data_ptr()  # a smaller batch reuses the buffer
    grown = path._pinned(first, "host_in", (8, 3), torch.float32)
    assert grown.shape == (8, 3) and first.host_in.numel() == 24
    path._pinned(first, "host_out", (8, 2), torch.float32)
    path._give(first)
    assert path._take() is first  # the free set is taken again, not a new one
    path._give(first)
    path.reserve(3)
    assert len(path._free) == 3 and all(b.host_in.numel() == 24 and b.host_out.numel() == 16 for b in path._free)
    assert path.stats()["pinned_bytes"] == 4 * (12 + 24 + 16) + 2 * 4 * (24 + 16)
