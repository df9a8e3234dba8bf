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
left when the message was sent) with the sender's wall-clock time of sending
(``sent_at``, ``Queries`` and ``Batch``). A receiver's deadline is its monotonic now plus
the budget less the message's transit (``transit_s``: its wall clock minus ``sent_at``,
never below 0). A query's budget so counts from the frontend's admission, time in every
queue and socket buffer included: a dispatcher frozen with queries in its socket buffer
found them, at receipt, with their whole budget again, and computed queries the frontend
had answered by default. Why budget plus send time, not an absolute wall-clock deadline:
monotonic clocks of two processes are unrelated, so something must be on the wall clock;
with the budget beside it, a receiver whose clock lags the sender's gets at most the
budget (the transit is clamped at 0, never negative), while an absolute deadline would be
lengthened by the whole skew. Clock skew between hosts shortens or keeps a budget; hosts
keep their clocks in step (NTP) and the skew is the error of a query's deadline.

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

from keel.common.protocol.codec import (
    column_key, decode, decode_all, decode_header, decode_tensor, encode, encode_bundle, split_envelope,
)
from keel.common.protocol.fields import (
    ALLOWED_DTYPES, DTYPE_NAMES, MAX_BATCH, MAX_BUNDLE, MAX_COLUMN_BYTES, MAX_HEADER_BYTES, MAX_ID, MAX_K, MAX_NAME, MAX_PAYLOAD_BYTES,
    MAX_REQUEST_ID, MAX_SLOTS, MAX_THREADS, PROTOCOL_VERSION, CodingTag, ErrorCode, Kind, LineageEntry, MemberBatch,
    ModelRole, ParityMembers, ProtocolError, Source, request_key, transit_s,
)
from keel.common.protocol.messages import (
    _FIELDS, MESSAGES, Answered, Batch, Configure, Done, Heartbeat, Leave, Predict, Predictions, Queries, Register,
    Predicts, Replies, Reply, Status,
)

__all__ = [
    "ALLOWED_DTYPES", "DTYPE_NAMES", "MAX_BATCH", "MAX_BUNDLE", "MAX_COLUMN_BYTES", "MAX_HEADER_BYTES", "MAX_ID", "MAX_K", "MAX_NAME",
    "MAX_PAYLOAD_BYTES", "MAX_REQUEST_ID", "MAX_SLOTS", "MAX_THREADS", "MESSAGES", "PROTOCOL_VERSION", "Answered",
    "Batch", "CodingTag", "Configure", "Done", "ErrorCode", "Heartbeat", "Kind", "Leave", "LineageEntry",
    "MemberBatch", "ModelRole", "ParityMembers", "Predict", "Predictions", "Predicts", "ProtocolError", "Queries", "Register",
    "Replies", "Reply", "Source", "Status", "column_key", "decode", "decode_all", "decode_header", "decode_tensor", "encode", "encode_bundle", "request_key", "split_envelope",
    "transit_s",
]

# The manager's control plane (services.manager): appended, not merged above, to keep edits additive.
from keel.common.protocol.messages import Change, Control  # noqa: E402

__all__ += ["Change", "Control"]

# Model selection (Clipper §5): an application call's feedback.
from keel.common.protocol.messages import Feedback  # noqa: E402

__all__ += ["Feedback"]

# Cancellation: a client gives up on a request; the frontend withdraws its queries.
from keel.common.protocol.messages import Cancel, Withdraw  # noqa: E402

__all__ += ["Cancel", "Withdraw"]
