"""Keel's wire format: every message between Keel processes, and the one place that knows it.

A message is a ZeroMQ multipart list of frames::

    frame 0      header: an orjson dict {"v": PROTOCOL_VERSION, "kind": KIND, ...fields,
                 "tensors": [{"dtype": "float32", "shape": [n, ...]}, ...]}
    frame 1..n   one raw C-contiguous buffer per tensor field, in the order of the
                 message class's ``TENSORS``; sent zero-copy, read with np.frombuffer

On a ROUTER socket the routing envelope (identity, and an empty delimiter when the peer is
a REQ/DEALER that sends one) comes before frame 0; ``split_envelope`` separates it.

The papers' structures travel as typed fields, checked at the edge like every other:
``group`` (``CodingTag``: the ParM coding group of a batch, its index in it, and k),
``members`` (``ParityMembers``: which queries a parity batch covers, ParM §4.1) and
``lineage`` (``LineageEntry`` list: HAMS Algorithm 1).

Ids carry their sender's incarnation (``common.ids``): a frontend's query ids and a
dispatcher's batch and coding-group ids have the epoch chosen at the process's start in
their high bits, so after a restart nothing can match new work to an old id.

Deadlines cross process boundaries as remaining budgets (``budgets_ms``: milliseconds
left when the message was sent), never as wall-clock times, so hosts need not agree on
the time; each receiver turns a budget into a deadline on its own monotonic clock.

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
#: Bounds on what a peer can make a service hold or allocate from one small message.
MAX_REQUEST_ID = 256  # characters of a client's request id
MAX_NAME = 256  # characters of a model, worker or service name
MAX_K = 64  # a coding group's size
MAX_SLOTS = 1024  # credits one worker may announce
MAX_BATCH = 65_536  # queries in one batch
MAX_THREADS = 256
MAX_ID = 2**63 - 1  # query, batch and group ids fit a signed 64-bit integer


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
    LEAVE = "leave"  # worker -> dispatcher: shutting down, drop me now
    CONFIGURE = "configure"  # dispatcher -> worker: change concurrency (slots) or torch threads
    ANSWERED = "answered"  # frontend -> dispatcher: queries already answered (not by their model)


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


def _is_int(value: Any, lo: int = 0, hi: int = MAX_ID) -> bool:
    return type(value) is int and lo <= value <= hi


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int and 0 <= v <= MAX_ID for v in value)


def _is_strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


@dataclass(frozen=True, slots=True)
class CodingTag:
    """Place of a batch in a ParM coding group: the group, its index in it, and k.

    Index k (one past the last query batch) marks the group's parity batch."""

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
        group, index, k = value
        if not (_is_int(group) and _is_int(k, 2, MAX_K) and _is_int(index, 0, k)):
            raise ProtocolError(f"coding group tag {value!r}: need group >= 0, 2 <= k <= {MAX_K}, 0 <= index <= k")
        return cls(group, index, k)


@dataclass(frozen=True, slots=True)
class MemberBatch:
    """One query batch of a coding group, as its parity batch remembers it."""

    qids: list[int]
    reply_to: list[str]  # per query: its frontend

    def to_json(self) -> list:
        return [self.qids, self.reply_to]


@dataclass(frozen=True, slots=True)
class ParityMembers:
    """What a parity batch covers (ParM §4.1): the deployed model, the encoder, and the k
    query batches of its coding group in index order. A member is None when the group was
    encoded partial (it did not fill before the encoder's timeout), so the decoder can
    answer a missing batch's queries from the parity output alone."""

    model: str
    encoder: str
    batches: list[MemberBatch | None]

    def to_json(self) -> dict:
        return {"model": self.model, "encoder": self.encoder,
                "batches": [None if b is None else b.to_json() for b in self.batches]}

    @classmethod
    def from_json(cls, value: Any) -> ParityMembers | None:
        if value is None:
            return None
        if not (isinstance(value, dict) and set(value) == {"model", "encoder", "batches"}):
            raise ProtocolError("members must be {model, encoder, batches}")
        model, encoder, batches = value["model"], value["encoder"], value["batches"]
        if not (isinstance(model, str) and encoder in ("add", "concat") and isinstance(batches, list)
                and 2 <= len(batches) <= MAX_K):
            raise ProtocolError(f"members: model a string, encoder add|concat, 2..{MAX_K} batches")
        out: list[MemberBatch | None] = []
        for b in batches:
            if b is None:
                out.append(None)
                continue
            if not (isinstance(b, list) and len(b) == 2 and _is_ids(b[0]) and _is_strs(b[1]) and len(b[0]) == len(b[1])):
                raise ProtocolError("members: each batch must be [qids, reply_to] of equal length, or null")
            out.append(MemberBatch(b[0], b[1]))
        if all(b is None for b in out):
            raise ProtocolError("members: a parity batch covers at least one query batch")
        return cls(model, encoder, out)


