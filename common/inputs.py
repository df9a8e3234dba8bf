"""What an input tensor must be to reach a target: one set of rules for every caller.

The client (``common.client``), the HTTP gateway and the gRPC gateway (through
``services.inference``) decode inputs their own way -- numpy arrays, JSON ``data``, binary
buffers -- and then hand the array to ``validate``, so a value is taken or refused the same
way whichever door it came in by:

- dtype: an input of another dtype is converted when no value changes kind (numpy's
  ``same_kind``): bools and ints to floats, any width to any other of the same kind, ints
  to a narrower int only when every value fits (never wrapped); floats never become ints
  or bools, signed ints never unsigned; anything else is an ``InputError``;
- shape: the target's ``input_shape``, or rows of it (axis 0 the batch) for a batch;
- values: no NaN or infinity in a float input.

The frontend validates every request the same way (``services.frontend``), whichever
door it came by. The rules of a call beside its input live here too, for the same
callers (``call_error``): which kinds of target take a ``key`` (an application's context,
a graph's stream) and which have versions (models), what a key and a ``timeout_ms`` may
be (the one description of a target is ``common.targets.describe``). The OIP v2 datatype names (``DATATYPES``) live here
too: both gateways speak them.

Example
-------
>>> x = validate([[1, 2, 3, 4]], [4], "float32", rows=True)
>>> x.dtype.name, x.shape
('float32', (1, 4))
>>> validate([1.5, 2.0], [2], "int32")  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
InputError: input takes int32 input; float64 cannot be converted to it safely
"""
from __future__ import annotations

from typing import Any

import numpy as np

#: OIP datatype <-> numpy dtype name
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64"}
OIP_OF = {v: k for k, v in DATATYPES.items()}

#: per kind of target: whether a call may name a ``key``, and whether it has versions
KEYED = {"model": False, "application": True, "graph": True}
VERSIONED = {"model": True, "application": False, "graph": False}
#: the longest deadline a call may name (ms): a day; a longer one is a mistake, not a wish
MAX_TIMEOUT_MS = 86_400_000.0
#: the longest key a call may name (characters)
MAX_KEY = 200


class InputError(ValueError):
    """An input no target would take: its message says what is wrong and what was expected.
    Each caller turns it into its own refusal (``BadInput``, an HTTP 400, ...)."""


def short(value: Any) -> str:
    """``repr(value)``, cut short: messages echo what came, never all of it."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def cast(x: np.ndarray, dtype: str | np.dtype, what: str = "input") -> np.ndarray:
    """``x`` as ``dtype``; an integer outside an integer dtype's range is refused, not wrapped."""
    target = np.dtype(dtype)
    if x.dtype == target:
        return x
    if target.kind in "iu" and x.dtype.kind in "iu" and x.size:
        lo, hi, fits = x.min(), x.max(), np.iinfo(target)
        if lo < fits.min or hi > fits.max:
            raise InputError(f"{what}: values {lo}..{hi} do not fit {OIP_OF.get(target.name, target.name)} "
                             f"({fits.min}..{fits.max})")
    with np.errstate(over="ignore", invalid="ignore"):  # a float beyond the range becomes inf: refused as not finite
        return x.astype(target)


def from_values(data: Any, datatype: str, what: str = "input") -> np.ndarray:
    """A tensor written as values (a list, flat or nested, as JSON carries it) as the OIP
    ``datatype``: numbers for the numeric types (integers for the integer ones), true/false
    for BOOL."""
    if not isinstance(data, list):
        raise InputError(f"{what}: data must be a list of values, got {short(data)}")
    try:
        x = np.asarray(data)  # bool, int64, uint64 or float64; strings, nulls and objects are refused below
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"{what}: data is not a tensor of {datatype}: {exc}") from None
    target = np.dtype(DATATYPES[datatype])
    allowed = "b" if target.kind == "b" else "biu" if target.kind in "iu" else "biuf"
    if x.size and x.dtype.kind not in allowed:
        kind = "true/false" if target.kind == "b" else "integers" if target.kind in "iu" else "numbers"
        raise InputError(f"{what}: data for {datatype} must be {kind}, got {x.dtype.name} values")
    return cast(x, target, what)


