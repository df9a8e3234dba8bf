"""Every message kind between Keel processes: one dataclass each, with its ``KIND`` and the
names of its tensor fields (``TENSORS``), which travel as frames after the header.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from keel.common.protocol.fields import CodingTag, Kind, LineageEntry, ParityMembers, ModelRole, Source

@dataclass(slots=True)
class Predict:
    """One query from a client. ``timeout_ms`` is the client's deadline, relative."""

    KIND: ClassVar[Kind] = Kind.PREDICT
    TENSORS: ClassVar[tuple[str, ...]] = ("input",)
    NAMED: ClassVar[str] = "inputs"
    request_id: str
    model: str
    #: the one input of a single-input model (the fast path: columns, bundles); None when
    #: ``inputs`` carries the query's named tensors
    input: np.ndarray | None = None
    timeout_ms: float | None = None
    version: str | None = None
    #: the one per-call key of every target: an application's selection context (Clipper
    #: §5.3: a user, a session), a stateful graph's stream (HAMS: whose state it keeps);
    #: refused for a plain model
    key: str | None = None
    #: the calling client's id, the same on every connection and frontend it uses: with
    #: ``request_id`` it names the request end to end (de-duplication, exactly-once effects)
    client: str | None = None
    #: a traced request's wall-clock stamps so far (``time.time()``, s): its client's send,
    #: then each process's receipt and send; set by a client that asks for a breakdown
    #: (``keel bench core --breakdown``), and only then stamped
    trace: list[float] | None = None
    #: the W3C trace context of a request its caller traces (OpenTelemetry, ``common.tracing``)
    traceparent: str | None = None
    #: the client reads several replies from one message (``protocol.decode_all``): the
    #: frontend may then send the replies of one batch of predictions to this connection
    #: together, one message and one wake-up for many
    bundle: bool | None = None
    #: the client reads replies as columns too (``Replies``): a bundle's replies that share
    #: their fields may then come as one header and one tensor (a client that does not say
    #: so, as one of an older Keel, gets each as a ``Reply``)
    columns: bool | None = None
    #: named inputs (``common.signature``), name -> one query's array (bytes: an object
    #: array of ``bytes``), frames after the header (``protocol.named``); never columns
    inputs: dict[str, np.ndarray] | None = None


@dataclass(slots=True)
class Predicts:
    """Several queries of one client to one model in one message, as columns: row ``i`` of
    ``inputs`` is the input of ``request_ids[i]``, ``timeouts_ms[i]`` its deadline. Keel's
    client sends a cork's queries so where they share the model and the input's dtype and
    shape and carry no key, version or trace (at most ``MAX_COLUMN_BYTES`` of inputs); the
    frontend admits each row as the ``Predict`` it stands for (``predicts``): its own
    checks, de-duplication and answer. One header and one tensor for many, as ``Replies``."""

    KIND: ClassVar[Kind] = Kind.PREDICTS
    TENSORS: ClassVar[tuple[str, ...]] = ("inputs",)
    request_ids: list[str]
    model: str
    inputs: np.ndarray
    timeouts_ms: list[float] | None = None
    client: str | None = None
    bundle: bool | None = None
    columns: bool | None = None

    @staticmethod
    def key(p: Predict) -> tuple | None:
        """What a query shares with those it may go with in one ``Predicts`` (model, client,
        flags, its input's dtype and shape); None for one a ``Predicts`` cannot carry (a key,
        a version, a trace, or no deadline)."""
        if p.key is not None or p.version is not None or p.trace is not None or p.timeout_ms is None \
                or p.traceparent is not None or p.input is None:
            return None
        return p.model, p.client, p.bundle, p.columns, p.input.dtype, p.input.shape

    @classmethod
    def of(cls, rows: list[Predict]) -> Predicts:
        """Queries that share model, client and flags as one message (``predicts`` undoes it)."""
        first = rows[0]
        return cls(request_ids=[p.request_id for p in rows], model=first.model, inputs=np.stack([p.input for p in rows]),
                   timeouts_ms=[p.timeout_ms for p in rows], client=first.client, bundle=first.bundle,
                   columns=first.columns)

    def predicts(self) -> list[Predict]:
        """Each row as the ``Predict`` it stands for."""
        model, inputs, client, bundle, columns = self.model, self.inputs, self.client, self.bundle, self.columns
        timeouts = self.timeouts_ms or [None] * len(self.request_ids)
        return [Predict(request_id=rid, model=model, input=inputs[i], timeout_ms=timeouts[i], client=client,
                        bundle=bundle, columns=columns) for i, rid in enumerate(self.request_ids)]


