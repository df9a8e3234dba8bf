"""Calling a model container with named tensors, and learning its outputs from a check batch.

The calling conventions of a model with a signature (``common.signature``):

- a TorchScript file or ``torch.export`` program gets its inputs as positional tensors, in
  the signature's input order (masks included), and may return one tensor, a tuple of
  them, or a dict name -> tensor; it takes no bytes (a Python class does its own decoding);
- a Python class's ``predict_batch`` gets a dict name -> numpy array (bytes inputs as
  object arrays of ``bytes``) and may return the same three kinds; a bytes output is a
  list or object array of ``bytes`` or ``str``, one per query;
- a model whose signature is the single-input shorthand (``Signature.is_single``) keeps the
  old convention: one array in, (N, output_size) out (``common.containers``).

Outputs are named as ``named_outputs`` says: a dict's keys, ``output0, output1, ...`` for a
tuple, ``output`` for one tensor. ``infer_outputs`` runs check batches as a worker would,
one more for each variable dim of an input with that dim longer, and writes the output
specs: a dim whose size followed an input's dim is variable and records which it follows.

This module holds what serving named tensors shares with ``keel model add``: the worker
runs a named model's batches through ``call_rows`` (pad, ``call``, cut back per query).

Example
-------
>>> sig = Signature((parse_input("dense:float32:13"), parse_input("ids:int64:1..40")))  # doctest: +SKIP
>>> infer_outputs(store_predictor(store, "rec", None), sig)                              # doctest: +SKIP
(TensorSpec(name='p', dtype='float32', shape=(1,), ...),)
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from keel.common.signature import OUTPUT, VARIABLE, Signature, SignatureError, TensorSpec, dtype_name, numpy_dtype


def to_torch(arr: np.ndarray, torch: Any, device: str = "cpu") -> Any:
    """A numpy array as a torch tensor on ``device`` (bfloat16 through its bits: torch
    cannot read ml_dtypes' arrays)."""
    if arr.dtype.kind == "O":
        raise SignatureError("a torch model takes tensors, not bytes: decode bytes in a Python class")
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(arr)).to(device)


def to_numpy(value: Any) -> np.ndarray:
    """One output as numpy: a torch tensor (bfloat16 kept as ml_dtypes'), an array, or a
    sequence of ``bytes``/``str`` (an object array of ``bytes``)."""
    if hasattr(value, "detach"):
        t = value.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            import torch

            return t.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
        return t.numpy()
    arr = np.asarray(value) if not isinstance(value, (list, tuple)) or not value or \
        not isinstance(value[0], (bytes, str)) else np.array(value, dtype=object)
    if arr.dtype.kind in "OSU":
        out = np.empty(arr.shape, dtype=object)
        for i, v in enumerate(arr.reshape(-1)):
            out.reshape(-1)[i] = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        return out
    return arr


def named_outputs(result: Any) -> dict[str, np.ndarray]:
    """A model's return as name -> array: a dict's keys, ``output0..`` for a tuple or list
    of tensors, ``output`` for one."""
    if isinstance(result, Mapping):
        return {str(k): to_numpy(v) for k, v in result.items()}
    if isinstance(result, (tuple, list)) and result and not isinstance(result[0], (bytes, str, int, float)):
        return {f"output{i}": to_numpy(v) for i, v in enumerate(result)}
    return {OUTPUT: to_numpy(result)}


