"""Named tensors on the wire: rows of ``dict[str, np.ndarray]``, one dict a query.

A message that carries named tensors (``Predict.inputs``, ``Reply.outputs``,
``Queries.rows``, ``Batch.rows``, ``Predictions.rows``: the class's ``NAMED`` field)
puts under header key ``"named"`` one descriptor per name, and after its ``TENSORS``
frames one frame per name::

    "named": [{"name": "ids", "dtype": "int64", "shapes": [[3], [40], ...]},       # a row each
              {"name": "text", "dtype": "bytes", "shapes": [[], ...], "lengths": [5, ...]}]
    frame    the rows' arrays of that name back to back, each C-contiguous
             (bytes: every element's bytes back to back, ``lengths`` their sizes in order)

One frame per name, not per row and name: a batch of 64 queries of four inputs is four
frames. Variable dims differ per query, so each row's shape travels. Bytes travel without
pickle: an object array of ``bytes`` is its elements concatenated, and ``lengths`` cuts
them apart again. A single request (``Predict``, ``Reply``) is one row.

``decode_named`` checks everything at the edge: names (strings, unique, bounded), the
dtype (``NAMED_DTYPES``), shapes (at most 8 non-negative dims), the number of rows
(``rows``: what the message's ids say), the number of names and of bytes elements, the
frame's size against the shapes (and lengths), and the total bytes against the payload
limit; anything off is a ``ProtocolError``. Numeric arrays are views on the frames
(read-only); bytes elements are copied out (``bytes``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from keel.common.protocol.fields import MAX_NAME, ProtocolError, _frame_bytes

#: dtypes a named tensor may carry (a signature's, ``common.signature.DTYPES``)
NAMED_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bytes")
#: names one message may carry
MAX_NAMES = 64
#: bytes elements one message may carry (each costs an object; bounds what a small frame can make)
MAX_ELEMENTS = 1 << 20


def _numpy_dtypes() -> dict[str, np.dtype]:
    out = {name: np.dtype(name) for name in NAMED_DTYPES if name not in ("bytes", "bfloat16")}
    try:
        import ml_dtypes

        out["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # without ml_dtypes no bfloat16 arrives (refused as a dtype)
        pass
    return out


_DTYPES = _numpy_dtypes()
_NAMES = {dt: name for name, dt in _DTYPES.items()}
_INT = {int}


def _wire_dtype(arr: np.ndarray) -> str:
    if arr.dtype.kind in "OSU":
        return "bytes"
    name = _NAMES.get(arr.dtype)
    if name is None:
        raise ProtocolError(f"dtype {arr.dtype} cannot go on the wire as a named tensor; allowed: {', '.join(NAMED_DTYPES)}")
    return name


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview, np.bytes_)):
        return bytes(value)
    raise ProtocolError(f"a bytes tensor holds bytes or str, not {type(value).__name__}")


def encode_named(rows: list[dict[str, np.ndarray]]) -> tuple[list[dict], list]:
    """(descriptors, frames) of ``rows`` (every row names the same tensors, in any order)."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and r for r in rows):
        raise ProtocolError("named tensors are a dict of name -> array (rows: a non-empty list of them)")
    names = list(rows[0])
    descs, frames = [], []
    for name in names:
        arrays = []
        for row in rows:
            if name not in row or len(row) != len(names):
                raise ProtocolError(f"every row must name the same tensors ({', '.join(names)})")
            value = row[name]
            arrays.append(value if type(value) is np.ndarray else np.asarray(value))
        dtype = _wire_dtype(arrays[0])
        desc: dict[str, Any] = {"name": name, "dtype": dtype, "shapes": [list(a.shape) for a in arrays]}
        if dtype == "bytes":
            parts = [_as_bytes(v) for a in arrays for v in a.reshape(-1)]
            desc["lengths"] = [len(p) for p in parts]
            frames.append(b"".join(parts))
        else:
            for a in arrays[1:]:
                if a.dtype != arrays[0].dtype:
                    raise ProtocolError(f"tensor {name!r}: rows of {arrays[0].dtype} and {a.dtype}")
            frames.append(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays) if len(arrays) > 1
                          else np.ascontiguousarray(arrays[0]).reshape(-1).view(np.uint8).data)
        descs.append(desc)
    return descs, frames


def _shape_ok(shape: Any) -> bool:
    return isinstance(shape, list) and len(shape) <= 8 and (not shape or (set(map(type, shape)) == _INT and min(shape) >= 0))