@dataclass(slots=True)
class Reply:
    """The one answer to a Predict. ``output`` is None for errors."""

    KIND: ClassVar[Kind] = Kind.REPLY
    TENSORS: ClassVar[tuple[str, ...]] = ("output",)
    NAMED: ClassVar[str] = "outputs"
    request_id: str
    source: str
    output: np.ndarray | None = None
    model: str | None = None
    version: str | None = None
    error: str | None = None
    error_code: str | None = None
    #: an application's call (Clipper §5): the models whose predictions the answer used,
    #: and its confidence (the share of the application's models that agree with it)
    models: list[str] | None = None
    confidence: float | None = None
    #: a HAMS graph's answer computed while a stateful operator on its lineage ran without
    #: a backup (after a failover, until a new backup caught up): still exactly once and
    #: consistent, but one more failure there could not be masked
    degraded: bool | None = None
    #: a traced request's stamps (``Predict.trace``), the frontend's send the last
    trace: list[float] | None = None
    #: a named model's outputs, name -> this request's array (``output`` is then None)
    outputs: dict[str, np.ndarray] | None = None


@dataclass(slots=True)
class Replies:
    """Several answers to one client in one message, as columns: row ``i`` of ``outputs``
    answers ``request_ids[i]``. The frontend sends a batch of predictions' answers so to a
    client that reads bundles (``Predict.bundle``) where they share source, model and
    version and carry nothing else (no error, application fields or trace); to the client
    each row is a ``Reply`` (``replies``). One header and one tensor for many: decoding a
    message costs the same whatever it carries, and a loaded client decodes one per batch."""

    KIND: ClassVar[Kind] = Kind.REPLIES
    TENSORS: ClassVar[tuple[str, ...]] = ("outputs",)
    request_ids: list[str]
    source: str
    outputs: np.ndarray
    model: str | None = None
    version: str | None = None

    @staticmethod
    def key(r: Reply) -> tuple | None:
        """What a reply shares with those it may go with in one ``Replies`` (source, model,
        version, its output's dtype and shape); None for one a ``Replies`` cannot carry (no
        output, an error, application fields, a degraded mark, a trace)."""
        out = r.output
        if out is None or r.error is not None or r.models is not None or r.confidence is not None \
                or r.degraded is not None or r.trace is not None or r.outputs is not None:
            return None
        return r.source, r.model, r.version, out.dtype, out.shape

    @classmethod
    def of(cls, rows: list[Reply]) -> Replies:
        """Replies that share source, model and version as one message (``replies`` undoes it)."""
        first = rows[0]
        return cls(request_ids=[r.request_id for r in rows], source=first.source, model=first.model,
                   version=first.version, outputs=np.stack([r.output for r in rows]))

    def replies(self) -> list[Reply]:
        """Each row as the ``Reply`` it stands for."""
        source, model, version, outputs = self.source, self.model, self.version, self.outputs
        return [Reply(request_id=rid, source=source, output=outputs[i], model=model, version=version)
                for i, rid in enumerate(self.request_ids)]


@dataclass(slots=True)
class Feedback:
    """The true class of an answered application call (Clipper §5), client -> frontend; the
    frontend answers with the same kind, ``ok`` set, and ``error``/``error_code`` if it
    could not learn from it (unknown, expired or repeated request id)."""

    KIND: ClassVar[Kind] = Kind.FEEDBACK
    TENSORS: ClassVar[tuple[str, ...]] = ()
    request_id: str
    label: int
    ok: bool | None = None
    error: str | None = None
    error_code: str | None = None