def coerce(x: Any, dtype: str | np.dtype, what: str = "input") -> np.ndarray:
    """``x`` as an array of ``dtype`` when no value changes kind (see the module docstring)."""
    arr = np.asarray(x)
    want = np.dtype(dtype)
    if arr.dtype == want:
        return arr
    if not np.can_cast(arr.dtype, want, "same_kind") or (arr.dtype.kind == "f" and want.kind in "iub"):
        raise InputError(f"{what} takes {want.name} input; {arr.dtype.name} cannot be converted to it safely")
    return cast(arr, want, what)


def validate(x: Any, shape: list[int] | None, dtype: str | np.dtype | None, *, rows: bool = False,
             what: str = "input", convert: bool = True) -> np.ndarray:
    """``x`` ready for a target taking ``shape`` and ``dtype`` (None: not known here, not
    checked); with ``rows``, axis 0 is the batch. Raises ``InputError``.

    Parameters
    ----------
    x : array-like
        One input, or rows of inputs.
    shape : list of int or None
        The target's ``input_shape``.
    dtype : str or None
        The target's ``input_dtype``; another dtype is converted when that is safe.
    rows : bool
        ``x`` is a batch: its rows must each have ``shape``.
    what : str
        How messages name the input (``"model 'm'"``, ``"input 'x'"``).
    convert : bool
        Whether another dtype is converted (the callers that decode inputs); without, it is
        refused (the frontend: what reaches it was converted by the client or gateway that
        sent it, or was sent as is by a caller told nothing, who learns the dtype this way).
    """
    if dtype is None:
        arr = np.asarray(x)
    elif convert:
        arr = coerce(x, dtype, what)
    else:
        arr = x
        if arr.dtype != dtype:
            raise InputError(f"{what} takes {np.dtype(dtype).name} input, got {arr.dtype.name}")
    if shape is not None:
        got = list(arr.shape[1:] if rows else arr.shape)
        if (rows and arr.ndim == 0) or got != list(shape):
            want = f"[-1, {', '.join(map(str, shape))}]" if rows else str(list(shape))
            raise InputError(f"{what}: shape {list(arr.shape)} is not {want}")
    if arr.dtype.kind in "fc" and arr.size and not np.isfinite(arr).all():
        raise InputError(f"{what} contains NaN or infinity")
    return arr


def key_error(key: Any) -> str | None:
    """Why ``key`` cannot be a call's key (a non-empty string of at most ``MAX_KEY``
    characters), or None."""
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY):
        return f"key must be a non-empty string of at most {MAX_KEY} characters, got {short(key)}"
    return None


def timeout_error(timeout_ms: Any, what: str = "timeout_ms") -> str | None:
    """Why ``timeout_ms`` cannot be a call's deadline (a number >= 0 and at most a day,
    ``MAX_TIMEOUT_MS``; 0 or None: the target's own), or None."""
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0:
        return f"{what} must be a number > 0, got {short(timeout_ms)}"
    if timeout_ms > MAX_TIMEOUT_MS:
        return f"{what} {timeout_ms} is more than a day"
    return None


def call_error(name: str, kind: str, key: Any = None, version: Any = None, timeout_ms: Any = None) -> str | None:
    """Why a call of target ``name`` (of ``kind``) with ``key``, ``version`` and
    ``timeout_ms`` cannot be taken, or None: a key only for the kinds that take one
    (``KEYED``), a version only for those that have versions (``VERSIONED``), and each as
    ``key_error`` and ``timeout_error`` say. Whether the version asked is served is the
    caller's to check (one frontend serves one version; a gateway sees them all)."""
    if key is not None and not KEYED[kind]:
        return f"{kind} {name!r} takes no key (only applications and graphs do)"
    if version is not None and not VERSIONED[kind]:
        return f"{kind} {name!r} has no versions (asked for version {str(version)[:40]})"
    return key_error(key) or timeout_error(timeout_ms)