@dataclass(frozen=True, slots=True)
class LineageEntry:
    """One step of a request's path through a service graph (HAMS Algorithm 1): the
    predecessor operator and the sequence number it gave the message, this operator and
    the sequence number it gives it."""

    predecessor: str
    predecessor_seq: int
    operator: str
    seq: int

    def to_json(self) -> list:
        return [self.predecessor, self.predecessor_seq, self.operator, self.seq]

    @staticmethod
    def list_from_json(value: Any) -> list[LineageEntry] | None:
        if value is None:
            return None
        if not isinstance(value, list):
            raise ProtocolError("lineage must be a list of [predecessor, its seq, operator, seq]")
        out = []
        for e in value:
            if not (isinstance(e, list) and len(e) == 4 and isinstance(e[0], str) and _is_int(e[1])
                    and isinstance(e[2], str) and _is_int(e[3])):
                raise ProtocolError(f"lineage entry must be [predecessor, its seq, operator, seq], got {e!r}")
            out.append(LineageEntry(*e))
        return out


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
    budgets_ms: list[float]  # per query: time left to its deadline when sent
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
    #: per query: time left to its deadline when the batch was sent (None: no deadline)
    budgets_ms: list[float] | None = None
    members: ParityMembers | None = None  # parity batches only
    lineage: list[LineageEntry] | None = None


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
    budgets_ms: list[float] | None = None  # copies to the decoder: as in the Batch
    members: ParityMembers | None = None  # parity outputs: copied from the parity Batch
    lineage: list[LineageEntry] | None = None


@dataclass(slots=True)
class Register:
    """A worker announces itself to the dispatcher: its slots (credits), its largest batch,
    and what schedulers need to know of it (Kairos: instance kind and price; SERF: torch
    threads)."""

    KIND: ClassVar[Kind] = Kind.REGISTER
    TENSORS: ClassVar[tuple[str, ...]] = ()
    worker: str
    model: str
    role: str = Role.DEPLOYED
    slots: int = 1
    max_batch: int = 64
    instance: str = ""  # instance type, e.g. "c5.xlarge"; "" = unspecified
    price: float = 0.0  # cost per hour of the instance
    threads: int = 1


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
    error: str | None = None  # why the batch failed (model error, undeliverable predictions)


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


@dataclass(slots=True)
class Leave:
    """A worker shutting down (SIGTERM): the dispatcher drops it at once and re-queues
    whatever it held, instead of waiting for its heartbeats to stop."""

    KIND: ClassVar[Kind] = Kind.LEAVE
    TENSORS: ClassVar[tuple[str, ...]] = ()
    worker: str


@dataclass(slots=True)
class Configure:
    """The dispatcher changes a worker's concurrency (slots) or torch threads (SERF)."""

    KIND: ClassVar[Kind] = Kind.CONFIGURE
    TENSORS: ClassVar[tuple[str, ...]] = ()
    slots: int | None = None
    threads: int | None = None


@dataclass(slots=True)
class Answered:
    """Queries of ``model`` the frontend answered other than by their own prediction (a
    reconstruction): the dispatcher need not run them again if their worker dies."""

    KIND: ClassVar[Kind] = Kind.ANSWERED
    TENSORS: ClassVar[tuple[str, ...]] = ()
    model: str
    qids: list[int]