@dataclass(slots=True)
class Queries:
    """Queries a frontend hands to the dispatcher: ``inputs`` stacks them on axis 0, or
    (a named model's) ``rows`` holds each query's named tensors."""

    KIND: ClassVar[Kind] = Kind.QUERIES
    TENSORS: ClassVar[tuple[str, ...]] = ("inputs",)
    NAMED: ClassVar[str] = "rows"
    model: str
    qids: list[int]
    budgets_ms: list[float]  # per query: time left to its deadline when sent
    reply_to: str  # the frontend's prediction endpoint
    inputs: np.ndarray | None
    #: with a manager: the epoch of group "dispatcher" the frontend follows. A dispatcher
    #: that has seen an older one stops dispatching until the manager's decision reaches it
    fence: int | None = None
    #: the frontend's wall clock when it sent these (seconds): the receiver takes the time
    #: since off every budget (``transit_s``)
    sent_at: float | None = None
    #: the traced query among these (``traced``, its qid) and its stamps so far, as ``Predict.trace``
    traced: int | None = None
    trace: list[float] | None = None
    #: a sampled ``traced`` query's W3C trace context (its previous hop's span; ``common.tracing``)
    traceparent: str | None = None
    #: a named model's queries: one dict of named tensors a query (variable dims differ)
    rows: list[dict[str, np.ndarray]] | None = None


@dataclass(slots=True)
class Batch:
    """A query batch (or ParM parity batch) for one worker; one row of ``inputs`` a query,
    or (a named model's) one dict of ``rows`` a query, padded by the worker (``common.ragged``)."""

    KIND: ClassVar[Kind] = Kind.BATCH
    TENSORS: ClassVar[tuple[str, ...]] = ("inputs",)
    NAMED: ClassVar[str] = "rows"
    batch_id: int
    model: str
    qids: list[int]
    reply_to: list[str]  # per query: where its prediction goes
    inputs: np.ndarray | None
    role: str = ModelRole.DEPLOYED
    group: CodingTag | None = None
    #: per query: time left to its deadline when the batch was sent (None: no deadline)
    budgets_ms: list[float] | None = None
    members: ParityMembers | None = None  # parity batches only
    lineage: list[LineageEntry] | None = None
    #: with a manager: the sending dispatcher's epoch; a worker that knows a newer one
    #: refuses the batch (the sender was frozen or cut off and is stale)
    fence: int | None = None
    #: the dispatcher's wall clock when it sent the batch (seconds), as ``Queries.sent_at``
    sent_at: float | None = None
    #: the traced query among these (``traced``, its qid) and its stamps so far, as ``Predict.trace``
    traced: int | None = None
    trace: list[float] | None = None
    #: a sampled ``traced`` query's W3C trace context (its previous hop's span; ``common.tracing``)
    traceparent: str | None = None
    rows: list[dict[str, np.ndarray]] | None = None  # a named model's queries, as ``Queries.rows``


@dataclass(slots=True)
class Predictions:
    """Outputs of one batch, from a worker (or a reconstruction, from the decoder): one row
    of ``outputs`` a query, or (a named model's) one dict of ``rows`` a query, cut back to
    its own lengths."""

    KIND: ClassVar[Kind] = Kind.PREDICTIONS
    TENSORS: ClassVar[tuple[str, ...]] = ("outputs",)
    NAMED: ClassVar[str] = "rows"
    batch_id: int
    model: str
    qids: list[int]
    outputs: np.ndarray | None
    worker: str = ""
    role: str = ModelRole.DEPLOYED
    source: str = Source.MODEL
    group: CodingTag | None = None
    service_ms: float = 0.0
    error: str | None = None
    reply_to: list[str] | None = None  # copies to the decoder: where each query's answer goes
    budgets_ms: list[float] | None = None  # copies to the decoder: as in the Batch
    members: ParityMembers | None = None  # parity outputs: copied from the parity Batch
    lineage: list[LineageEntry] | None = None
    version: str | None = None  # the model version that computed these outputs (rollouts)
    #: the traced query among these (``traced``, its qid) and its stamps so far, as ``Predict.trace``
    traced: int | None = None
    trace: list[float] | None = None
    #: a sampled ``traced`` query's W3C trace context (its previous hop's span; ``common.tracing``)
    traceparent: str | None = None
    rows: list[dict[str, np.ndarray]] | None = None  # a named model's outputs, a dict a query


@dataclass(slots=True)
class Register:
    """A worker announces itself to the dispatcher: its slots (credits), its largest batch,
    and what schedulers need to know of it (Kairos: instance kind and price; SERF: torch
    threads)."""

    KIND: ClassVar[Kind] = Kind.REGISTER
    TENSORS: ClassVar[tuple[str, ...]] = ()
    worker: str
    model: str
    role: str = ModelRole.DEPLOYED
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
    #: the largest batch the worker's device memory holds, when an out-of-memory error
    #: lowered it below what it registered with: the dispatcher caps its batches there
    max_batch: int | None = None


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
    #: roll the worker to this model version (an operator, on the worker's status endpoint);
    #: to a frontend, with ``model``: that model's workers now serve this version
    version: str | None = None
    model: str | None = None