def _run_torch(predictor: Any, signature: Signature, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A torch module: positional tensors in signature order; a program traced with a fixed
    batch size runs in chunks of it (the last one zero-padded, its extra rows cut)."""
    torch, device = predictor.torch, getattr(predictor, "device", "cpu")
    arrays = [inputs[s.name] for s in signature.inputs]
    rows = len(arrays[0])
    chunk = getattr(predictor.manifest, "static_batch", None) or rows
    parts: list[dict[str, np.ndarray]] = []
    with torch.inference_mode():
        for start in range(0, rows, chunk):
            piece = [a[start:start + chunk] for a in arrays]
            n = len(piece[0])
            if n < chunk:
                piece = [np.concatenate([p, np.zeros((chunk - n, *p.shape[1:]), p.dtype)]) for p in piece]
            out = named_outputs(predictor.module(*(to_torch(p, torch, device) for p in piece)))
            parts.append({k: v[:n] for k, v in out.items()})
    return parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def call(predictor: Any, signature: Signature, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run one batch of named inputs (each with axis 0 the batch; masks included) through
    a store model's container by its calling convention; its outputs by name."""
    if signature.is_single:
        return {OUTPUT: np.asarray(predictor.predict_batch(inputs[signature.inputs[0].name]))}
    if hasattr(predictor, "module"):
        return _run_torch(predictor, signature, inputs)
    if hasattr(predictor, "container"):
        return named_outputs(predictor.container.predict_batch(dict(inputs)))
    raise SignatureError(f"{type(predictor).__name__} takes one input; this signature names "
                         f"{', '.join(s.name for s in signature.inputs)}")


def call_rows(predictor: Any, signature: Signature, rows: list[Mapping[str, np.ndarray]]) -> tuple[list[dict], Any]:
    """Run the queries ``rows`` (each name -> one query's array) as one batch, as a worker
    does: padded to the batch's largest with masks (``common.ragged.pad``), run by the
    container's convention (``call``), each query's outputs cut back to its own lengths
    (``common.ragged.cut``). (each query's outputs, the padded batch: its ``waste``)."""
    from keel.common.ragged import cut, pad

    batch = pad(signature, rows)
    outputs = call(predictor, signature, batch.inputs)
    for name, arr in outputs.items():
        if arr.ndim == 0 or arr.shape[0] != len(rows):
            raise ValueError(f"output {name!r} has shape {list(arr.shape)} for {len(rows)} queries; want ({len(rows)}, ...)")
        dtype_name(arr.dtype)  # one the wire carries, else a SignatureError
    return cut(signature, outputs, batch), batch


def check_batch(signature: Signature, rows: int, stretch: int = 0,
                only: tuple[str, int] | None = None) -> dict[str, np.ndarray]:
    """``rows`` queries of zeros (empty bytes) for every input, masks all ones; each
    variable dim at its minimum (at least 1) plus ``stretch`` (``only``: just that
    (input, dim), and its mask's), within its bound."""
    out = {}
    for spec in signature.inputs:
        owner = spec.mask_for or spec.name
        shape = [d if d != VARIABLE else min(max(lo, 1) + (stretch if only in (None, (owner, i)) else 0), hi)
                 for i, (d, lo, hi) in enumerate(zip(spec.shape, spec.min_shape, spec.max_shape))]
        if spec.dtype == "bytes":
            arr = np.empty((rows, *shape), dtype=object)
            arr.fill(b"")
        else:
            arr = (np.ones if spec.mask_for else np.zeros)((rows, *shape), numpy_dtype(spec.dtype))
        out[spec.name] = arr
    return out


def _run_check(predictor: Any, signature: Signature, batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    shapes = ", ".join(f"{n} {list(a.shape)}" for n, a in batch.items())
    try:
        outputs = call(predictor, signature, batch)
    except Exception as exc:
        raise ValueError(f"the model failed on a check batch ({shapes}): {type(exc).__name__}: {exc}") from exc
    if not outputs:
        raise ValueError("the model returned no outputs")
    for name, arr in outputs.items():
        if arr.ndim == 0 or arr.shape[0] != rows:
            raise ValueError(f"output {name!r} has shape {list(arr.shape)} for {rows} queries; want ({rows}, ...)")
        try:
            dtype_name(arr.dtype)
        except SignatureError as exc:
            raise ValueError(f"output {name!r}: {exc}") from None
    return outputs


def infer_outputs(predictor: Any, signature: Signature, rows: int = 2) -> tuple[TensorSpec, ...]:
    """The output specs of a model, from check batches as a worker would run them: one,
    then for each variable dim of an input one with that dim 2 longer (an output dim that
    changed with it is variable and follows it: the ragged batcher cuts it back per
    request). A model that wants its variable dims equal (a program whose inputs share a
    length, a mask not declared as one) fails a batch that stretches one alone: then one
    batch stretches them all, and what changed follows the first. A ``ValueError`` says
    what went wrong."""
    seen = [_run_check(predictor, signature, check_batch(signature, rows), rows)]
    stretched = [(s.name, i) for s in signature.client_inputs for i, d in enumerate(s.shape) if d == VARIABLE]
    try:
        for source in stretched:
            seen.append(_run_check(predictor, signature, check_batch(signature, rows, stretch=2, only=source), rows))
    except ValueError:
        seen[1:] = [_run_check(predictor, signature, check_batch(signature, rows, stretch=2), rows)]
        stretched = stretched[:1]
    first = seen[0]
    if any(set(s) != set(first) for s in seen[1:]):
        raise ValueError(f"the model's outputs changed names between check batches: {[sorted(s) for s in seen]}")
    specs = []
    for name, arr in first.items():
        if any(s[name].ndim != arr.ndim for s in seen):
            raise ValueError(f"output {name!r} changed its number of dims between check batches")
        shape = tuple(d if all(s[name].shape[1 + i] == d for s in seen) else VARIABLE for i, d in enumerate(arr.shape[1:]))
        follows: list[tuple[str, int] | None] = [None] * len(shape)
        for run, source in zip(seen[1:], stretched):
            for i, d in enumerate(arr.shape[1:]):
                if run[name].shape[1 + i] != d and follows[i] is None:
                    follows[i] = source
        specs.append(TensorSpec(name, dtype_name(arr.dtype), shape, follows=tuple(follows)))
    return tuple(specs)
