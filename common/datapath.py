"""A worker's data path to its device, and what it does when the device's memory runs out.

``DataPath`` runs a torch module on a batch. On a GPU each concurrent slot (executor
thread) has its own CUDA stream, so SERF's service parallelism overlaps copies and
kernels of different batches instead of queueing them all on the default stream; each
batch is copied into a pinned host buffer that the worker reuses (a pool, one set per
batch in flight, grown to the largest batch seen), then to the device and back without
blocking, and the slot waits only on its own stream. CUDA events time the copies and the
compute, so ``stats()`` gives the share of time in copies. On the CPU there is nothing to
copy or overlap: the stream is a null context and the input tensor shares the numpy
array's memory. ``autocast`` ("float16" or "bfloat16") runs the module under
``torch.autocast`` at that precision; outputs come back as float32 either way.

``MemoryGuard`` catches an out-of-memory error on a batch (``torch.cuda.OutOfMemoryError``,
or the plain RuntimeError older kernels raise), splits the batch in halves and retries,
and lowers its ``ceiling`` (the largest batch it will run at once) to what fitted; a batch
above the ceiling (sent before the dispatcher heard of it) runs in chunks of it. A single
query that does not fit raises ``QueryTooLarge``: splitting cannot help it. The worker
reports the ceiling to the dispatcher (``Done.max_batch``), which caps that worker's
batches from then on. ``warm_up`` runs the largest batch once before a worker registers,
through the guard, so a ceiling too high for the device is lowered before any query.

Example
-------
>>> import torch
>>> path = DataPath(torch, "cpu")
>>> path.run(torch.nn.Identity(), np.ones((2, 3), np.float32)).shape
(2, 3)
>>> MemoryGuard(64).run(lambda x: x * 2, np.ones((4, 1), np.float32))[:2, 0].tolist()
[2.0, 2.0]
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np


class QueryTooLarge(RuntimeError):
    """One query alone does not fit in the device's memory: no split of its batch can run
    it, so it is answered with this error instead of being retried for ever."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is the device running out of memory. torch >= 1.13 raises
    ``torch.cuda.OutOfMemoryError``; cuBLAS, cuDNN and older kernels a RuntimeError that
    says so. torch is not imported for the check (a Python container may not use it)."""
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch is not None else None
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def release_cached() -> None:
    """Give the blocks torch's caching allocator holds back to the device, so the retry
    of a split batch starts from what is really free (only if CUDA was ever used)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class MemoryGuard:
    """Runs batches within what the device's memory holds (see the module docstring)."""

    def __init__(self, ceiling: int):
        #: the largest batch run at once: the configured max_batch, lowered on out-of-memory
        self.ceiling = ceiling
        self.splits = 0  # batches split after an out-of-memory error
        self.too_large = 0  # single queries that did not fit
        self._lock = threading.Lock()  # executors run batches at once

    def run(self, predict: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray) -> np.ndarray:
        """``predict(inputs)``, split and retried on out-of-memory; raises ``QueryTooLarge``
        when one query does not fit, and whatever else ``predict`` raises."""
        n, ceiling = len(inputs), self.ceiling
        if n > ceiling:
            return np.concatenate([self.run(predict, inputs[i:i + ceiling]) for i in range(0, n, ceiling)])
        try:
            return predict(inputs)
        except Exception as exc:
            if not is_oom(exc):
                raise
            first_line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            release_cached()
            if n == 1:
                with self._lock:
                    self.too_large += 1
                raise QueryTooLarge(f"one query alone does not fit in the device's memory ({first_line}); "
                                    "give the worker more memory (memory_fraction, a larger GPU) or send smaller inputs") from None
            with self._lock:
                self.splits += 1
                self.ceiling = min(self.ceiling, n // 2)
        half = (n + 1) // 2
        return np.concatenate([self.run(predict, inputs[:half]), self.run(predict, inputs[half:])])

    def lowered(self, configured: int) -> int | None:
        """The ceiling if out-of-memory lowered it below ``configured``, else None."""
        return self.ceiling if self.ceiling < configured else None


def warmup_rows(configured: int | None, device: str, max_batch: int) -> int:
    """Rows of a worker's warm-up batch: as configured, else its largest batch on a GPU and
    none on the CPU (where the first batch costs little more than the rest)."""
    if configured is not None:
        return configured
    return max_batch if device != "cpu" else 0


def warm_up(predictor: Any, guard: MemoryGuard, rows: int, slots: int = 1) -> float:
    """Run a zero batch of ``rows`` queries through ``predictor`` (within ``guard``, which
    lowers its ceiling if the batch does not fit) and keep pinned buffers for ``slots``
    batches at once; the seconds it took. Raises what the model raises."""
    start = time.perf_counter()
    if rows > 0:
        manifest = getattr(predictor, "manifest", None)
        dtype = getattr(manifest, "input_dtype", "float32")
        guard.run(predictor.predict_batch, np.zeros((rows, *predictor.input_shape), dtype))
        path = getattr(predictor, "path", None)
        if path is not None:
            path.reserve(slots)
    return time.perf_counter() - start


class _Buffers:
    """One batch's pinned host buffers (input and output), grown to the largest batch."""

    __slots__ = ("host_in", "host_out")

    def __init__(self):
        self.host_in = self.host_out = None


class DataPath:
    """How a torch module's batch reaches ``device`` and comes back (module docstring)."""

    def __init__(self, torch: Any, device: str = "cpu", autocast: str = "", memory_fraction: float = 0.0):
        self.torch, self.device = torch, torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:  # "cuda": the process's first (its only one when placed)
            self.device = torch.device("cuda", 0)
        self.pin = self.cuda  # page-locked host buffers need a CUDA driver
        self.dtype = {"": None, "float16": torch.float16, "bfloat16": torch.bfloat16}[autocast]
        self._local = threading.local()  # per slot (executor thread): its stream
        self._free: list[_Buffers] = []  # pinned buffer sets not in use
        self._lock = threading.Lock()
        self._stats = {"batches": 0, "copy_ms": 0.0, "compute_ms": 0.0, "streams": 0, "pinned_bytes": 0}
        if self.cuda and memory_fraction:
            torch.cuda.set_per_process_memory_fraction(memory_fraction, self.device)

    # ------------------------------------------------------------------ per slot

    def stream(self) -> Any:
        """This slot's stream as a context (``torch.cuda.stream``); a null context on the CPU."""
        if not self.cuda:
            return contextlib.nullcontext()
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = self.torch.cuda.Stream(self.device)
            with self._lock:
                self._stats["streams"] += 1
        return self.torch.cuda.stream(stream)

    def autocast(self) -> Any:
        if self.dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast(self.device.type, dtype=self.dtype)

    def _take(self) -> _Buffers:
        with self._lock:
            return self._free.pop() if self._free else _Buffers()

    def _give(self, buffers: _Buffers) -> None:
        with self._lock:
            self._free.append(buffers)

    def _pinned(self, buffers: _Buffers, which: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """A view of ``shape`` on the set's pinned buffer ``which``, grown (re-allocated) when
        too small or of another dtype: page-locked allocations are dear, so they are kept."""
        need = int(np.prod(shape))
        buf = getattr(buffers, which)
        if buf is None or buf.numel() < need or buf.dtype != dtype:
            buf = self.torch.empty(need, dtype=dtype, pin_memory=self.pin)
            setattr(buffers, which, buf)
            with self._lock:
                self._stats["pinned_bytes"] += buf.numel() * buf.element_size()
        return buf[:need].view(shape)

    def reserve(self, sets: int) -> None:
        """Keep ``sets`` pinned buffer sets as large as the largest made so far, so that
        ``sets`` concurrent batches find theirs ready (after a warm-up batch; none on the
        CPU, whose batches take no buffer)."""
        with self._lock:
            have = list(self._free)
        sized = max(have, key=lambda b: b.host_in.numel() if b.host_in is not None else 0, default=None)
        if sized is None or sized.host_in is None or sized.host_out is None:
            return
        for _ in range(max(0, sets - len(have))):
            b = _Buffers()
            b.host_in = self.torch.empty(sized.host_in.numel(), dtype=sized.host_in.dtype, pin_memory=self.pin)
            b.host_out = self.torch.empty(sized.host_out.numel(), dtype=sized.host_out.dtype, pin_memory=self.pin)
            with self._lock:
                self._stats["pinned_bytes"] += (b.host_in.numel() * b.host_in.element_size()
                                                + b.host_out.numel() * b.host_out.element_size())
            self._give(b)

    # ------------------------------------------------------------------ one batch

    def run(self, module: Any, inputs: np.ndarray) -> np.ndarray:
        """The module's outputs (float32, numpy, owned by the caller) for ``inputs``."""
        if not self.cuda:
            start = time.perf_counter()
            with self.autocast():
                out = module(self.torch.from_numpy(inputs))
            result = out.detach().float().numpy()
            self._account(0.0, (time.perf_counter() - start) * 1000.0)
            return result
        torch = self.torch
        buffers = self._take()
        try:
            with self.stream():
                stream = torch.cuda.current_stream(self.device)
                host_in = self._pinned(buffers, "host_in", inputs.shape, torch.from_numpy(inputs[:0]).dtype)
                host_in.numpy()[...] = inputs  # the one pageable copy, into page-locked memory
                marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                marks[0].record(stream)
                x = host_in.to(self.device, non_blocking=True)
                marks[1].record(stream)
                with self.autocast():
                    out = module(x)
                out = out.detach().float()
                marks[2].record(stream)
                host_out = self._pinned(buffers, "host_out", tuple(out.shape), torch.float32)
                host_out.copy_(out, non_blocking=True)
                marks[3].record(stream)
                stream.synchronize()  # this slot's work only; other slots' streams run on
                self._account(marks[0].elapsed_time(marks[1]) + marks[2].elapsed_time(marks[3]),
                              marks[1].elapsed_time(marks[2]))
                return host_out.numpy().copy()  # the buffer is the next batch's
        finally:
            self._give(buffers)

    def _account(self, copy_ms: float, compute_ms: float) -> None:
        with self._lock:
            s = self._stats
            s["batches"] += 1
            s["copy_ms"] += copy_ms
            s["compute_ms"] += compute_ms

    def stats(self) -> dict[str, float]:
        """Batches run, time in copies and in compute (ms, device time on a GPU), the share
        in copies, streams and pinned bytes made."""
        with self._lock:
            s = dict(self._stats)
        total = s["copy_ms"] + s["compute_ms"]
        s["copy_share"] = s["copy_ms"] / total if total > 0 else 0.0
        return s