@dataclass(slots=True)
class Answered:
    """Queries of ``model`` the frontend answered other than by their own prediction (a
    reconstruction): the dispatcher need not run them again if their worker dies."""

    KIND: ClassVar[Kind] = Kind.ANSWERED
    TENSORS: ClassVar[tuple[str, ...]] = ()
    model: str
    qids: list[int]


@dataclass(slots=True)
class Cancel:
    """A client gave up on its request ``request_id`` (its ``client`` id as in the ``Predict``;
    none: the connection it came on). The frontend answers the request once, as cancelled,
    if it is still in flight, and drops what it holds for it; a request already answered
    keeps its answer (a retry gets it). No reply of its own."""

    KIND: ClassVar[Kind] = Kind.CANCEL
    TENSORS: ClassVar[tuple[str, ...]] = ()
    request_id: str
    client: str | None = None


@dataclass(slots=True)
class Withdraw:
    """Queries of ``model`` whose requests were cancelled: the dispatcher drops those it has
    not dispatched, and tells the worker holding any of the others to skip them."""

    KIND: ClassVar[Kind] = Kind.WITHDRAW
    TENSORS: ClassVar[tuple[str, ...]] = ()
    model: str
    qids: list[int]


@dataclass(slots=True)
class Control:
    """A request to a manager replica (``result`` None) or its answer (``result`` a
    JSON-able dict): ``op`` names what is asked (services.manager.service lists them)."""

    KIND: ClassVar[Kind] = Kind.CONTROL
    TENSORS: ClassVar[tuple[str, ...]] = ()
    op: str
    args: dict | None = None
    result: dict | None = None


@dataclass(slots=True)
class Change:
    """A manager replica publishes what the change numbered ``seq`` changed: ``values`` maps
    each key (``service/NAME``, ``group/NAME``, ``desired``) to its value after it (zguide's
    Clone pattern: a gap in ``seq`` means ask for a snapshot)."""

    KIND: ClassVar[Kind] = Kind.CHANGE
    TENSORS: ClassVar[tuple[str, ...]] = ()
    seq: int
    values: dict


# the HAMS graph's own kinds live beside (re-exported here, listed in MESSAGES below)
from keel.common.protocol.graph import GraphAck, GraphDurable, GraphRequest, GraphState  # noqa: E402


MESSAGES: dict[str, type] = {
    cls.KIND: cls
    for cls in (Predict, Predicts, Reply, Replies, Feedback, Queries, Batch, Predictions, Register, Done, Heartbeat, Status, Leave, Configure, Answered,
                Cancel, Withdraw, Control, Change, GraphRequest, GraphState, GraphAck, GraphDurable)
}

#: per class that carries named tensors (``protocol.named``): the field that holds them
NAMED_OF: dict[type, str] = {cls: cls.NAMED for cls in MESSAGES.values() if getattr(cls, "NAMED", None)}

# Per class: (header field names, required header field names). Computed once.
_FIELDS: dict[type, tuple[tuple[str, ...], frozenset[str]]] = {}
for _cls in MESSAGES.values():
    _names = tuple(f.name for f in dataclasses.fields(_cls) if f.name not in _cls.TENSORS and f.name != NAMED_OF.get(_cls))
    _required = frozenset(
        f.name
        for f in dataclasses.fields(_cls)
        if f.name not in _cls.TENSORS and f.name != NAMED_OF.get(_cls)
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    _FIELDS[_cls] = (_names, _required)

# Per class: header fields that may be null (typed "... | None"); any other null is refused.
_NULLABLE: dict[type, frozenset[str]] = {
    _cls: frozenset(f.name for f in dataclasses.fields(_cls)
                    if f.name not in _cls.TENSORS and f.name != NAMED_OF.get(_cls) and "None" in str(f.type))
    for _cls in MESSAGES.values()
}

# Per class: tensor fields that may not be absent (those not typed "... | None").
_REQUIRED_TENSORS: dict[type, frozenset[str]] = {
    _cls: frozenset(f.name for f in dataclasses.fields(_cls) if f.name in _cls.TENSORS and "None" not in str(f.type))
    for _cls in MESSAGES.values()
}
