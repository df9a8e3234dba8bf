"""Keel's wire format: every message between Keel processes, and the one place that knows it.

A message is a ZeroMQ multipart list of frames::

    frame 0      header: an orjson dict {"v": PROTOCOL_VERSION, "kind": KIND, ...fields,
                 "tensors": [{"dtype": "float32", "shape": [n, ...]}, ...]}
    frame 1..n   one raw C-contiguous buffer per tensor field, in the order of the
                 message class's ``TENSORS``; sent zero-copy, read with np.frombuffer

On a ROUTER socket the routing envelope (identity, and an empty delimiter when the peer is
a REQ/DEALER that sends one) comes before frame 0; ``split_envelope`` separates it.

The header has room for what later layers add without a version bump: ``group`` (the ParM
coding-group tag of a batch: group id, index in the group, k) and ``lineage`` (HAMS
Algorithm 1 lineage entries) are optional fields that default to None.

Anything malformed -- wrong version, unknown kind, missing or mistyped field, a tensor
whose bytes do not match its dtype and shape, a disallowed dtype, an oversized payload --
raises ``ProtocolError``; a service answers it with an error reply when it can and keeps
running.

Example
-------
>>> import numpy as np
>>> msg = Predict(request_id="r1", model="digits", input=np.zeros(64, np.float32))
>>> decode(encode(msg)).request_id
'r1'
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
import orjson

PROTOCOL_VERSION = 1

#: dtypes a tensor frame may carry. Anything else is a ProtocolError at the edge.
ALLOWED_DTYPES = frozenset({"float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool"})

#: dtype -> wire name; ``np.dtype.name`` is a slow Python property on the hot path
DTYPE_NAMES = {np.dtype(name): name for name in ALLOWED_DTYPES}
_DTYPES = {name: np.dtype(name) for name in ALLOWED_DTYPES}

#: Default ceiling on one message's tensor bytes; services may set a lower one.
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 1024 * 1024


class ProtocolError(ValueError):
    """A message that cannot be decoded or violates the wire format.

    Raised only at the edge where frames become messages, so that a service can answer
    the sender with an error reply and keep serving instead of dying on bad input.
    """


class Kind(StrEnum):
    PREDICT = "predict"  # client -> frontend
    REPLY = "reply"  # frontend -> client
    QUERIES = "queries"  # frontend -> dispatcher
    BATCH = "batch"  # dispatcher -> worker, dispatcher -> encoder (copy), encoder -> dispatcher
    PREDICTIONS = "predictions"  # worker -> frontend / decoder, decoder -> frontend
    REGISTER = "register"  # worker -> dispatcher
    DONE = "done"  # worker -> dispatcher: a batch finished, its slot is free
    HEARTBEAT = "heartbeat"  # worker <-> dispatcher
    STATUS = "status"  # anyone -> service (request) and service -> asker (answer)


class Source(StrEnum):
    """Who produced the answer a client receives."""

    MODEL = "model"
    CACHE = "cache"
    DEFAULT = "default"  # Clipper's SLO default: the deadline passed first
    RECONSTRUCTION = "reconstruction"  # ParM: rebuilt from the parity output
    ERROR = "error"


class Role(StrEnum):
    DEPLOYED = "deployed"
    PARITY = "parity"


class ErrorCode(StrEnum):
    """Error kinds that cross the wire, so clients can tell them apart."""

    BAD_REQUEST = "bad_request"  # malformed frames, wrong dtype/shape, NaN, oversized
    UNKNOWN_MODEL = "unknown_model"
    OVERLOADED = "overloaded"  # admission queue full
    MODEL_ERROR = "model_error"  # the model raised on this batch
    DEADLINE = "deadline"  # the deadline passed and the model has no default output
    TIMEOUT = "timeout"  # client side: no frontend answered in time
    INTERNAL = "internal"


@dataclass(frozen=True, slots=True)
class CodingTag:
    """Place of a batch in a ParM coding group: the group, its index in it, and k."""

    group: int
    index: int
    k: int

    def to_json(self) -> list[int]:
        return [self.group, self.index, self.k]

    @classmethod
    def from_json(cls, value: Any) -> CodingTag | None:
        if value is None:
            return None
        if not (isinstance(value, list) and len(value) == 3 and all(type(v) is int for v in value)):
            raise ProtocolError(f"coding group tag must be [group, index, k], got {value!r}")
        return cls(*value)


# --------------------------------------------------------------------------- messages


@dataclass(slots=True)
class Predict:
    """One query from a client. ``timeout_ms`` is the client's deadline, relative."""

    KIND: ClassVar[Kind] = Kind.PREDICT
    TENSORS: ClassVar[tuple[str, ...]] = ("input",)
    request_id: str
    model: str
    input: np.ndarray
    timeout_ms: float | None = None
    version: str | None = None


