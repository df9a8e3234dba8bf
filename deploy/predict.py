"""``keel predict``'s inputs and answer: named tensors from the command line, every output printed.

``--input`` is repeatable. ``NAME=VALUE`` names one input of the target's signature; a
value without a name is the one input of a single-input target (the form before
signatures). A VALUE is JSON -- nested lists of numbers, or strings for a ``bytes`` input
(UTF-8) -- or a ``.npy`` file; a flat list that fills a fixed shape is reshaped to it.
The inputs are checked against the signature as the frontend checks them (missing,
extra, dtype, bounds, NaN), so a mistake is said here, before anything is sent::

    keel predict rec --spec cluster.toml --input dense='[0.1, ...]' --input ids='[3, 17, 4]'
    keel predict textcls --spec cluster.toml --input text='"a fine film"'

The answer is one JSON line: where it came from, and ``outputs`` (every named output;
bytes as UTF-8 text) beside ``output`` (the one output of a single-output target).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

from keel.common import inputs
from keel.common.signature import Signature, as_bytes, validate
from keel.common.spec import SpecError

#: ``NAME=`` at the start of an ``--input`` (a JSON value or a path never starts so)
NAMED = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\-]*)=(.*)$", re.DOTALL)


def signature_of(target: dict) -> Signature:
    """The target's signature (its description's), or the one ``input`` it describes."""
    from keel.services.oip.tensors import signature_of as described

    return described(target)


def _value(text: str, what: str) -> Any:
    if text.endswith(".npy"):
        return np.load(text, allow_pickle=False)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise SpecError(f"{what}: neither a .npy file nor JSON: {exc}") from None


def named_inputs(values: list[str], target: dict) -> dict[str, np.ndarray]:
    """``--input`` values as the target's named inputs, checked against its signature;
    a ``SpecError`` says what is wrong."""
    signature = signature_of(target)
    specs = {s.name: s for s in signature.client_inputs}
    raw: dict[str, Any] = {}
    for text in values:
        match = NAMED.match(text)
        if match is None and len(values) == 1 and len(specs) == 1:
            name, value = next(iter(specs)), text  # the single-input form
        elif match is None:
            raise SpecError(f"--input {text[:40]!r}: name each input, NAME=JSON (the model takes {', '.join(specs)})")
        else:
            name, value = match.groups()
        if name in raw:
            raise SpecError(f"--input {name} is given twice")
        raw[name] = _value(value, f"--input {name}")
    arrays: dict[str, Any] = {}
    for name, value in raw.items():
        spec = specs.get(name)
        if spec is not None and spec.dtype == "bytes":
            try:
                value = as_bytes(value, f"--input {name}")
            except inputs.InputError as exc:
                raise SpecError(str(exc)) from None
        else:
            value = np.asarray(value)
        if spec is not None and not spec.variable and value.shape != spec.shape and value.size == np.prod(spec.shape):
            value = value.reshape(spec.shape)  # a flat list filling a fixed shape
        arrays[name] = value
    try:
        checked = validate(signature, arrays)
    except inputs.InputError as exc:
        raise SpecError(str(exc)) from None
    return {n: np.ascontiguousarray(a) if a.dtype != object else a for n, a in checked.items()}


def inputs_of(values: list[str], target: dict, single: Any) -> np.ndarray | dict[str, np.ndarray]:
    """What ``keel predict`` sends: one bare ``--input`` to a one-tensor target goes as
    before (``single(text, target)``: a plain array); anything else as named inputs."""
    from keel.services.oip.tensors import is_single

    one_tensor = is_single(signature_of(target))
    if one_tensor and len(values) == 1 and NAMED.match(values[0]) is None:
        return single(values[0], target)
    named = named_inputs(values, target)
    return named["input"] if one_tensor else named


def _jsonable(x: Any) -> Any:
    arr = np.asarray(x)
    if arr.dtype == object:
        return [_jsonable(v) for v in arr] if arr.ndim else _text(arr.item())
    if arr.dtype.name == "bfloat16":
        arr = arr.astype(np.float32)
    return arr.tolist()


def _text(v: Any) -> Any:
    return v.decode("utf-8", errors="backslashreplace") if isinstance(v, (bytes, bytearray)) else v


def answer(result: Any) -> dict[str, Any]:
    """The printed answer of a ``Result``: its fields, ``output`` and every named output."""
    fields = ("request_id", "source", "model", "version", "latency_ms", "error", "error_code", "models", "confidence")
    out = {k: getattr(result, k, None) for k in fields}
    out["output"] = None if result.output is None else _jsonable(result.output)
    named = getattr(result, "outputs", None)
    if named is not None:
        out["outputs"] = {name: _jsonable(x) for name, x in named.items()}
    return out