def decode_named(descs: Any, frames: list, rows: int | None, max_bytes: int) -> list[dict[str, np.ndarray]]:
    """The rows ``descs`` (header ``"named"``) and one frame per descriptor describe;
    ``rows``: how many the message must carry (None: any, at least one)."""
    if not isinstance(descs, list) or not descs:
        raise ProtocolError("named must be a non-empty list of tensor descriptors")
    if len(descs) > MAX_NAMES:
        raise ProtocolError(f"named carries {len(descs)} tensors, more than {MAX_NAMES}")
    if len(frames) != len(descs):
        raise ProtocolError(f"named describes {len(descs)} tensors but {len(frames)} frames follow")
    out: list[dict[str, np.ndarray]] | None = None
    total, elements = 0, 0
    for desc, frame in zip(descs, frames):
        if not isinstance(desc, dict):
            raise ProtocolError("a named tensor's descriptor must be an object")
        name, dtype, shapes = desc.get("name"), desc.get("dtype"), desc.get("shapes")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ProtocolError(f"a named tensor's name must be a string of 1..{MAX_NAME} characters, got {name!r:.80}")
        if not isinstance(dtype, str) or (dtype != "bytes" and dtype not in _DTYPES):
            raise ProtocolError(f"tensor {name!r}: dtype {dtype!r:.40} is not one of {', '.join(NAMED_DTYPES)}")
        if not isinstance(shapes, list) or not shapes or (rows is not None and len(shapes) != rows):
            want = "at least one" if rows is None else str(rows)
            got = len(shapes) if isinstance(shapes, list) else "no"
            raise ProtocolError(f"tensor {name!r}: {got} row shapes, the message carries {want}")
        if out is None:
            out = [{} for _ in shapes]
        elif len(shapes) != len(out):
            raise ProtocolError(f"tensor {name!r}: {len(shapes)} row shapes, another tensor has {len(out)}")
        if name in out[0]:
            raise ProtocolError(f"tensor {name!r} named twice")
        for shape in shapes:
            if not _shape_ok(shape):
                raise ProtocolError(f"tensor {name!r}: a shape must be a list of at most 8 non-negative ints, got {shape!r:.80}")
        sizes = [math.prod(s) for s in shapes]
        buf = _frame_bytes(frame)
        if dtype == "bytes":
            lengths = desc.get("lengths")
            count = sum(sizes)
            elements += count
            if elements > MAX_ELEMENTS:
                raise ProtocolError(f"named tensors carry more than {MAX_ELEMENTS} bytes elements")
            if not isinstance(lengths, list) or len(lengths) != count or \
                    (lengths and (set(map(type, lengths)) != _INT or min(lengths) < 0)):
                raise ProtocolError(f"tensor {name!r}: lengths must be {count} non-negative ints, one per element")
            need = sum(lengths)
        else:
            if "lengths" in desc:
                raise ProtocolError(f"tensor {name!r}: lengths are for bytes tensors only")
            dt = _DTYPES[dtype]
            need = sum(sizes) * dt.itemsize
        total += need
        if total > max_bytes:
            raise ProtocolError(f"named tensors of {total} bytes exceed the limit of {max_bytes}")
        if len(buf) != need:
            raise ProtocolError(f"tensor {name!r}: frame has {len(buf)} bytes, its shapes need {need}")
        at = 0
        if dtype == "bytes":
            k = 0
            for row, shape, n in zip(out, shapes, sizes):
                arr = np.empty(n, dtype=object)
                for j in range(n):
                    end = at + lengths[k]
                    arr[j] = bytes(buf[at:end])
                    at, k = end, k + 1
                row[name] = arr.reshape(shape)
        else:
            for row, shape, n in zip(out, shapes, sizes):
                nbytes = n * dt.itemsize
                row[name] = np.ndarray(shape, dt, buf[at:at + nbytes])
                at += nbytes
    assert out is not None
    return out


def nbytes(tensors: dict[str, np.ndarray]) -> int:
    """Bytes a dict of named tensors holds (a bytes tensor: its elements' lengths)."""
    total = 0
    for arr in tensors.values():
        if arr.dtype.kind == "O":
            total += sum(len(v) for v in arr.reshape(-1) if isinstance(v, (bytes, str)))
        else:
            total += arr.nbytes
    return total


def fingerprint(tensors: dict[str, np.ndarray]) -> bytes:
    """Every byte of a request's named tensors with their names, dtypes and shapes, so two
    requests share it only when every input is equal (the prediction cache's key and
    de-duplication's digest cover ALL inputs)."""
    parts = []
    for name, arr in tensors.items():
        head = f"{name}\0{arr.dtype.str}\0{arr.shape}\0".encode()
        if arr.dtype.kind == "O":
            items = [_as_bytes(v) for v in arr.reshape(-1)]
            parts += [head, repr([len(v) for v in items]).encode(), *items]
        else:
            parts += [head, np.ascontiguousarray(arr).tobytes()]
    return b"\0".join(parts)