@dataclass(slots=True)
class Reply:
    """The one answer to a Predict. ``output`` is None for errors."""

    KIND: ClassVar[Kind] = Kind.REPLY
    TENSORS: ClassVar[tuple[str, ...]] = ("output",)
    request_id: str
    source: str
    output: np.ndarray | None = None
    model: str | None = None
    version: str | None = None
    error: str | None = None
    error_code: str | None = None


@dataclass(slots=True)
class Queries:
    """Queries a frontend hands to the dispatcher: ``inputs`` stacks them on axis 0."""

    KIND: ClassVar[Kind] = Kind.QUERIES
    TENSORS: ClassVar[tuple[str, ...]] = ("inputs",)
    model: str
    qids: list[int]
    deadlines: list[float]  # absolute, time.time() seconds
    reply_to: str  # the frontend's prediction endpoint
    inputs: np.ndarray


@dataclass(slots=True)
class Batch:
    """A query batch (or ParM parity batch) for one worker; one row of ``inputs`` a query."""

    KIND: ClassVar[Kind] = Kind.BATCH
    TENSORS: ClassVar[tuple[str, ...]] = ("inputs",)
    batch_id: int
    model: str
    qids: list[int]
    reply_to: list[str]  # per query: where its prediction goes
    inputs: np.ndarray
    role: str = Role.DEPLOYED
    group: CodingTag | None = None
    #: parity batches only: {"model": deployed model, "encoder": "add"|"concat",
    #: "batches": [[qids, reply_to] per group index]}, so the decoder can answer a
    #: missing batch's queries from the parity output alone
    members: dict | None = None
    lineage: list | None = None


@dataclass(slots=True)
class Predictions:
    """Outputs of one batch, from a worker (or a reconstruction, from the decoder)."""

    KIND: ClassVar[Kind] = Kind.PREDICTIONS
    TENSORS: ClassVar[tuple[str, ...]] = ("outputs",)
    batch_id: int
    model: str
    qids: list[int]
    outputs: np.ndarray | None
    worker: str = ""
    role: str = Role.DEPLOYED
    source: str = Source.MODEL
    group: CodingTag | None = None
    service_ms: float = 0.0
    error: str | None = None
    reply_to: list[str] | None = None  # copies to the decoder: where each query's answer goes
    members: dict | None = None  # parity outputs: copied from the parity Batch
    lineage: list | None = None


@dataclass(slots=True)
class Register:
    """A worker announces itself and its free slots (credits) to the dispatcher."""

    KIND: ClassVar[Kind] = Kind.REGISTER
    TENSORS: ClassVar[tuple[str, ...]] = ()
    worker: str
    model: str
    role: str = Role.DEPLOYED
    slots: int = 1
    max_batch: int = 64


@dataclass(slots=True)
class Done:
    """A worker finished a batch: its slot is free again; ``service_ms`` feeds AIMD."""

    KIND: ClassVar[Kind] = Kind.DONE
    TENSORS: ClassVar[tuple[str, ...]] = ()
    worker: str
    batch_id: int
    batch_size: int
    service_ms: float
    ok: bool = True


@dataclass(slots=True)
class Heartbeat:
    KIND: ClassVar[Kind] = Kind.HEARTBEAT
    TENSORS: ClassVar[tuple[str, ...]] = ()
    sender: str
    known: bool = True  # dispatcher -> worker: False means "register again"


