"""Batching requests whose variable dims differ: pad to the batch's largest, or shape buckets.

A model with a variable dim (``common.signature``: -1 in a per-request shape) gets
requests of different lengths. Triton's dynamic batcher batches only requests of equal
shape unless a model opts into ragged batching; Keel gives each model one of two policies:

- ``pad``: one batch of everything queued; each input is padded with zeros (empty bytes)
  to the batch's largest size in each variable dim, and a mask input the signature
  declares (``mask_for``) is filled with 1 over each request's real elements, 0 over the
  padding. One model call per batch, at the cost of computing on padding;
- ``bucket``: requests are grouped by shape, each variable dim's size rounded up to a
  multiple of ``bucket_width`` (1: equal shapes only, Triton's default); each bucket is
  padded as above, so waste is bounded by the width, at the cost of smaller batches.

After the model runs, ``cut`` gives each request its own rows, every output dim that
follows an input dim (``TensorSpec.follows``, learnt by ``keel model add``) cut back to
that request's length. ``Padded.waste`` is padded elements / elements computed: the
price of padding, which the batcher records per model.

This module is pure (numpy only, no sockets): the dispatcher groups queries by its policies
(``services.scheduling.ragged``) and the worker pads and cuts (``named_containers.call_rows``).

Example
-------
>>> sig = Signature((parse_input("ids:int64:1..40"), parse_input("mask:bool:mask=ids")))
>>> batch = pad(sig, [{"ids": np.array([1, 2, 3])}, {"ids": np.array([4])}])
>>> batch.inputs["ids"].tolist(), batch.inputs["mask"].tolist(), round(batch.waste, 3)
([[1, 2, 3], [4, 0, 0]], [[True, True, True], [True, False, False]], 0.333)
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from keel.common.signature import VARIABLE, Signature, TensorSpec, numpy_dtype, parse_input  # noqa: F401

POLICIES = ("pad", "bucket")


@dataclass
class Padded:
    """One padded batch: its inputs (axis 0 the requests), each request's own shapes, and
    how much of what the model computes is padding."""

    inputs: dict[str, np.ndarray]
    shapes: list[dict[str, tuple[int, ...]]]
    real_elements: int
    padded_elements: int

    @property
    def waste(self) -> float:
        """Padded elements / elements in the batch (0 when every request had the largest shape)."""
        total = self.real_elements + self.padded_elements
        return self.padded_elements / total if total else 0.0


def _empty(spec: TensorSpec, shape: tuple[int, ...]) -> np.ndarray:
    if spec.dtype == "bytes":
        arr = np.empty(shape, dtype=object)
        arr.fill(b"")
        return arr
    return np.zeros(shape, numpy_dtype(spec.dtype))


def pad(signature: Signature, requests: Sequence[Mapping[str, np.ndarray]],
        sizes: Mapping[str, tuple[int, ...]] | None = None) -> Padded:
    """The requests (each name -> one request's array, checked by ``signature.validate``)
    as one batch, each variable dim padded to the largest among them (or to ``sizes``,
    a bucket's shape per input, when given); masks filled."""
    if not requests:
        raise ValueError("pad needs at least one request")
    inputs: dict[str, np.ndarray] = {}
    shapes = [{s.name: tuple(np.shape(r[s.name])) for s in signature.client_inputs} for r in requests]
    real = padded = 0
    for spec in signature.client_inputs:
        own = [sh[spec.name] for sh in shapes]
        big = tuple(sizes[spec.name]) if sizes else tuple(max(dims) for dims in zip(*own))
        batch = _empty(spec, (len(requests), *big))
        for i, (request, shape) in enumerate(zip(requests, own)):
            value = request[spec.name]
            # a one-value request (a 0-d array) goes in as its value: an object array would
            # otherwise hold the 0-d array itself, not the bytes in it
            batch[(i, *(slice(0, d) for d in shape))] = value[()] if np.ndim(value) == 0 else value
        inputs[spec.name] = batch
        n = sum(math.prod(shape) for shape in own)
        real += n
        padded += len(requests) * math.prod(big) - n
    for spec in signature.inputs:
        if spec.mask_for is not None:
            target = inputs[spec.mask_for]
            mask = np.zeros(target.shape, numpy_dtype(spec.dtype))
            for i, shape in enumerate(sh[spec.mask_for] for sh in shapes):
                mask[(i, *(slice(0, d) for d in shape))] = 1
            inputs[spec.name] = mask
    ordered = {s.name: inputs[s.name] for s in signature.inputs}  # the order a torch model takes them
    return Padded(ordered, shapes, real, padded)


def cut(signature: Signature, outputs: Mapping[str, np.ndarray], batch: Padded) -> list[dict[str, np.ndarray]]:
    """Each request's outputs from a padded batch's: its row, every dim that follows an
    input dim cut to that request's own length (other dims as the model gave them)."""
    specs = {s.name: s for s in signature.outputs}
    out: list[dict[str, np.ndarray]] = []
    for i, shapes in enumerate(batch.shapes):
        mine = {}
        for name, arr in outputs.items():
            row = arr[i, ...]  # an array even for one value per request (arr[i] would give a bare bytes)
            spec = specs.get(name)
            if spec is not None and spec.follows:
                index = tuple(slice(0, shapes[f[0]][f[1]]) if f else slice(None) for f in spec.follows)
                row = row[index]
            mine[name] = row
        out.append(mine)
    return out


def bucket_key(signature: Signature, request: Mapping[str, np.ndarray], width: int = 1) -> tuple:
    """The bucket a request falls in: each input's shape, variable dims rounded up to a
    multiple of ``width`` (capped at the dim's bound)."""
    key = []
    for spec in signature.client_inputs:
        shape = np.shape(request[spec.name])
        key.append(tuple(d if s != VARIABLE else min(-(-d // width) * width, hi)
                         for d, s, hi in zip(shape, spec.shape, spec.max_shape)))
    return tuple(key)


@dataclass
class Batched:
    """One batch a policy formed: which requests (indices into the queue given) and the
    padded inputs for them."""

    indices: list[int]
    padded: Padded


def form_batches(signature: Signature, requests: Sequence[Mapping[str, np.ndarray]], policy: str = "pad",
                 max_batch: int = 64, bucket_width: int = 1) -> list[Batched]:
    """The batches ``policy`` makes of ``requests`` in queue order: ``pad`` takes them
    ``max_batch`` at a time; ``bucket`` groups equal bucket keys (oldest bucket first),
    each group split at ``max_batch``."""
    if policy not in POLICIES:
        raise ValueError(f"unknown ragged batching policy {policy!r}; policies: {', '.join(POLICIES)}")
    if policy == "pad":
        groups = [list(range(i, min(i + max_batch, len(requests)))) for i in range(0, len(requests), max_batch)]
        return [Batched(g, pad(signature, [requests[i] for i in g])) for g in groups]
    buckets: dict[tuple, list[int]] = {}
    for i, request in enumerate(requests):
        buckets.setdefault(bucket_key(signature, request, bucket_width), []).append(i)
    out = []
    for key, members in buckets.items():
        sizes = {s.name: shape for s, shape in zip(signature.client_inputs, key)}
        for i in range(0, len(members), max_batch):
            group = members[i:i + max_batch]
            out.append(Batched(group, pad(signature, [requests[j] for j in group], sizes)))
    return out


@dataclass
class Waste:
    """Padding waste accumulated over batches: what the batcher records per model."""

    real_elements: int = 0
    padded_elements: int = 0
    batches: int = 0
    #: the recent batches' waste (bounded: a worker adds one a batch for as long as it runs)
    by_batch: deque = field(default_factory=lambda: deque(maxlen=1024), repr=False)

    def add(self, batch: Padded) -> None:
        self.real_elements += batch.real_elements
        self.padded_elements += batch.padded_elements
        self.batches += 1
        self.by_batch.append(batch.waste)

    @property
    def ratio(self) -> float:
        total = self.real_elements + self.padded_elements
        return self.padded_elements / total if total else 0.0


def compare(signature: Signature, requests: Sequence[Mapping[str, np.ndarray]], run: Callable[[dict], Mapping],
            max_batch: int = 32, bucket_width: int = 1, rounds: int = 3) -> dict[str, dict[str, float]]:
    """A micro-benchmark of the policies on one queue: each round runs ``pad`` and then
    ``bucket`` (alternating, so a machine's drift hits both) over every request, a model
    call ``run(inputs) -> outputs`` per batch, outputs cut back; per policy the batches,
    mean batch size, padding waste and requests per second at saturation (the best round).
    ``keel bench`` calls it with a store model; the latency target needs the live path."""
    import time

    out: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for policy in POLICIES:
            start = time.perf_counter()
            batches = form_batches(signature, requests, policy, max_batch, bucket_width)
            waste = Waste()
            for b in batches:
                cut(signature, run(b.padded.inputs), b.padded)
                waste.add(b.padded)
            seconds = time.perf_counter() - start
            best = out.get(policy)
            if best is None or seconds < best["seconds"]:
                out[policy] = {"batches": len(batches), "mean_batch": len(requests) / len(batches),
                               "waste": waste.ratio, "seconds": seconds, "requests_per_s": len(requests) / seconds}
    return out
