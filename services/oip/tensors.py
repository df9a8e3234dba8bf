"""OIP v2 tensors <-> named numpy arrays: the conversions both gateways share, pure.

A model's ``Signature`` (``common.signature``) names its inputs and outputs; the Open
Inference Protocol (KServe v2, which Triton speaks) names the same tensors with a
datatype and a shape whose axis 0 is the batch: each row is one Keel request. This module
holds what turns one into the other, whatever the transport, and touches no socket:

- the datatype tables (``DATATYPE_OF`` signature dtype -> OIP, ``DTYPE_OF`` back);
- BYTES as Triton lays it out in a binary buffer: each element a 4-byte little-endian
  length and its bytes (``encode_bytes``/``decode_bytes``); in JSON a BYTES element is a
  string (UTF-8);
- a tensor from JSON ``data`` (``from_json``), a binary buffer (``from_raw``) or a gRPC
  ``InferTensorContents`` (``from_contents``), and back (``to_json``, ``to_raw``,
  ``fill_contents``); BF16 is ml_dtypes' ``bfloat16`` (2 bytes, as tritonclient sends it);
- ``check_inputs``: the request's tensors against the signature -- missing, extra, a
  datatype other than the signature's, a shape outside the bounds, NaN -- each an
  ``InputError`` with one message (the gateway's 400 / INVALID_ARGUMENT);
- ``metadata`` and ``model_config``: what ``GET /v2/models/M`` and ``/config`` answer
  (Triton's model configuration JSON: what perf_analyzer and tritonclient read).

Example
-------
>>> sig = Signature((TensorSpec("ids", "int64", (-1,)),), (TensorSpec("p", "float32", (1,)),))
>>> x = from_json([[3, 1, 4]], "INT64", [1, 3], "input 'ids'")
>>> check_inputs(sig, {"ids": ("INT64", x)})["ids"].shape
(1, 3)
>>> decode_bytes(encode_bytes(np.array([b"hi", b""], dtype=object)), 2, "t").tolist()
[b'hi', b'']
"""
from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from keel.common.inputs import InputError, cast, short
from keel.common.signature import Signature, TensorSpec, numpy_dtype, validate

#: signature dtype -> OIP datatype (Triton's names)
DATATYPE_OF = {"bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "int16": "INT16", "int32": "INT32",
               "int64": "INT64", "float16": "FP16", "bfloat16": "BF16", "float32": "FP32", "float64": "FP64",
               "bytes": "BYTES"}
#: OIP datatype -> signature dtype; the OIP's wider unsigned ints decode too (a model then refuses them by name)
DTYPE_OF = {**{v: k for k, v in DATATYPE_OF.items()}, "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64"}
#: OIP datatype -> (its field of gRPC's InferTensorContents, that field's numpy type); FP16 and BF16 go raw only
CONTENTS_OF = {"BOOL": ("bool_contents", "bool"), "INT8": ("int_contents", "int32"),
               "INT16": ("int_contents", "int32"), "INT32": ("int_contents", "int32"),
               "INT64": ("int64_contents", "int64"), "UINT8": ("uint_contents", "uint32"),
               "UINT16": ("uint_contents", "uint32"), "UINT32": ("uint_contents", "uint32"),
               "UINT64": ("uint64_contents", "uint64"), "FP32": ("fp32_contents", "float32"),
               "FP64": ("fp64_contents", "float64"), "BYTES": ("bytes_contents", "object")}
#: the rows one OIP request may carry, as the model configuration says (each row is one Keel request)
MAX_BATCH_SIZE = 256
LENGTH = struct.Struct("<I")