@dataclass(slots=True)
class Status:
    """A status request (``info`` None) or answer (``info`` a JSON-able dict)."""

    KIND: ClassVar[Kind] = Kind.STATUS
    TENSORS: ClassVar[tuple[str, ...]] = ()
    service: str = ""
    info: dict | None = None


MESSAGES: dict[str, type] = {
    cls.KIND: cls for cls in (Predict, Reply, Queries, Batch, Predictions, Register, Done, Heartbeat, Status)
}

# Per class: (header field names, required header field names). Computed once.
_FIELDS: dict[type, tuple[tuple[str, ...], frozenset[str]]] = {}
for _cls in MESSAGES.values():
    _names = tuple(f.name for f in dataclasses.fields(_cls) if f.name not in _cls.TENSORS)
    _required = frozenset(
        f.name
        for f in dataclasses.fields(_cls)
        if f.name not in _cls.TENSORS
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    _FIELDS[_cls] = (_names, _required)

# Per class: tensor fields that may not be absent (those not typed "... | None").
_REQUIRED_TENSORS: dict[type, frozenset[str]] = {
    _cls: frozenset(f.name for f in dataclasses.fields(_cls) if f.name in _cls.TENSORS and "None" not in str(f.type))
    for _cls in MESSAGES.values()
}


# --------------------------------------------------------------------------- encode/decode


def encode(msg: Any) -> list:
    """Frames for ``msg``: the orjson header, then one buffer per tensor (zero-copy)."""
    cls = type(msg)
    names, _ = _FIELDS[cls]
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": cls.KIND}
    for name in names:
        value = getattr(msg, name)
        if value is not None:
            header[name] = value.to_json() if isinstance(value, CodingTag) else value
    frames: list = [b""]
    descs = []
    for name in cls.TENSORS:
        arr = getattr(msg, name)
        if arr is None:
            descs.append(None)
            continue
        arr = np.asarray(arr)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)  # not on every array: it turns a 0-d tensor into shape (1,)
        name = DTYPE_NAMES.get(arr.dtype)
        if name is None:
            raise ProtocolError(f"dtype {arr.dtype} cannot go on the wire; allowed: {sorted(ALLOWED_DTYPES)}")
        descs.append({"dtype": name, "shape": list(arr.shape)})
        frames.append(arr.data if arr.nbytes else b"")
    if descs:
        header["tensors"] = descs
    frames[0] = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    return frames


def _frame_bytes(frame: Any) -> memoryview:
    """A byte view of a frame: a zmq.Frame (received with copy=False), bytes or a buffer."""
    view = memoryview(getattr(frame, "buffer", frame))
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def decode_header(frame: Any) -> dict:
    raw = getattr(frame, "bytes", frame)
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"header frame must be bytes, got {type(raw).__name__}")
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header must be a JSON object")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r} is not {PROTOCOL_VERSION}")
    return header


