"""Wire constants, error kinds and the papers' structures that travel as typed fields:
``CodingTag`` and ``ParityMembers`` (ParM §4.1), ``LineageEntry`` (HAMS Algorithm 1).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

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
MAX_BUNDLE = 64  # messages one ZeroMQ message carries back to back (a client's queries, its replies)
#: bytes of inputs one ``Predicts`` carries at most (a frontend reads a client's frames up to
#: this size even where its own ``max_payload_bytes`` is lower, and still bounds each row by it)
MAX_COLUMN_BYTES = 64 * 1024
MAX_ID = 2**63 - 1  # query, batch and group ids fit a signed 64-bit integer


class ProtocolError(ValueError):
    """A message that cannot be decoded or violates the wire format.

    Raised only at the edge where frames become messages, so that a service can answer
    the sender with an error reply and keep serving instead of dying on bad input.
    """


class Kind(StrEnum):
    PREDICT = "predict"  # client -> frontend
    PREDICTS = "predicts"  # client -> frontend: several queries of one model as columns
    REPLY = "reply"  # frontend -> client
    REPLIES = "replies"  # frontend -> client: several replies as columns (a client that reads bundles)
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
    CONTROL = "control"  # anyone -> manager replica (request) and replica -> asker (answer)
    CHANGE = "change"  # manager replica PUB -> subscribers: a key changed by an applied decision
    GRAPH_REQUEST = "graph_request"  # frontend / operator -> operator / frontend (HAMS service graphs)
    GRAPH_STATE = "graph_state"  # stateful primary -> its backup: the whole state after a batch
    GRAPH_ACK = "graph_ack"  # backup -> primary: a state arrived
    FEEDBACK = "feedback"  # client -> frontend (an application call's true class) and its answer
    GRAPH_DURABLE = "graph_durable"  # backup -> next stateful models, frontend, primary: state applied
    CANCEL = "cancel"  # client -> frontend: the caller gave up on a request
    WITHDRAW = "withdraw"  # frontend -> dispatcher -> worker: queries cancelled, not to be run


class Source(StrEnum):
    """Who produced the answer a client receives."""

    MODEL = "model"
    CACHE = "cache"
    DEFAULT = "default"  # Clipper's SLO default: the deadline passed first
    RECONSTRUCTION = "reconstruction"  # ParM: rebuilt from the parity output
    ENSEMBLE = "ensemble"  # Clipper §5.2: an application's models combined, all of them answered
    PARTIAL = "partial"  # Clipper §5.2.2: combined at the deadline from the models that answered by then
    LOW_CONFIDENCE = "low_confidence"  # Clipper §5.2.1: the application's default output, its models disagreed
    ERROR = "error"


class ModelRole(StrEnum):
    """What a worker serves (ParM): the deployed model, or a parity model for its coding groups."""

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
    CANCELLED = "cancelled"  # the client cancelled the request before it was answered
    UNKNOWN_REQUEST = "unknown_request"  # feedback for a request the frontend does not remember (late, unknown, repeated)


def transit_s(sent_at: float | None, now: float | None = None) -> float:
    """Seconds a message with ``sent_at`` (its sender's wall clock when it left) has been on
    its way by ``now`` (this host's wall clock; default: the time now): never negative, so
    a receiver whose clock lags the sender's cannot lengthen a budget; 0 without ``sent_at``."""
    if sent_at is None:
        return 0.0
    return max(0.0, (time.time() if now is None else now) - sent_at)


def _is_int(value: Any, lo: int = 0, hi: int = MAX_ID) -> bool:
    return type(value) is int and lo <= value <= hi


# List checks run on every batch's ids on the request path: set(map(type, ...)) and
# min/max run in C, several times faster than a generator over the items.
def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and (not value or (set(map(type, value)) == {int} and min(value) >= 0
                                                      and max(value) <= MAX_ID))


def _is_strs(value: Any) -> bool:
    return isinstance(value, list) and set(map(type, value)) <= {str}


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
    #: its sampled ``traced`` query and the encoder's span of it (``common.tracing``): the
    #: decoder's span of a reconstruction joins that trace; on the wire only when set
    traced: int | None = None
    traceparent: str | None = None

    def to_json(self) -> list:
        if self.traceparent is None:
            return [self.qids, self.reply_to]
        return [self.qids, self.reply_to, self.traced, self.traceparent]


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
            if not (isinstance(b, list) and len(b) in (2, 4) and _is_ids(b[0]) and _is_strs(b[1]) and len(b[0]) == len(b[1])):
                raise ProtocolError("members: each batch must be [qids, reply_to] of equal length, or null")
            if len(b) == 4 and not (_is_int(b[2]) and isinstance(b[3], str) and len(b[3]) <= 64):
                raise ProtocolError("members: a traced batch's [.., traced qid, traceparent]")
            out.append(MemberBatch(*b))
        if all(b is None for b in out):
            raise ProtocolError("members: a parity batch covers at least one query batch")
        return cls(model, encoder, out)


class LineageEntry(NamedTuple):
    """One step of a request's path through a service graph (HAMS Algorithm 1): the
    predecessor operator and the sequence number it gave the message, this operator and
    the sequence number it gives it. (A named tuple: an operator makes one per row of every
    batch, and a frozen dataclass costs 2.5x as much to build.)"""

    predecessor: str
    predecessor_seq: int
    operator: str
    seq: int

    def to_json(self) -> list:
        return list(self)

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


def request_key(client: str, request_id: str) -> str:
    """A client request's name end to end (de-duplication at the frontend, exactly-once
    effects in a graph's stateful operators): the client's id and its request id, with a
    separator neither contains in practice, prefixed by the id's length so none is ambiguous."""
    return f"{len(client)}:{client}/{request_id}"


def _frame_bytes(frame: Any) -> memoryview:
    """A byte view of a frame: a zmq.Frame (received with copy=False), bytes or a buffer."""
    view = memoryview(getattr(frame, "buffer", frame))
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