def np_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of an OIP datatype (BYTES: object)."""
    name = DTYPE_OF[datatype]
    return numpy_dtype(name) if name in DATATYPE_OF else np.dtype(name)


def check_header(name: Any, datatype: Any, shape: Any) -> str:
    """What a message calls the tensor; an ``InputError`` when its name, datatype or shape
    cannot be a tensor at all."""
    if not isinstance(name, str) or not name:
        raise InputError(f"a tensor's name must be a non-empty string, got {short(name)}")
    what = f"input {short(name)}"
    if not isinstance(datatype, str) or datatype not in DTYPE_OF:
        raise InputError(f"{what}: datatype {short(datatype)} is not one of {sorted(DTYPE_OF)}")
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
        raise InputError(f"{what}: shape must be a list of sizes >= 0, got {short(shape)}")
    return what


# ---------------------------------------------------------------------- BYTES

def encode_bytes(x: np.ndarray) -> bytes:
    """A BYTES tensor as Triton's buffer: per element (row-major) its length (4 bytes,
    little-endian) and its bytes; a ``str`` element is UTF-8."""
    parts = []
    for v in np.asarray(x, dtype=object).reshape(-1):
        b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        parts += (LENGTH.pack(len(b)), b)
    return b"".join(parts)


def decode_bytes(buf: bytes | memoryview, count: int, what: str) -> np.ndarray:
    """``count`` length-prefixed elements of ``buf`` as an object array of ``bytes``;
    an ``InputError`` when the buffer is not exactly that."""
    buf = memoryview(buf)
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(buf):
            raise InputError(f"{what}: BYTES buffer of {len(buf)} bytes ends before element {i} of {count}")
        (n,) = LENGTH.unpack_from(buf, offset)
        offset += 4
        if offset + n > len(buf):
            raise InputError(f"{what}: BYTES element {i} says {n} bytes, but the buffer ends {len(buf) - offset} later")
        out[i] = bytes(buf[offset:offset + n])
        offset += n
    if offset != len(buf):
        raise InputError(f"{what}: {len(buf) - offset} bytes left after the {count} BYTES elements of its shape")
    return out


# ---------------------------------------------------------------------- decoding

def from_raw(raw: bytes | memoryview, datatype: str, shape: list[int], what: str) -> np.ndarray:
    """A tensor from its binary buffer (the HTTP binary-data extension, gRPC's
    ``raw_input_contents``): little-endian values, or length-prefixed BYTES elements."""
    count = math.prod(shape)  # exact: a product past int64 is only a size that does not match
    if datatype == "BYTES":
        return decode_bytes(raw, count, what).reshape(shape)
    dtype = np_dtype(datatype)
    if len(raw) != count * dtype.itemsize:
        raise InputError(f"{what}: {len(raw)} bytes do not hold shape {list(shape)} of {datatype}")
    return np.frombuffer(raw, dtype).reshape(shape)  # the host is little-endian, as the protocol (x86, ARM)


def _flatten(data: list) -> list:
    """JSON ``data``, flat or nested lists, as one row-major list."""
    out: list = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def from_json(data: Any, datatype: str, shape: list[int], what: str) -> np.ndarray:
    """A tensor from JSON ``data`` (flat or nested, row-major): numbers for the numeric
    datatypes (integers for the integer ones), true/false for BOOL, strings for BYTES."""
    if not isinstance(data, list):
        raise InputError(f"{what}: data must be a list of values, got {short(data)}")
    count = math.prod(shape)
    if datatype == "BYTES":
        flat = _flatten(data)
        bad = next((v for v in flat if not isinstance(v, str)), None)
        if bad is not None:
            raise InputError(f"{what}: data for BYTES must be strings, got {short(bad)}")
        x = np.empty(len(flat), dtype=object)
        x[:] = [v.encode("utf-8") for v in flat]
    else:
        try:
            x = np.asarray(data)  # bool, int64, uint64 or float64; strings, nulls and ragged lists are refused below
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{what}: data is not a tensor of {datatype}: {exc}") from None
        kind = np_dtype(datatype).kind
        allowed = "b" if kind == "b" else "biu" if kind in "iu" else "biuf"
        if x.size and x.dtype.kind not in allowed:
            said = "true/false" if kind == "b" else "integers" if kind in "iu" else "numbers"
            raise InputError(f"{what}: data for {datatype} must be {said}, got {x.dtype.name} values")
        if datatype == "BF16":  # numpy casts to ml_dtypes' bfloat16 only from floats
            x = x.astype(np.float32)
        x = cast(x, np_dtype(datatype), what)
    if x.size != count:
        raise InputError(f"{what}: {x.size} values do not fill shape {list(shape)}")
    return x.reshape(shape)


def from_contents(contents: Any, datatype: str, shape: list[int], what: str) -> np.ndarray:
    """A tensor from gRPC's typed ``InferTensorContents`` (the datatype's own field)."""
    if datatype not in CONTENTS_OF:
        raise InputError(f"{what}: {datatype} travels only in raw_input_contents")
    field, wire = CONTENTS_OF[datatype]
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InputError(f"{what}: {len(values)} values in contents.{field} do not fill shape {list(shape)}")
    if datatype == "BYTES":
        x = np.empty(count, dtype=object)
        x[:] = [bytes(v) for v in values]
        return x.reshape(shape)
    return cast(np.array(values, dtype=wire), np_dtype(datatype), what).reshape(shape)


# ---------------------------------------------------------------------- encoding

def datatype_of(x: np.ndarray) -> str:
    """The OIP datatype of an output array (object and strings: BYTES)."""
    dt = np.asarray(x).dtype
    if dt.kind in "OSU":
        return "BYTES"
    name = "bfloat16" if dt.name == "bfloat16" else dt.name
    if name in DATATYPE_OF:
        return DATATYPE_OF[name]
    if name in ("uint16", "uint32", "uint64"):
        return name.upper()
    raise InputError(f"an output of dtype {dt.name} has no OIP datatype")


def to_raw(x: np.ndarray) -> bytes:
    """An output as its binary buffer (``from_raw``'s inverse)."""
    if datatype_of(x) == "BYTES":
        return encode_bytes(x)
    return np.ascontiguousarray(x).tobytes()


def to_json(x: np.ndarray, name: str) -> list:
    """An output as flat JSON ``data``: BYTES as UTF-8 strings (others must go binary), BF16 as floats."""
    datatype = datatype_of(x)
    flat = np.asarray(x).reshape(-1)
    if datatype == "BYTES":
        try:
            return [v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v) for v in flat]
        except UnicodeDecodeError:
            raise InputError(f"output {name!r} holds bytes that are not UTF-8: ask for it as binary data "
                             '(parameters {"binary_data": true})') from None
    if datatype == "BF16":
        flat = flat.astype(np.float32)
    return flat.tolist()


