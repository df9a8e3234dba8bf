"""The erasure code of ParM: encoders that turn a coding group into a parity query, and
the subtraction decoder that reconstructs an unavailable prediction (§4.2, §5.2.3).

Training (to make parity samples) and the serving frontend (encoder and decoder) both
use this module, so a parity model is always served with the code it was trained for.

Encoders, k queries of a coding group -> one parity query of the same shape:

- ``add_encode``     P = X_1 + ... + X_k, feature by feature (any query shape)
- ``concat_encode``  images (k, C, H, W): each is downsampled by area averaging and
                     tiled into one (C, H, W) image on a grid of ``cols = ceil(sqrt(k))``
                     columns and ``rows = ceil(k / cols)`` rows, filled row by row.
                     k = 2 is a 1x2 grid (each image squeezed to H x W/2, side by side,
                     as in the ParM authors' code), k = 3 and 4 a 2x2 grid (cell 4 of
                     k = 3 stays zero). Pixels left over when H or W is not divisible by
                     the grid are zero.

Decoder, F_P(P) and the k-1 available predictions -> the unavailable one:

- ``subtract_decode``  F(X_j) ~= F_P(P) - sum_{i != j} F(X_i); works unchanged on a
                       parity batch (B, n_out) with available (k-1, B, n_out)
- ``decode``           the decoder that goes with each encoder. ``add``: subtract_decode
                       on the raw outputs (the parity model was trained, with MSE, to
                       output sum_i F(X_i)). ``concat``: the parity model was trained
                       with cross-entropy against (1/k) sum_i onehot(y_i) (§5.2.3), so
                       its softmax, not its logits, is what sums: subtraction is done in
                       probability space, k softmax(F_P(P)) - sum_{i != j} softmax(F(X_i)),
                       and the reconstruction is a probability vector. (Subtracting
                       logits there is off in scale and lands near chance.)

The numpy functions take an ``out`` buffer so the frontend can encode and decode without
allocating. ``add_encode_torch`` and ``concat_encode_torch`` do the same on batches of
torch tensors for training, using the same grid and the same downsampling matrices.

Example
-------
>>> import numpy as np
>>> X = np.random.rand(3, 64).astype(np.float32)        # a coding group, k = 3
>>> W = np.random.rand(64, 10).astype(np.float32)
>>> F = lambda x: x @ W                                  # linear: F(X1 + X2 + X3) = sum F(Xi)
>>> P = add_encode(X)
>>> recon = subtract_decode(F(P), np.stack([F(X[0]), F(X[2])]))   # F(X2) unavailable
>>> bool(np.allclose(recon, F(X[1]), atol=1e-4))
True
"""
from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


class Encoder(enum.StrEnum):
    """The encoders a parity model can be trained for; the value is its manifest name."""

    ADD = "add"
    CONCAT = "concat"


