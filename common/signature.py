"""A model's signature: its named inputs and outputs, each a dtype and a per-request shape.

A ``TensorSpec`` is one named tensor: a dtype of ``DTYPES`` (numbers, bool, bfloat16 and
``bytes``) and the shape of one request's tensor (no batch axis), where -1 marks a
variable dim. Every variable dim has bounds, ``min_shape`` and ``max_shape``: a request
outside them is refused at the edge, and the ragged batcher (``common.ragged``) never pads
past them. An input may be a *mask* (``mask_for``): the batcher fills it, 1 where the
named input has a real element and 0 where it was padded; clients never send it.

Written on the command line (``keel model add --input``) as ``NAME:DTYPE:SHAPE``, a
shape's dims separated by commas:

- ``13``      a fixed dim;
- ``-1``      a variable dim bounded by the payload limit (``default_bound``);
- ``1..40``   a variable dim of 1 to 40 (``..40``: 0 to 40);
- ``scalar``  (the whole shape) one value per request;
- ``NAME:DTYPE:mask=OTHER`` a mask input, shaped as OTHER (bool or a number dtype).

A signature lives in a version's manifest (``to_dict``/``from_dict``). A version written
before signatures existed has none: ``Signature.single(input_shape, input_dtype,
output_size)`` is its signature, one input ``input`` and one float32 output ``output``,
which is also what ``--input-shape`` says.

``validate`` checks one request (or rows of them) of named arrays against a signature --
missing, extra, wrong dtype, a dim outside its bounds, NaN -- each with one message, as
an ``InputError`` (``common.inputs``): the frontend and gateway refuse it like any other
bad input. It is pure: it converts what can be converted safely and touches no state.

Example
-------
>>> sig = Signature([parse_input("dense:float32:13"), parse_input("ids:int64:1..40")],
...                 [TensorSpec("p", "float32", (1,))])
>>> sorted(validate(sig, {"dense": [0.0] * 13, "ids": [3, 1, 4]}))
['dense', 'ids']
>>> validate(sig, {"dense": [0.0] * 13, "ids": list(range(41))})  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
InputError: input 'ids': dim 0 is 41, over its bound 40
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from keel.common.inputs import InputError, coerce

#: the dtypes a signature names (Triton's BOOL..FP64, BF16, BYTES)
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bytes")
VARIABLE = -1
#: the payload limit the default bound of a variable dim comes from (``common.protocol``'s)
PAYLOAD_BYTES = 64 * 1024 * 1024
#: the name the single-input shorthand (``--input-shape``) and old manifests give their input and output
INPUT, OUTPUT = "input", "output"


class SignatureError(ValueError):
    """A signature that cannot be: a bad ``NAME:DTYPE:SHAPE``, a repeated name, a mask of
    nothing, a manifest's signature that does not parse. The message says what and why."""


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a signature dtype: ``bytes`` is an object array of ``bytes``,
    ``bfloat16`` is ml_dtypes' (numpy has none of its own)."""
    if name == "bytes":
        return np.dtype(object)
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise SignatureError("bfloat16 tensors need the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def dtype_name(dtype: Any) -> str:
    """The signature dtype of a numpy dtype (object and byte/unicode strings are ``bytes``)."""
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "bytes"
    if dt.name in DTYPES:
        return dt.name
    raise SignatureError(f"dtype {dt.name} is not one a signature names ({', '.join(DTYPES)})")


def default_bound(dtype: str, shape: Iterable[int], payload_bytes: int = PAYLOAD_BYTES) -> int:
    """The bound a variable dim gets when none is written: as large as one request may be
    under the payload limit, the variable dims sharing it equally. A bytes element counts
    as one byte (it is at least that), so its bound is loose; the payload limit still holds."""
    shape = list(shape)
    itemsize = 1 if dtype == "bytes" else numpy_dtype(dtype).itemsize
    fixed = math.prod(d for d in shape if d != VARIABLE)
    n_var = sum(d == VARIABLE for d in shape) or 1
    elements = max(payload_bytes // (itemsize * max(fixed, 1)), 1)
    return max(int(elements ** (1.0 / n_var)), 1)


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor of a signature: dtype and one request's shape (-1: variable)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    min_shape: tuple[int, ...] = ()   # () : the fixed dims, 0 for variable ones
    max_shape: tuple[int, ...] = ()   # () : the fixed dims, ``default_bound`` for variable ones
    mask_for: str | None = None       # a mask input: the input whose real elements it marks
    #: an output: per dim, the (input, dim) whose length it follows (None: its own), so the
    #: ragged batcher cuts each request's output back to its own length (``common.ragged``)
    follows: tuple[tuple[str, int] | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str) or any(c in self.name for c in ":=, "):
            raise SignatureError(f"tensor name {self.name!r}: a non-empty name without ':', '=', ',' or spaces")
        if self.dtype not in DTYPES:
            raise SignatureError(f"{self.name}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        shape = tuple(int(d) for d in self.shape)
        if any(d < VARIABLE for d in shape):
            raise SignatureError(f"{self.name}: shape {list(shape)}: dims are sizes >= 0, or -1 for a variable dim")
        lo = tuple(int(d) for d in self.min_shape) or tuple(0 if d == VARIABLE else d for d in shape)
        hi = tuple(int(d) for d in self.max_shape)
        if not hi:
            bound = default_bound(self.dtype, shape) if VARIABLE in shape else 0
            hi = tuple(bound if d == VARIABLE else d for d in shape)
        if len(lo) != len(shape) or len(hi) != len(shape):
            raise SignatureError(f"{self.name}: bounds {list(lo)}..{list(hi)} do not match shape {list(shape)}")
        for d, a, b in zip(shape, lo, hi):
            if (d != VARIABLE and a != d) or (d != VARIABLE and b != d) or not 0 <= a <= b:
                raise SignatureError(f"{self.name}: bounds {list(lo)}..{list(hi)} do not fit shape {list(shape)}")
        if self.mask_for is not None and self.dtype == "bytes":
            raise SignatureError(f"{self.name}: a mask is bool or numbers, not bytes")
        follows = tuple(None if f is None else (str(f[0]), int(f[1])) for f in self.follows)
        if follows and (len(follows) != len(shape) or any(f and d != VARIABLE for f, d in zip(follows, shape))):
            raise SignatureError(f"{self.name}: follows {list(follows)} does not match shape {list(shape)}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "min_shape", lo)
        object.__setattr__(self, "max_shape", hi)
        object.__setattr__(self, "follows", follows if any(follows) else ())

    @property
    def variable(self) -> bool:
        return VARIABLE in self.shape

    def dims_text(self) -> str:
        """The shape as ``--input`` writes it: ``13``, ``1..40``, ``scalar``."""
        if not self.shape:
            return "scalar"
        return ",".join(str(d) if d != VARIABLE else f"{lo}..{hi}"
                        for d, lo, hi in zip(self.shape, self.min_shape, self.max_shape))

    def text(self) -> str:
        """``NAME:DTYPE:SHAPE``, which ``parse_input`` reads back to this spec."""
        return f"{self.name}:{self.dtype}:" + (f"mask={self.mask_for}" if self.mask_for else self.dims_text())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.variable:
            out.update(min_shape=list(self.min_shape), max_shape=list(self.max_shape))
        if self.mask_for:
            out["mask_for"] = self.mask_for
        if self.follows:
            out["follows"] = [list(f) if f else None for f in self.follows]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        try:
            return cls(str(data["name"]), str(data["dtype"]), tuple(data["shape"]), tuple(data.get("min_shape") or ()),
                       tuple(data.get("max_shape") or ()), data.get("mask_for"), tuple(data.get("follows") or ()))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SignatureError):
                raise
            raise SignatureError(f"tensor {dict(data)!r} is not name, dtype and shape ({exc})") from None


def parse_dims(text: str, what: str = "shape") -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(shape, min_shape, max_shape) of ``13``, ``-1,8``, ``1..40``, ``..40``, ``scalar``;
    an empty max entry (-1 unbounded) is filled by ``TensorSpec`` with the default bound."""
    text = text.strip()
    if text in ("scalar", "[]", ""):
        if text == "":
            raise SignatureError(f"{what}: empty; write sizes like 13 or 1..40, or 'scalar'")
        return (), (), ()
    shape, lo, hi = [], [], []
    for part in text.replace("x", ",").split(","):
        part = part.strip()
        try:
            if ".." in part:
                a, b = part.split("..")
                lo_d, hi_d = int(a) if a.strip() else 0, int(b)
                if not 0 <= lo_d <= hi_d:
                    raise ValueError
                shape.append(VARIABLE)
                lo.append(lo_d)
                hi.append(hi_d)
            elif int(part) == VARIABLE:
                shape.append(VARIABLE)
                lo.append(0)
                hi.append(None)
            elif int(part) > 0:
                shape.append(int(part))
                lo.append(int(part))
                hi.append(int(part))
            else:
                raise ValueError
        except ValueError:
            raise SignatureError(f"{what}: {part!r} is not a dim: write a size (13), -1 (variable) or "
                                 "LO..HI (a variable dim and its bounds, e.g. 1..40)") from None
    return tuple(shape), tuple(lo), tuple(hi)  # type: ignore[arg-type]


def parse_input(text: str, payload_bytes: int = PAYLOAD_BYTES) -> TensorSpec:
    """A ``TensorSpec`` from ``NAME:DTYPE:SHAPE`` (see the module docstring)."""
    parts = text.split(":")
    if len(parts) != 3:
        raise SignatureError(f"--input {text!r}: want NAME:DTYPE:SHAPE, e.g. dense:float32:13 or ids:int64:1..40")
    name, dtype, dims = (p.strip() for p in parts)
    if dims.startswith("mask="):
        return TensorSpec(name, dtype, (), mask_for=dims[len("mask="):].strip() or None)
    shape, lo, hi = parse_dims(dims, f"--input {text!r}")
    bound = default_bound(dtype, shape, payload_bytes) if dtype in DTYPES else 1
    hi = tuple(bound if h is None else h for h in hi)
    return TensorSpec(name, dtype, shape, lo, hi)


@dataclass(frozen=True)
class Signature:
    """Named inputs (in the order a TorchScript model takes them) and named outputs."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...] = field(default=())

    def __post_init__(self) -> None:
        inputs = list(self.inputs)
        names = {s.name: s for s in inputs}
        for which, specs in (("input", inputs), ("output", list(self.outputs))):
            seen = [s.name for s in specs]
            twice = sorted({n for n in seen if seen.count(n) > 1})
            if twice:
                raise SignatureError(f"{which} name(s) {', '.join(twice)} given twice")
        if not inputs:
            raise SignatureError("a signature takes at least one input")
        resolved = []
        for spec in inputs:  # a mask takes the shape and bounds of the input it marks
            if spec.mask_for is not None:
                target = names.get(spec.mask_for)
                if target is None or target.mask_for is not None:
                    raise SignatureError(f"{spec.name}: mask of {spec.mask_for!r}, which is not an input")
                if not target.variable:
                    raise SignatureError(f"{spec.name}: mask of {target.name}, whose shape {list(target.shape)} "
                                         "has no variable dim: nothing is ever padded")
                spec = TensorSpec(spec.name, spec.dtype, target.shape, target.min_shape, target.max_shape, target.name)
            resolved.append(spec)
        object.__setattr__(self, "inputs", tuple(resolved))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @classmethod
    def single(cls, input_shape: Iterable[int], input_dtype: str = "float32", output_size: int | None = None) -> Signature:
        """The signature of the single-input shorthand and of a manifest that has none:
        ``input`` of ``input_shape`` in, ``output`` float32[output_size] out."""
        outputs = (TensorSpec(OUTPUT, "float32", (int(output_size),)),) if output_size is not None else ()
        return cls((TensorSpec(INPUT, dtype_name(input_dtype), tuple(input_shape)),), outputs)

    @property
    def client_inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs a request carries (masks are the batcher's)."""
        return tuple(s for s in self.inputs if s.mask_for is None)

    @property
    def masks(self) -> dict[str, str]:
        """input name -> the mask input that marks it."""
        return {s.mask_for: s.name for s in self.inputs if s.mask_for is not None}

    @property
    def variable(self) -> bool:
        return any(s.variable for s in self.inputs)

    @property
    def is_single(self) -> bool:
        """One fixed-shape numeric input named ``input``: the shorthand, old manifests, and
        the path that keeps the columns-and-bundles fast path."""
        return (len(self.inputs) == 1 and self.inputs[0].name == INPUT and not self.inputs[0].variable
                and self.inputs[0].dtype != "bytes")

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def output(self, name: str) -> TensorSpec:
        for spec in self.outputs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def legacy_fields(self) -> dict[str, Any]:
        """``input_shape``, ``input_dtype``, ``output_size`` as old readers of a manifest
        take them: the first input's, and the first output's element count (0 when that
        output has a variable dim or there are several inputs: no single shape serves it)."""
        first = self.client_inputs[0]
        size = math.prod(self.outputs[0].shape) if self.outputs and not self.outputs[0].variable else 0
        return {"input_shape": list(first.shape), "input_dtype": "float32" if first.dtype == "bytes" else first.dtype,
                "output_size": int(size) if self.is_single and len(self.outputs) == 1 else 0}

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [s.to_dict() for s in self.inputs], "outputs": [s.to_dict() for s in self.outputs]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Signature:
        if not isinstance(data, Mapping) or not isinstance(data.get("inputs"), list):
            raise SignatureError(f"a signature is {{'inputs': [...], 'outputs': [...]}}, got {data!r:.80}")
        return cls(tuple(TensorSpec.from_dict(d) for d in data["inputs"]),
                   tuple(TensorSpec.from_dict(d) for d in data.get("outputs") or ()))

    def describe(self) -> str:
        """Lines for ``keel model show``: each input and output, dtype and shape."""
        def line(kind: str, s: TensorSpec) -> str:
            shape = "[" + ", ".join("-1" if d == VARIABLE else str(d) for d in s.shape) + "]"
            var = [f"{lo}..{hi}" for d, lo, hi in zip(s.shape, s.min_shape, s.max_shape) if d == VARIABLE]
            extra = f"  variable dims {', '.join(var)}" if var else ""
            mask = f"  (mask of {s.mask_for}: filled by the batcher)" if s.mask_for else ""
            follows = [f"{f[0]}[{f[1]}]" for f in s.follows if f]
            extra += f"  length of {', '.join(follows)}" if follows else ""
            return f"  {kind:<6} {s.name:<16} {s.dtype:<8} {shape}{extra}{mask}"

        return "\n".join([line("input", s) for s in self.inputs] + [line("output", s) for s in self.outputs])


def as_bytes(x: Any, what: str) -> np.ndarray:
    """``x`` as an object array of ``bytes`` (str is UTF-8 encoded); anything else refused."""
    arr = np.asarray(x, dtype=object) if not isinstance(x, np.ndarray) else x
    if arr.dtype.kind == "S":
        return np.array(arr.tolist(), dtype=object).reshape(arr.shape) if arr.ndim else np.array(arr.item(), object)
    if arr.dtype.kind not in "OU":
        raise InputError(f"{what} takes bytes; got {arr.dtype.name} values")
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        if isinstance(v, (bytes, bytearray, memoryview)):
            flat_out[i] = bytes(v)
        elif isinstance(v, str):
            flat_out[i] = v.encode("utf-8")
        else:
            raise InputError(f"{what} takes bytes; element {i} is {type(v).__name__}")
    return out


def _check_shape(spec: TensorSpec, shape: tuple[int, ...], what: str) -> None:
    if len(shape) != len(spec.shape):
        raise InputError(f"{what}: shape {list(shape)} has {len(shape)} dim(s), the model takes "
                         f"{len(spec.shape)} ({spec.dims_text()})")
    for i, (got, d, lo, hi) in enumerate(zip(shape, spec.shape, spec.min_shape, spec.max_shape)):
        if d != VARIABLE and got != d:
            raise InputError(f"{what}: shape {list(shape)} is not [{spec.dims_text()}]")
        if got > hi:
            raise InputError(f"{what}: dim {i} is {got}, over its bound {hi}")
        if got < lo:
            raise InputError(f"{what}: dim {i} is {got}, under its minimum {lo}")


def validate_tensor(spec: TensorSpec, x: Any, *, rows: bool = False) -> np.ndarray:
    """``x`` as ``spec`` takes it (dtype converted when safe), or an ``InputError``."""
    what = f"input {spec.name!r}"
    if spec.dtype == "bytes":
        arr = as_bytes(x, what)
    else:
        if isinstance(x, np.ndarray) and x.dtype.kind in "OSU" or isinstance(x, (bytes, str)):
            raise InputError(f"{what} takes {spec.dtype}; got bytes or text")
        try:
            arr = coerce(x, numpy_dtype(spec.dtype), what)
        except (TypeError, ValueError) as exc:  # ragged lists, objects
            if isinstance(exc, InputError):
                raise
            raise InputError(f"{what} is not a tensor of {spec.dtype}: {exc}") from None
    if rows and arr.ndim == 0:
        raise InputError(f"{what}: a batch needs a first axis of rows")
    _check_shape(spec, tuple(arr.shape[1:] if rows else arr.shape), what)
    if spec.dtype in ("float16", "bfloat16", "float32", "float64") and arr.size:
        if not np.isfinite(arr.astype(np.float32, copy=False) if spec.dtype == "bfloat16" else arr).all():
            raise InputError(f"{what} contains NaN or infinity")
    return arr


def validate(signature: Signature, inputs: Any, *, rows: bool = False) -> dict[str, np.ndarray]:
    """One request's named arrays (or rows of them, axis 0 the batch, with ``rows``) as
    ``signature`` takes them, in its order; an ``InputError`` naming the first problem:
    missing inputs, extra ones, then each input's dtype, shape and values.

    Parameters
    ----------
    signature : Signature
    inputs : mapping of str to array-like
        A bare array is taken for a signature with one client input.
    rows : bool
        Each array's axis 0 is the batch (every array the same number of rows).
    """
    wanted = signature.client_inputs
    if not isinstance(inputs, Mapping):
        if len(wanted) != 1:
            raise InputError(f"the model takes named inputs {', '.join(s.text() for s in wanted)}; "
                             "send a dict of name -> tensor")
        inputs = {wanted[0].name: inputs}
    takes = ", ".join(s.text() for s in wanted)
    missing = [s.name for s in wanted if s.name not in inputs]
    if missing:
        raise InputError(f"missing input(s) {', '.join(map(repr, missing))}; the model takes {takes}")
    masks = {s.name for s in signature.inputs if s.mask_for}
    extra = [n for n in inputs if n not in {s.name for s in wanted}]
    if extra:
        said = [f"{n!r} (a mask the batcher fills)" if n in masks else repr(n) for n in extra]
        raise InputError(f"unknown input(s) {', '.join(said)}; the model takes {takes}")
    out = {s.name: validate_tensor(s, inputs[s.name], rows=rows) for s in wanted}
    if rows:
        counts = {n: len(a) for n, a in out.items()}
        if len(set(counts.values())) > 1:
            raise InputError(f"inputs have different numbers of rows: {counts}")
    return out