def fill_contents(contents: Any, x: np.ndarray) -> None:
    """An output into gRPC's typed ``InferTensorContents`` (FP16 and BF16 have no field:
    they go raw, so a typed request gets them as FP32's values' widths, refused here)."""
    datatype = datatype_of(x)
    if datatype not in CONTENTS_OF:
        raise InputError(f"an output of {datatype} travels only in raw_output_contents: send the inputs raw")
    field, _ = CONTENTS_OF[datatype]
    flat = np.asarray(x).reshape(-1)
    getattr(contents, field).extend([bytes(v) if not isinstance(v, str) else v.encode("utf-8") for v in flat]
                                    if datatype == "BYTES" else flat.tolist())


# ---------------------------------------------------------------------- signature

def signature_of(target: Mapping[str, Any]) -> Signature:
    """A target's signature: its description's ``signature``, or the one input ``input``
    and one FP32 ``output`` of a target described without one."""
    if isinstance(target.get("signature"), Mapping):
        return Signature.from_dict(target["signature"])
    size = target.get("output_size")
    return Signature.single(target["input_shape"], target.get("input_dtype") or "float32", size or None)


def is_single(signature: Signature) -> bool:
    """Whether a target takes the one-tensor path (one fixed-shape numeric ``input``, one
    FP32 ``output``, or outputs unknown): its rows go as plain arrays, answered by
    ``Result.output``, exactly as before signatures."""
    outputs = signature.outputs
    return signature.is_single and (not outputs or (len(outputs) == 1 and outputs[0].name == "output"
                                                    and outputs[0].dtype == "float32"))