def add_encode(queries: np.ndarray | Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """Addition encoder: the parity query P = sum_i X_i.

    Parameters
    ----------
    queries : ndarray (k, *shape) or sequence of k arrays of one shape
        The queries of a coding group.
    out : ndarray (*shape), optional
        Preallocated buffer for P; may not alias any query.

    Returns
    -------
    ndarray (*shape)
        The parity query (``out`` when given).
    """
    k = len(queries)
    if k == 0:
        raise ValueError("a coding group needs at least one query")
    if out is None:
        out = np.empty_like(queries[0])
    if k == 1:
        np.copyto(out, queries[0])
        return out
    np.add(queries[0], queries[1], out=out)
    for q in queries[2:]:
        np.add(out, q, out=out)
    return out


def concat_grid(k: int) -> tuple[int, int]:
    """(rows, cols) of the concatenation encoder's grid for a coding group of ``k``."""
    if k < 1:
        raise ValueError("a coding group needs at least one query")
    cols = math.ceil(math.sqrt(k))
    return math.ceil(k / cols), cols


@functools.lru_cache(maxsize=64)
def area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float32 matrix that downsamples one axis by area averaging.

    Output pixel i averages input pixels floor(i*n_in/n_out) .. ceil((i+1)*n_in/n_out) - 1,
    the bins of adaptive average pooling; for n_in divisible by n_out it is a block mean.
    """
    m = np.zeros((n_out, n_in), dtype=np.float32)
    for i in range(n_out):
        lo, hi = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    m.setflags(write=False)
    return m


def _cells(k: int, height: int, width: int) -> tuple[int, int, int, int]:
    rows, cols = concat_grid(k)
    h, w = height // rows, width // cols
    if h == 0 or w == 0:
        raise ValueError(f"a {height}x{width} image is too small for a {rows}x{cols} grid")
    return rows, cols, h, w


def concat_encode(images: np.ndarray | Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """Concatenation encoder (§5.2.3): downsample k images and tile them into one image.

    Parameters
    ----------
    images : ndarray (k, ..., C, H, W) or sequence of k arrays (..., C, H, W)
        The image queries of a coding group; leading batch dimensions are allowed.
    out : ndarray (..., C, H, W), optional
        Preallocated buffer for the parity image.

    Returns
    -------
    ndarray (..., C, H, W)
        The parity image, same shape as one query.
    """
    k = len(images)
    first = np.asarray(images[0])
    if first.ndim < 3:
        raise ValueError(f"concat_encode wants image queries (..., C, H, W), got shape {first.shape}")
    height, width = first.shape[-2:]
    rows, cols, h, w = _cells(k, height, width)
    rh, rw = area_matrix(height, h), area_matrix(width, w).T
    if out is None:
        out = np.zeros(first.shape, dtype=first.dtype)
    elif h * rows != height or w * cols != width or k < rows * cols:
        out.fill(0)
    for i in range(k):
        r, c = divmod(i, cols)
        out[..., r * h : (r + 1) * h, c * w : (c + 1) * w] = rh @ np.asarray(images[i]) @ rw
    return out


def subtract_decode(
    parity_output: np.ndarray, available: np.ndarray | Sequence[np.ndarray], out: np.ndarray | None = None
) -> np.ndarray:
    """Subtraction decoder: reconstruct the unavailable prediction F(X_j).

    Parameters
    ----------
    parity_output : ndarray (n_out,) or (B, n_out)
        F_P(P), the parity model's output for the parity query (or parity batch).
    available : ndarray (k-1, *parity_output.shape) or sequence of k-1 such arrays
        The deployed model's predictions F(X_i), i != j, of the same coding group.
    out : ndarray, optional
        Preallocated buffer, shaped like ``parity_output``.

    Returns
    -------
    ndarray
        F_P(P) - sum_{i != j} F(X_i) (``out`` when given).
    """
    if out is None:
        out = np.empty_like(parity_output)
    if len(available) == 0:
        np.copyto(out, parity_output)
        return out
    np.subtract(parity_output, available[0], out=out)
    for a in available[1:]:
        np.subtract(out, a, out=out)
    return out


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float32-safe."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def decode(
    encoder: str, parity_output: np.ndarray, available: np.ndarray | Sequence[np.ndarray], out: np.ndarray | None = None
) -> np.ndarray:
    """Reconstruct the unavailable prediction with the decoder that matches ``encoder``.

    Parameters
    ----------
    encoder : str
        The parity model's encoder, ``"add"`` or ``"concat"`` (its manifest's ``parity.encoder``).
    parity_output : ndarray (n_out,) or (B, n_out)
        F_P(P), as the parity model returns it (logits).
    available : ndarray (k-1, *parity_output.shape) or sequence of k-1 such arrays
        The deployed model's outputs F(X_i), i != j, as it returns them (logits).
    out : ndarray, optional
        Preallocated buffer, shaped like ``parity_output``.

    Returns
    -------
    ndarray
        ``add``: F_P(P) - sum F(X_i) (logit-like). ``concat``: k softmax(F_P(P)) -
        sum softmax(F(X_i)) (approximately the probabilities of the unavailable one).
    """
    if Encoder(encoder) is Encoder.ADD:
        return subtract_decode(parity_output, available, out)
    k = len(available) + 1
    return subtract_decode(k * softmax(parity_output), [softmax(np.asarray(a)) for a in available], out)


def add_encode_torch(queries: torch.Tensor) -> torch.Tensor:
    """``add_encode`` for training: queries (k, B, *shape) -> parity batch (B, *shape)."""
    return queries.sum(dim=0)


def concat_encode_torch(images: torch.Tensor) -> torch.Tensor:
    """``concat_encode`` for training: images (k, B, C, H, W) -> parity batch (B, C, H, W)."""
    import torch

    k, height, width = images.shape[0], images.shape[-2], images.shape[-1]
    rows, cols, h, w = _cells(k, height, width)
    rh = torch.from_numpy(area_matrix(height, h).copy()).to(images)
    rw = torch.from_numpy(area_matrix(width, w).T.copy()).to(images)
    out = images.new_zeros(images.shape[1:])
    for i in range(k):
        r, c = divmod(i, cols)
        out[..., r * h : (r + 1) * h, c * w : (c + 1) * w] = rh @ images[i] @ rw
    return out


def encode(encoder: str, queries: np.ndarray | Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """Encode a coding group with the encoder named ``encoder`` ("add" or "concat")."""
    if Encoder(encoder) is Encoder.ADD:
        return add_encode(queries, out)
    return concat_encode(queries, out)


def encode_torch(encoder: str, queries: torch.Tensor) -> torch.Tensor:
    """Encode a batch of coding groups (k, B, ...) with the encoder named ``encoder``."""
    if Encoder(encoder) is Encoder.ADD:
        return add_encode_torch(queries)
    return concat_encode_torch(queries)


def _padded(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Arrays of one rank zero-padded at the end of each dim to their largest (variable dims)."""
    shape = tuple(max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim))
    out = []
    for a in arrays:
        if a.shape != shape:
            a = np.pad(a, [(0, s - n) for s, n in zip(shape, a.shape)])
        out.append(a)
    return out


def encode_named(encoder: str, queries: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Encode one parity query of a named model: each floating input of the k queries,
    its variable dims zero-padded to the largest among them (a zero tail adds nothing to
    the sum), by ``encode``. The queries must name the same inputs, each of one dtype and
    rank; an integer or bytes input cannot be coded (a sum of ids is no input), ValueError."""
    if not queries:
        raise ValueError("a coding group needs at least one query")
    names = queries[0].keys()
    parity = {}
    for name in names:
        arrays = [np.asarray(q[name]) for q in queries]
        first = arrays[0]
        if first.dtype.kind != "f" and first.dtype.name != "bfloat16":
            raise ValueError(f"input {name!r} is {first.dtype}, not floating point: ParM cannot code it")
        if any(a.dtype != first.dtype or a.ndim != first.ndim for a in arrays):
            raise ValueError(f"input {name!r} differs in dtype or rank within the coding group")
        parity[name] = encode(encoder, _padded(arrays))
    return parity


def decode_named(encoder: str, parity_output: dict[str, np.ndarray],
                 available: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Reconstruct one unavailable query's named outputs: ``decode`` on each output of
    F_P(P) and the k-1 available predictions (a variable output dim padded to the largest
    among them, so the reconstruction has that largest shape)."""
    rebuilt = {}
    for name, out in parity_output.items():
        arrays = _padded([np.asarray(out, np.float32), *(np.asarray(a[name], np.float32) for a in available)])
        rebuilt[name] = decode(encoder, arrays[0], arrays[1:])
    return rebuilt