def decode_tensor(desc: Any, frame: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> np.ndarray:
    if not isinstance(desc, dict):
        raise ProtocolError("tensor descriptor must be an object")
    dtype, shape = desc.get("dtype"), desc.get("shape")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:  # a list or object is unhashable
        raise ProtocolError(f"dtype {dtype!r} is not one of {sorted(ALLOWED_DTYPES)}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) or len(shape) > 8:
        raise ProtocolError(f"shape must be a list of at most 8 non-negative ints, got {shape!r}")
    dt = _DTYPES[dtype]
    expected = math.prod(shape) * dt.itemsize
    if expected > max_bytes:
        raise ProtocolError(f"payload of {expected} bytes exceeds the limit of {max_bytes}")
    buf = _frame_bytes(frame)
    if len(buf) != expected:
        raise ProtocolError(f"tensor frame has {len(buf)} bytes, dtype {dtype} shape {shape} needs {expected}")
    return np.frombuffer(buf, dtype=dt).reshape(shape)


def decode(frames: list, max_payload: int = MAX_PAYLOAD_BYTES) -> Any:
    """The message in ``frames`` (no routing envelope). Raises ProtocolError if malformed."""
    if not frames:
        raise ProtocolError("empty message")
    header = decode_header(frames[0])
    kind = header.get("kind")
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None  # a list or object kind is unhashable
    if cls is None:
        raise ProtocolError(f"unknown message kind {header.get('kind')!r}")
    names, required = _FIELDS[cls]
    missing = required - header.keys()
    if missing:
        raise ProtocolError(f"{cls.KIND} message lacks {sorted(missing)}")
    kwargs = {name: header[name] for name in names if name in header}
    if "group" in kwargs:
        kwargs["group"] = CodingTag.from_json(kwargs["group"])
    if cls.TENSORS:
        descs = header.get("tensors")
        if not isinstance(descs, list) or len(descs) != len(cls.TENSORS):
            raise ProtocolError(f"{cls.KIND} needs {len(cls.TENSORS)} tensor descriptor(s)")
        present = [d for d in descs if d is not None]
        if len(frames) != 1 + len(present):
            raise ProtocolError(f"{cls.KIND} has {len(frames) - 1} tensor frames, header describes {len(present)}")
        total, i = 0, 1
        for name, desc in zip(cls.TENSORS, descs):
            if desc is None:
                if name in _REQUIRED_TENSORS[cls]:
                    raise ProtocolError(f"{cls.KIND} message lacks its {name} tensor")
                kwargs[name] = None
                continue
            arr = decode_tensor(desc, frames[i], max_payload - total)
            total += arr.nbytes
            kwargs[name] = arr
            i += 1
    elif len(frames) != 1:
        raise ProtocolError(f"{cls.KIND} carries no tensors but has {len(frames) - 1} extra frames")
    try:
        msg = cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(str(exc)) from None
    _check_types(msg)
    return msg


# Light type checks on the fields a peer could get wrong; deeper checks belong to services.
_STR_FIELDS = ("request_id", "model", "source", "worker", "sender", "role", "service")
_NUM_FIELDS = ("timeout_ms", "service_ms")
_INT_FIELDS = ("batch_id", "batch_size", "slots", "max_batch")


def _check_types(msg: Any) -> None:
    required = _FIELDS[type(msg)][1]
    for name in _STR_FIELDS:
        value = getattr(msg, name, "")
        if value is None and name not in required:
            continue
        if not isinstance(value, str):
            raise ProtocolError(f"{name} must be a string, got {type(value).__name__}")
    for name in _NUM_FIELDS:
        value = getattr(msg, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ProtocolError(f"{name} must be a number, got {type(value).__name__}")
    for name in _INT_FIELDS:
        value = getattr(msg, name, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{name} must be an integer, got {type(value).__name__}")
    reply_to = getattr(msg, "reply_to", "")
    if not isinstance(reply_to, str) and not (
        isinstance(reply_to, list) and all(isinstance(r, str) for r in reply_to)
    ) and reply_to is not None:
        raise ProtocolError("reply_to must be a string or a list of strings")
    for name in ("qids", "deadlines"):
        value = getattr(msg, name, None)
        if value is not None and not isinstance(value, list):
            raise ProtocolError(f"{name} must be a list")
    for arr_name in getattr(msg, "TENSORS", ()):
        arr = getattr(msg, arr_name)
        qids = getattr(msg, "qids", None)
        if arr is not None and qids is not None and (arr.ndim == 0 or arr.shape[0] != len(qids)):
            rows = arr.shape[0] if arr.ndim else "no"
            raise ProtocolError(f"{arr_name} has {rows} rows for {len(qids)} query ids")


def split_envelope(frames: list) -> tuple[list, list]:
    """(envelope, body) of a message read from a ROUTER: the identity frame, plus the empty
    delimiter a REQ peer adds (Keel's DEALER peers send none)."""
    if len(frames) > 1 and len(_frame_bytes(frames[1])) == 0:
        return frames[:2], frames[2:]
    return frames[:1], frames[1:]