def check_inputs(signature: Signature, tensors: Mapping[str, tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """A request's tensors (name -> (OIP datatype, array with the batch axis first)) as the
    signature takes them: each datatype must be the signature's (as Triton refuses another),
    then ``common.signature.validate`` (missing, extra, shape and bounds, NaN). A scalar
    input may come as ``[rows]`` or ``[rows, 1]`` (Triton's reshape of a scalar)."""
    arrays = {}
    specs = {s.name: s for s in signature.client_inputs}
    for name, (datatype, x) in tensors.items():
        spec = specs.get(name)
        if spec is not None:
            want = DATATYPE_OF[spec.dtype]
            if datatype != want:
                raise InputError(f"input {name!r}: datatype {datatype}, but the model takes {want}")
            if not spec.shape and x.ndim == 2 and x.shape[1] == 1:
                x = x.reshape(-1)
            if x.ndim == 0:
                raise InputError(f"input {name!r}: shape [] has no batch axis; send [rows, {spec.dims_text()}]")
        arrays[name] = x
    out = validate(signature, arrays, rows=True)
    rows = {len(a) for a in out.values()}
    if rows == {0}:
        raise InputError("the request has no rows (axis 0 of every input is 0)")
    return out


def requested(signature: Signature, names: list[str] | None) -> list[str] | None:
    """The outputs a request asks for by name (None: all); an ``InputError`` for a name the
    model does not answer (when its outputs are known)."""
    if names is None:
        return None
    known = [s.name for s in signature.outputs]
    unknown = [n for n in names if known and n not in known]
    if unknown:
        raise InputError(f"unknown output(s) {', '.join(map(repr, unknown))}; the model answers {', '.join(known)}")
    return list(dict.fromkeys(names))


def stack_rows(rows: list[Mapping[str, np.ndarray]], names: list[str] | None) -> dict[str, np.ndarray]:
    """Each row's named outputs stacked into one tensor per name (batch axis first), only
    ``names`` (None: every one the rows have), in the rows' order of names."""
    first = rows[0]
    wanted = list(first) if names is None else names
    out = {}
    for name in wanted:
        if any(name not in r for r in rows):
            raise InputError(f"output {name!r} is not among the model's outputs ({', '.join(first)})")
        parts = [np.asarray(r[name]) for r in rows]
        shapes = {p.shape for p in parts}
        if len(shapes) > 1:  # a variable output of rows of equal inputs: the model's doing, not the caller's
            raise ValueError(f"output {name!r} has rows of different shapes {sorted(shapes)}")
        out[name] = np.stack(parts) if len(parts) > 1 else parts[0][None]
    return out


def _dims(spec: TensorSpec) -> list[int]:
    return list(spec.shape)


def metadata(name: str, target: Mapping[str, Any], signature: Signature) -> dict[str, Any]:
    """``GET /v2/models/{name}``: versions served, each client input and output with its
    datatype and shape ([-1, *dims], -1 also for a variable dim)."""
    def tensor(spec: TensorSpec) -> dict[str, Any]:
        return {"name": spec.name, "datatype": DATATYPE_OF[spec.dtype], "shape": [-1, *_dims(spec)]}
    return {"name": name, "versions": list(target.get("versions") or []), "platform": "keel",
            "inputs": [tensor(s) for s in signature.client_inputs], "outputs": [tensor(s) for s in signature.outputs],
            "parameters": {"keel_kind": target.get("kind", "model"), "keel_key": bool(target.get("key"))}}


def model_config(name: str, signature: Signature, max_batch_size: int = MAX_BATCH_SIZE) -> dict[str, Any]:
    """``GET /v2/models/{name}/config``: Triton's model configuration JSON, what
    perf_analyzer and tritonclient read: the batch axis (``max_batch_size``: rows of one
    request, each a Keel request), each input and output as ``TYPE_*`` and dims without
    it (a scalar per row is dims [1] reshaped to [], as Triton writes it)."""
    def tensor(spec: TensorSpec) -> dict[str, Any]:
        out: dict[str, Any] = {"name": spec.name, "data_type": "TYPE_" + ("STRING" if spec.dtype == "bytes" else
                                                                          DATATYPE_OF[spec.dtype]),
                               "dims": _dims(spec) or [1]}
        if not spec.shape:
            out["reshape"] = {"shape": []}
        return out
    return {"name": name, "platform": "keel", "backend": "keel", "max_batch_size": max_batch_size,
            "input": [tensor(s) for s in signature.client_inputs], "output": [tensor(s) for s in signature.outputs],
            "dynamic_batching": {}, "model_transaction_policy": {"decoupled": False},
            "instance_group": [{"kind": "KIND_CPU", "count": 1}]}
