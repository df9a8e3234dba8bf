"""The HAMS service-graph messages (HAMS Algorithms 1 and 2): requests between operators with
their lineage, a stateful primary's state shipped to its backup, the backup's ack, and
durability notices. ``messages`` lists them among every kind (``MESSAGES``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from keel.common.protocol.fields import Kind, LineageEntry


@dataclass(slots=True)
class GraphRequest:
    """One request on an edge of a service graph (HAMS): ``seq`` is the number ``sender``
    gave it; ``origin`` the frontend's seq (a join matches its inputs by it); ``lineage``
    the Algorithm 1 entries so far; ``stream`` the request's stream (per-stream state)."""

    KIND: ClassVar[Kind] = Kind.GRAPH_REQUEST
    TENSORS: ClassVar[tuple[str, ...]] = ("input",)
    sender: str
    seq: int
    origin: int
    stream: int
    lineage: list[LineageEntry]
    input: np.ndarray
    error: str | None = None
    #: computed by (or from an input computed by) a primary running degraded (no backup)
    degraded: bool | None = None
    #: the client request this input belongs to, named end to end (``request_key(client,
    #: request id)``): a stateful operator applies each request at most once
    request: str | None = None
    #: the frontend's graph endpoint that the graph's output for this origin goes back to
    #: (a graph may be served by several frontends)
    reply_to: str | None = None
    #: more rows of the sender's batch follow this one: a receiver takes a predecessor's
    #: batch whole (a fragment taken alone leaves the rest a whole batch time behind)
    more: bool | None = None
    #: a sampled request's W3C trace context (its previous hop's span; ``common.tracing``)
    traceparent: str | None = None


@dataclass(slots=True)
class GraphState:
    """The whole state of a stateful operator after the batch ``first_seq..last_seq``, to its
    backup: every request's lineage entries (Algorithm 2 reads them), and ``blob``, an
    ``np.savez`` of the state tensors and the batch's outputs (loaded without pickle)."""

    KIND: ClassVar[Kind] = Kind.GRAPH_STATE
    TENSORS: ClassVar[tuple[str, ...]] = ("blob",)
    operator: str
    epoch: int
    first_seq: int
    last_seq: int
    lineage: list[LineageEntry]
    blob: np.ndarray


@dataclass(slots=True)
class GraphAck:
    """A backup received the state ending at ``seq`` (NSPB's window counts these)."""

    KIND: ClassVar[Kind] = Kind.GRAPH_ACK
    TENSORS: ClassVar[tuple[str, ...]] = ()
    operator: str
    epoch: int
    seq: int


@dataclass(slots=True)
class GraphDurable:
    """Algorithm 2's notify: ``operator``'s state up to ``seq`` is durable (applied on its backup)."""

    KIND: ClassVar[Kind] = Kind.GRAPH_DURABLE
    TENSORS: ClassVar[tuple[str, ...]] = ()
    operator: str
    epoch: int
    seq: int