MESSAGES: dict[str, type] = {
    cls.KIND: cls
    for cls in (Predict, Reply, Queries, Batch, Predictions, Register, Done, Heartbeat, Status, Leave, Configure, Answered)
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
            if name in _TYPED:
                value = [e.to_json() for e in value] if name == "lineage" else value.to_json()
            header[name] = value
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
    version = header.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:  # true and 1.0 are not 1
        raise ProtocolError(f"protocol version {version!r} is not {PROTOCOL_VERSION}")
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
    for name in _TYPED.keys() & kwargs.keys():
        kwargs[name] = _TYPED[name](kwargs[name])
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


# Fields that travel as JSON but are typed on both sides of the wire.
_TYPED = {"group": CodingTag.from_json, "members": ParityMembers.from_json, "lineage": LineageEntry.list_from_json}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _budgets(value: Any) -> bool:
    return isinstance(value, list) and all(_finite(v) for v in value)


def _str_max(n: int, empty: bool = True):
    return lambda v: isinstance(v, str) and len(v) <= n and (empty or bool(v))


# Per field: (check, what a valid value is). Fields every message kind shares a meaning of.
_CHECKS: dict[str, tuple[Any, str]] = {
    "request_id": (_str_max(MAX_REQUEST_ID), f"a string of at most {MAX_REQUEST_ID} characters"),
    "model": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "worker": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "sender": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "service": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "source": (lambda v: isinstance(v, str), "a string"),
    "role": (lambda v: v in (Role.DEPLOYED, Role.PARITY), "deployed or parity"),
    "instance": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "version": (_str_max(MAX_NAME), "a string"),
    "error": (lambda v: isinstance(v, str), "a string"),
    "error_code": (lambda v: isinstance(v, str), "a string"),
    "timeout_ms": (lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    "service_ms": (lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    "price": (lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    "batch_id": (_is_int, f"an integer in 0..{MAX_ID}"),
    "batch_size": (lambda v: _is_int(v, 0, MAX_BATCH), f"an integer in 0..{MAX_BATCH}"),
    "slots": (lambda v: _is_int(v, 1, MAX_SLOTS), f"an integer in 1..{MAX_SLOTS}"),
    "max_batch": (lambda v: _is_int(v, 1, MAX_BATCH), f"an integer in 1..{MAX_BATCH}"),
    "threads": (lambda v: _is_int(v, 1, MAX_THREADS), f"an integer in 1..{MAX_THREADS}"),
    "qids": (lambda v: _is_ids(v) and len(v) <= MAX_BATCH, f"a list of at most {MAX_BATCH} integers in 0..{MAX_ID}"),
    "budgets_ms": (_budgets, "a list of finite numbers"),
    "ok": (lambda v: isinstance(v, bool), "true or false"),
    "known": (lambda v: isinstance(v, bool), "true or false"),
    "info": (lambda v: isinstance(v, dict), "an object"),
}


def _check_types(msg: Any) -> None:
    """Every header field a peer could get wrong, checked once at the edge; a service
    then trusts the message's shape (not its intent)."""
    cls = type(msg)
    required = _FIELDS[cls][1]
    for name in _FIELDS[cls][0]:
        value = getattr(msg, name)
        if value is None and name not in required:
            continue
        check = _CHECKS.get(name)
        if check is not None and not check[0](value):
            raise ProtocolError(f"{name} must be {check[1]}, got {_short(value)}")
    if cls is Predict and not msg.request_id:
        raise ProtocolError("request_id must not be empty: it is how a reply finds its call")
    reply_to = getattr(msg, "reply_to", None)
    if cls is Queries and not isinstance(reply_to, str):
        raise ProtocolError("reply_to must be a string")
    if cls in (Batch, Predictions) and reply_to is not None and not _is_strs(reply_to):
        raise ProtocolError("reply_to must be a list of strings")
    qids = getattr(msg, "qids", None)
    for arr_name in cls.TENSORS:
        arr = getattr(msg, arr_name)
        if arr is not None and qids is not None and (arr.ndim == 0 or arr.shape[0] != len(qids)):
            rows = arr.shape[0] if arr.ndim else "no"
            raise ProtocolError(f"{arr_name} has {rows} rows for {len(qids)} query ids")
    if qids is not None:
        for name in ("reply_to", "budgets_ms"):
            value = getattr(msg, name, None)
            if isinstance(value, list) and len(value) != len(qids):
                raise ProtocolError(f"{name} has {len(value)} entries for {len(qids)} query ids")
        if cls is Batch and reply_to is None:
            raise ProtocolError("batch lacks reply_to")
    group, members = getattr(msg, "group", None), getattr(msg, "members", None)
    if members is not None and (group is None or len(members.batches) != group.k):
        raise ProtocolError("members need a coding group tag whose k is their number of batches")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def split_envelope(frames: list) -> tuple[list, list]:
    """(envelope, body) of a message read from a ROUTER: the identity frame, plus the empty
    delimiter a REQ peer adds (Keel's DEALER peers send none)."""
    if len(frames) > 1 and len(_frame_bytes(frames[1])) == 0:
        return frames[:2], frames[2:]
    return frames[:1], frames[1:]
