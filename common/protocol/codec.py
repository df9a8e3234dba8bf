"""Frames <-> messages: ``encode``, ``decode`` and the checks every header field passes at the
edge, so a service trusts the shape of what it handles (not its intent).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from keel.common.protocol.fields import (
    _DTYPES, ALLOWED_DTYPES, DTYPE_NAMES, MAX_BATCH, MAX_BUNDLE, MAX_COLUMN_BYTES, MAX_HEADER_BYTES, MAX_ID, MAX_K, MAX_NAME,
    MAX_PAYLOAD_BYTES, MAX_REQUEST_ID, MAX_SLOTS, MAX_THREADS, PROTOCOL_VERSION, CodingTag, LineageEntry, ParityMembers, ProtocolError,
    ModelRole, _frame_bytes, _is_ids, _is_int, _is_strs,
)
from keel.common.protocol.messages import (
    _FIELDS, _NULLABLE, _REQUIRED_TENSORS, MESSAGES, NAMED_OF, Batch, Cancel, Feedback, GraphAck, GraphDurable, GraphRequest,
    Predict, Predictions, Predicts, Queries, Replies, Reply,
)
from keel.common.protocol.named import decode_named, encode_named

#: stamps a traced message carries at most (a request's path has ten)
MAX_TRACE = 16
_INT = {int}


def encode(msg: Any) -> list:
    """Frames for ``msg``: the orjson header, then one buffer per tensor (zero-copy)."""
    cls = type(msg)
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": cls.KIND}
    for name in _PLAIN_OF[cls]:
        value = getattr(msg, name)
        if value is not None:
            header[name] = value
    for name in _TYPED_OF[cls]:
        value = getattr(msg, name)
        if value is not None:
            header[name] = [e.to_json() for e in value] if name == "lineage" else value.to_json()
    frames: list = [b""]
    if cls.TENSORS:
        descs = []
        for name in cls.TENSORS:
            arr = getattr(msg, name)
            if arr is None:
                descs.append(None)
                continue
            if type(arr) is not np.ndarray:
                arr = np.asarray(arr)
            dtype = DTYPE_NAMES.get(arr.dtype)
            if dtype is None:
                raise ProtocolError(f"dtype {arr.dtype} cannot go on the wire; allowed: {sorted(ALLOWED_DTYPES)}")
            buf = arr.data  # (its c_contiguous: arr.flags builds a flags object, dear in a process woken cold)
            if not buf.c_contiguous:
                arr = np.ascontiguousarray(arr)  # not on every array: it turns a 0-d tensor into shape (1,)
                buf = arr.data
            descs.append({"dtype": dtype, "shape": list(arr.shape)})
            frames.append(buf if arr.nbytes else b"")
        header["tensors"] = descs
    named = _NAMED_FIELD.get(cls)
    if named is not None:
        value = getattr(msg, named)
        if value is not None and (value or cls in _ONE_ROW):  # after the tensors' frames (``protocol.named``; no rows: none)
            header["named"], more = encode_named([value] if cls in _ONE_ROW else value)
            frames += more
    frames[0] = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    return frames


def column_key(msg: Any) -> tuple | None:
    """What ``msg`` shares with the messages it may go with as columns (``encode_bundle``):
    ``Predicts.key`` of a ``Predict``, ``Replies.key`` of a ``Reply``; None for any other."""
    column = _COLUMNS.get(type(msg))
    return None if column is None else column[0].key(msg)


def encode_bundle(items: list[tuple[Any, list | None, Any]], max_column_bytes: int) -> list:
    """The frames of several messages sent as one ZeroMQ message (a bundle: ``decode_all``).
    Each item is (message, its frames if already encoded, its column key: ``column_key``, or
    None where the peer reads no columns). Predicts or Replies with the same key go as one
    message in columns (``Predicts``, ``Replies``: one header and one tensor, a row each), at
    most ``max_column_bytes`` of tensor a message; the rest, and a column of one, as their
    own frames."""
    frames, columns = [], {}
    for msg, own, key in items:
        if key is None:
            frames += own if own is not None else encode(msg)
        else:
            columns.setdefault((type(msg), key), []).append((msg, own))
    for (cls, _), rows in columns.items():
        column, row_bytes = _COLUMNS[cls]
        per = max(1, max_column_bytes // max(1, row_bytes(rows[0][0])))
        for at in range(0, len(rows), per):
            part = rows[at:at + per]
            if len(part) == 1:
                frames += part[0][1] if part[0][1] is not None else encode(part[0][0])
            else:
                frames += encode(column.of([msg for msg, _ in part]))
    return frames


def decode_header(frame: Any) -> dict:
    raw = getattr(frame, "buffer", frame)  # a received frame's bytes in place (orjson reads a view)
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
    # (set/min in C: a generator over the dimensions cost as much as the rest of this check)
    if not isinstance(shape, list) or len(shape) > 8 or (shape and (set(map(type, shape)) != _INT or min(shape) < 0)):
        raise ProtocolError(f"shape must be a list of at most 8 non-negative ints, got {shape!r}")
    dt = _DTYPES[dtype]
    expected = math.prod(shape) * dt.itemsize
    if expected > max_bytes:
        raise ProtocolError(f"payload of {expected} bytes exceeds the limit of {max_bytes}")
    buf = _frame_bytes(frame)
    if len(buf) != expected:
        raise ProtocolError(f"tensor frame has {len(buf)} bytes, dtype {dtype} shape {shape} needs {expected}")
    # the array straight on the frame's buffer: frombuffer + reshape made two arrays and
    # cost twice as much in a process woken cold (as each is, one request at a time)
    return np.ndarray(shape, dt, buf)


def decode(frames: list, max_payload: int = MAX_PAYLOAD_BYTES) -> Any:
    """The message in ``frames`` (no routing envelope). Raises ProtocolError if malformed."""
    if not frames:
        raise ProtocolError("empty message")
    msg, end = _decode_at(frames, 0, max_payload)
    if end != len(frames):
        if type(msg).TENSORS:
            raise ProtocolError(f"{msg.KIND} has {len(frames) - 1} tensor frames, header describes {end - 1}")
        raise ProtocolError(f"{msg.KIND} carries no tensors but has {len(frames) - 1} extra frames")
    return msg


def decode_all(frames: list, max_payload: int = MAX_PAYLOAD_BYTES) -> list:
    """The messages in ``frames``: one, or up to ``MAX_BUNDLE`` back to back (a bundle: each
    message's header, then its tensor frames; a client's queries sent together, ``Client.cork``,
    and a client's replies where it asked for them so, ``Predict.bundle``). ``max_payload``
    bounds each message's tensors. One malformed message refuses the whole bundle."""
    if not frames:
        raise ProtocolError("empty message")
    out, at = [], 0
    while at < len(frames):
        if len(out) == MAX_BUNDLE:
            raise ProtocolError(f"a bundle carries at most {MAX_BUNDLE} messages")
        msg, at = _decode_at(frames, at, max_payload)
        out.append(msg)
    return out


def _decode_at(frames: list, at: int, max_payload: int) -> tuple[Any, int]:
    """(the message whose header is ``frames[at]``, the index just past its tensor frames)."""
    header = decode_header(frames[at])
    kind = header.get("kind")
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None  # a list or object kind is unhashable
    if cls is None:
        raise ProtocolError(f"unknown message kind {header.get('kind')!r}")
    missing = _FIELDS[cls][1] - header.keys()  # the required fields
    if missing:
        raise ProtocolError(f"{cls.KIND} message lacks {sorted(missing)}")
    # Each header field checked as it is taken (one pass; a field absent keeps its default):
    # in a process woken cold, a second pass over the built message cost as much again.
    kwargs = {}
    for name, check, nullable in _PLANS[cls]:
        if name not in header:
            continue
        value = header[name]
        if value is None:
            if not nullable:
                raise ProtocolError(f"{name} may not be null")
        elif check is not None and not check[0](value):
            raise ProtocolError(f"{name} must be {check[1]}, got {_short(value)}")
        kwargs[name] = value
    for name in _TYPED_OF[cls]:
        if kwargs.get(name) is not None:
            kwargs[name] = _TYPED[name](kwargs[name])
    end = at + 1
    if cls.TENSORS:
        descs = header.get("tensors")
        if not isinstance(descs, list) or len(descs) != len(cls.TENSORS):
            raise ProtocolError(f"{cls.KIND} needs {len(cls.TENSORS)} tensor descriptor(s)")
        end += len(descs) - descs.count(None)
        if end > len(frames):
            raise ProtocolError(f"{cls.KIND} has {len(frames) - at - 1} tensor frames, header describes {end - at - 1}")
        total, i = 0, at + 1
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
    named = header.get("named")
    if named is not None and cls in _NAMED_FIELD:
        if not isinstance(named, list):
            raise ProtocolError("named must be a list of tensor descriptors")
        if end + len(named) > len(frames):
            raise ProtocolError(f"{cls.KIND} has {len(frames) - at - 1} frames, its header describes {end + len(named) - at - 1}")
        one = cls in _ONE_ROW
        qids = kwargs.get("qids")
        rows = decode_named(named, frames[end:end + len(named)], 1 if one else len(qids) if isinstance(qids, list) else None,
                            max_payload - total)
        kwargs[_NAMED_FIELD[cls]] = rows[0] if one else rows
        end += len(named)
    try:
        msg = cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(str(exc)) from None
    _check_message(msg)
    return msg, end


#: per kind that carries named tensors: its field (``protocol.named``); those whose field is one dict, not rows
_NAMED_FIELD = NAMED_OF
_ONE_ROW = frozenset({Predict, Reply})

#: per kind that may go in columns: its columns' kind and a row's tensor bytes
_COLUMNS = {Predict: (Predicts, lambda m: m.input.nbytes), Reply: (Replies, lambda m: m.output.nbytes)}

# Fields that travel as JSON but are typed on both sides of the wire (and, per kind, which it has).
_TYPED = {"group": CodingTag.from_json, "members": ParityMembers.from_json, "lineage": LineageEntry.list_from_json}
_TYPED_OF = {cls: tuple(name for name in _TYPED if name in _FIELDS[cls][0]) for cls in MESSAGES.values()}
#: per kind, its header fields that travel as they are (in the dataclass's order)
_PLAIN_OF = {cls: tuple(name for name in _FIELDS[cls][0] if name not in _TYPED) for cls in MESSAGES.values()}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _budgets(value: Any) -> bool:
    return isinstance(value, list) and set(map(type, value)) <= {int, float} and all(map(math.isfinite, value))


def _str_max(n: int, empty: bool = True):
    return lambda v: isinstance(v, str) and len(v) <= n and (empty or bool(v))


# Per field: (check, what a valid value is). Fields every message kind shares a meaning of.
_CHECKS: dict[str, tuple[Any, str]] = {
    "request_id": (_str_max(MAX_REQUEST_ID), f"a string of at most {MAX_REQUEST_ID} characters"),
    "request_ids": (lambda v: _is_strs(v) and 0 < len(v) <= MAX_BUNDLE and all(0 < len(r) <= MAX_REQUEST_ID for r in v),
                    f"a list of 1..{MAX_BUNDLE} non-empty strings of at most {MAX_REQUEST_ID} characters"),
    "model": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "worker": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "sender": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "service": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "source": (lambda v: isinstance(v, str), "a string"),
    "role": (lambda v: v in (ModelRole.DEPLOYED, ModelRole.PARITY), "deployed or parity"),
    "instance": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "version": (_str_max(MAX_NAME), "a string"),
    "error": (lambda v: isinstance(v, str), "a string"),
    "error_code": (lambda v: isinstance(v, str), "a string"),
    "degraded": (lambda v: isinstance(v, bool), "true or false"),
    "more": (lambda v: isinstance(v, bool), "true or false"),
    "bundle": (lambda v: isinstance(v, bool), "true or false"),
    "columns": (lambda v: isinstance(v, bool), "true or false"),
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
    "timeouts_ms": (lambda v: _budgets(v) and min(v, default=0) >= 0, "a list of finite numbers >= 0"),
    "ok": (lambda v: isinstance(v, bool), "true or false"),
    "known": (lambda v: isinstance(v, bool), "true or false"),
    "info": (lambda v: isinstance(v, dict), "an object"),
    "op": (_str_max(MAX_NAME, empty=False), f"a non-empty string of at most {MAX_NAME} characters"),
    "args": (lambda v: isinstance(v, dict), "an object"),
    "result": (lambda v: isinstance(v, dict), "an object"),
    "seq": (_is_int, f"an integer in 0..{MAX_ID}"),
    "fence": (_is_int, f"an integer in 0..{MAX_ID}"),
    "sent_at": (lambda v: _finite(v) and v >= 0, "a finite number >= 0 (seconds since the epoch)"),
    "traced": (_is_int, f"an integer in 0..{MAX_ID}"),
    "trace": (lambda v: _budgets(v) and len(v) <= MAX_TRACE, f"a list of at most {MAX_TRACE} finite numbers"),
    "traceparent": (lambda v: isinstance(v, str) and len(v) == 55, "a W3C traceparent (00-TRACE-SPAN-FLAGS)"),
    "values": (lambda v: isinstance(v, dict), "an object"),
    # model selection (Clipper §5)
    "key": (_str_max(MAX_NAME), f"a string of at most {MAX_NAME} characters"),
    "client": (_str_max(MAX_NAME, empty=False), f"a non-empty string of at most {MAX_NAME} characters"),
    "label": (lambda v: _is_int(v, 0, MAX_BATCH), f"a class index in 0..{MAX_BATCH}"),
    "confidence": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "models": (lambda v: _is_strs(v) and len(v) <= MAX_K and all(len(m) <= MAX_NAME for m in v),
               f"a list of at most {MAX_K} model names"),
}


# HAMS service graphs (GraphRequest, GraphState, GraphAck, GraphDurable).
_CHECKS.update({
    "operator": (_str_max(MAX_NAME, empty=False), f"a non-empty string of at most {MAX_NAME} characters"),
    "origin": (_is_int, f"an integer in 0..{MAX_ID}"),
    "request": (_str_max(2 * MAX_NAME + MAX_REQUEST_ID + 1), "a string (request_key(client, request id))"),
    "stream": (_is_int, f"an integer in 0..{MAX_ID}"),
    "epoch": (_is_int, f"an integer in 0..{MAX_ID}"),
    "first_seq": (_is_int, f"an integer in 0..{MAX_ID}"),
    "last_seq": (_is_int, f"an integer in 0..{MAX_ID}"),
})

# Per class, once: (field, its check or None, whether it may be null). A field the header
# lacks keeps its dataclass default, which passes (tests/unit/test_protocol.py checks that).
_PLANS = {cls: tuple((name, _CHECKS.get(name), name in _NULLABLE[cls]) for name in _FIELDS[cls][0]) for cls in MESSAGES.values()}
# a takeover's "highest seq held" may be none yet (-1: the backup applied no state)
_SEQ_OR_NONE = (lambda v: _is_int(v, -1, MAX_ID), f"an integer in -1..{MAX_ID} (-1: none yet)")
for _cls in (GraphAck, GraphDurable):
    _PLANS[_cls] = tuple((name, _SEQ_OR_NONE if name == "seq" else check, nullable) for name, check, nullable in _PLANS[_cls])


def _check_message(msg: Any) -> None:
    """What a peer could get wrong across fields (each field alone is checked as ``decode``
    takes it, ``_PLANS``), checked once at the edge; a service then trusts the message's
    shape (not its intent)."""
    cls = type(msg)
    if cls in (Predict, Feedback, Cancel) and not msg.request_id:
        raise ProtocolError("request_id must not be empty: it is how a reply finds its call")
    if cls is Predict and (msg.input is None) == (msg.inputs is None):
        raise ProtocolError("predict carries its input (one tensor) or its inputs (named tensors), one of the two")
    if cls in (Queries, Batch) and (msg.inputs is None) == (msg.rows is None):
        raise ProtocolError(f"{cls.KIND} carries inputs (one tensor) or rows (named tensors), one of the two")
    if cls is Predictions and msg.outputs is not None and msg.rows is not None:
        raise ProtocolError("predictions carry outputs (one tensor) or rows (named tensors), not both")
    reply_to = getattr(msg, "reply_to", None)
    if cls is GraphRequest and reply_to is not None and not isinstance(reply_to, str):
        raise ProtocolError("reply_to must be a string")
    if cls is Queries and not isinstance(reply_to, str):
        raise ProtocolError("reply_to must be a string")
    if cls in (Batch, Predictions) and reply_to is not None and not _is_strs(reply_to):
        raise ProtocolError("reply_to must be a list of strings")
    # a row of every tensor and an entry of every per-row list for each id: query ids, or
    # the request ids of a message in columns (Predicts, Replies)
    qids = getattr(msg, "qids", None)
    ids, what = (qids, "query ids") if qids is not None else (getattr(msg, "request_ids", None), "request ids")
    if ids is not None:
        for arr_name in cls.TENSORS:
            arr = getattr(msg, arr_name)
            if arr is not None and (arr.ndim == 0 or arr.shape[0] != len(ids)):
                rows = arr.shape[0] if arr.ndim else "no"
                raise ProtocolError(f"{arr_name} has {rows} rows for {len(ids)} {what}")
        for name in ("reply_to", "budgets_ms", "timeouts_ms"):
            value = getattr(msg, name, None)
            if isinstance(value, list) and len(value) != len(ids):
                raise ProtocolError(f"{name} has {len(value)} entries for {len(ids)} {what}")
    if cls is Batch and reply_to is None:
        raise ProtocolError("batch lacks reply_to")
    if cls is Predicts and msg.inputs.nbytes > MAX_COLUMN_BYTES:
        raise ProtocolError(f"predicts carries {msg.inputs.nbytes} bytes of inputs, over {MAX_COLUMN_BYTES}")
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
