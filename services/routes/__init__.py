"""Routes: what the frontend sends a request to, chosen by its target, behind one interface.

A route per kind of target: a model (``routes.model``: cache, dispatcher,
reconstructions), an application (``routes.application``: model selection over the
models' queries, feedback) and a HAMS service graph (``services.graph.route``: origins of
this incarnation, the hold until durable). The frontend (``services.frontend``) keeps for
every one of them alike: decoding, validation (``common.inputs``), de-duplication,
admission, deadlines, cancellation and answering; it never asks what kind a target is.

The interface (``Route``):

- ``admit(request, msg, x, deadline, full)``: the computation the request waits on, a new
  one or one already in flight it joins (an identical model query); ``CACHED`` when it
  was answered at once (the prediction cache); ``FULL`` when a new computation is needed
  and the admission budget is spent (``full``).
- ``on_output(...)``: an output for one of its computations arrived (models and
  applications: a query's prediction, read by the frontend; a graph: its own inbox).
- ``expire(computation)``: its deadline passed (the frontend's deadline heap).
- ``cancel(computation, dkey)``: the requests of ``dkey`` that are cancelled (answered
  ``cancelled`` by the frontend), or None when they cannot be any more.
- ``close()``, ``status()``, ``describe()`` (``common.targets.describe``: the one
  description of a target, as ``Frontend.targets``, the gateways and ``keel status`` show it).

A computation (``Pending`` here, ``GraphCall`` for a graph) has ``qids`` (the frontend's
query ids it counts as in the admission budget and under which its deadline is kept),
``requests`` (the client requests waiting on it), ``deadline`` and ``route``.

The rules, the same for every target:

- Admission: one budget, ``admission_limit`` queries in flight, whatever their targets: a
  model request is one query, an application request one per model its policy selected,
  a graph request one. Answers from the cache and requests that join a computation in
  flight take nothing from it.
- Deadline: the call's ``timeout_ms``, or the target's own when it names none (a model's or
  an application's ``deadline_ms``, a graph's ``request_timeout_s``); an application's
  straggler budget (its ``deadline_ms``) bounds it too.
- At the deadline (``Route.deadline_answer``): what the target can answer by then (an
  application combines the outputs that arrived), else the target's default output
  (source ``default``), else an error with code ``deadline`` (source ``default``). A graph's
  output held for durability is never answered before it is durable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from keel.common import inputs, targets
from keel.common.protocol import ErrorCode, Source
from keel.common.signature import INPUT
from keel.services.requests import Request

#: what ``admit`` returns for a request answered at once (from the cache)
CACHED = object()
#: ... and for one that needed a new computation when the admission budget was spent
FULL = object()


@dataclass(slots=True)
class Pending:
    """One computation of model queries: the one a model request made, or an
    application's selection, shared by its retries and (a model's) by identical requests
    that arrived while it was in flight."""

    qids: tuple[int, ...]  # one per selected model
    models: tuple[str, ...]
    model: str  # the model (or application) the requests asked for
    version: str | None
    deadline: float  # monotonic
    key: bytes | None  # cache key
    requests: list[Request]
    route: Any  # the route that made it
    #: the query's input, kept (with a manager) to re-send it to a newly active dispatcher
    input: np.ndarray | None = None
    call: Any = None  # an application's call (model selection, ``selection.runtime.Call``)


class Route:
    """What every route has: its target's ``name`` and ``info`` (the input it takes, the
    output it answers, its own deadline), the frontend ``fe`` it answers through, and the
    deadline rule."""

    kind = ""
    #: whether a traced request's stamps ride on its queries (``Predict.trace``)
    traced = False
    name: str
    fe: Any
    #: what a call must look like (``common.config.ModelInfo``)
    info: Any
    dtype: np.dtype
    what: str  # "<kind> <name>": how refusals name the target
    #: the output answered at the deadline (source ``default``), or None
    default: np.ndarray | None = None
    #: a target that takes named tensors: its signature (``common.signature``), against which
    #: the frontend checks each request; None: one tensor, checked against ``info``
    signature: Any = None

    def named_of(self, named: dict) -> dict | np.ndarray:
        """A named target's inputs as sent: ``input`` (the one-input default name) stands for
        a signature's one client input of another name (a client sending text it knows no name for)."""
        if len(named) == 1 and INPUT in named and len(self.signature.client_inputs) == 1 \
                and self.signature.client_inputs[0].name != INPUT:
            return named[INPUT]
        return named

    def one_input(self, named: dict) -> np.ndarray:
        """The one tensor of a one-tensor target sent as named tensors (``Predict.inputs``)."""
        if len(named) != 1 or INPUT not in named:
            raise inputs.InputError(f"{self.what} takes one input, {INPUT!r}; got {', '.join(map(repr, named))}")
        return named[INPUT]

    def version(self) -> str | None:
        """The version served now (None: the target has no versions)."""
        return None

    def deadline_ms(self, asked: float | None) -> float:
        """A call's deadline (ms): the one it asked for, else the target's own."""
        return asked or self.info.deadline_ms

    def describe(self) -> dict:
        return targets.describe(self.kind, self.info, self.version())

    def deadline_answer(self, requests: list[Request], version: str | None = None) -> None:
        """The deadline rule (module docstring): the default output, else ``deadline``."""
        if self.default is not None:
            self.fe.answer(requests, Source.DEFAULT, self.name, version, self.default)
        else:
            self.fe.answer(requests, Source.DEFAULT, self.name, version, None,
                           f"deadline passed before {self.kind} {self.name} answered; it has no default output",
                           ErrorCode.DEADLINE)

    def close(self) -> None:
        """On shutdown (the frontend answers what is still in flight)."""

    def status(self) -> dict:
        return {}


class QueryRoute(Route):
    """A route whose computations are model queries sent to the dispatcher (``Pending``):
    cancelling one withdraws the queries no other request waits for."""

    def cancel(self, pending: Pending, dkey: tuple) -> list[Request]:
        """The requests of ``dkey`` leave ``pending``; with no other request left, so do its
        queries (``drop``). A shared computation runs on for the others."""
        mine = [r for r in pending.requests if r.dedup == dkey]
        pending.requests = [r for r in pending.requests if r.dedup != dkey]
        self.fe.by_request.pop(dkey, None)
        if not pending.requests:
            self.drop(pending)
        return mine

    def drop(self, pending: Pending) -> None:
        """No request waits for ``pending`` any more: its queries not yet sent leave the
        outbox, those sent are withdrawn (``Withdraw``, with the next flush)."""
        fe = self.fe
        for qid, model in zip(pending.qids, pending.models):
            if fe.pending.pop(qid, None) is None:
                continue  # answered already (one of an application's models)
            fe.traces.pop(qid, None)
            items = fe.outbox.get(model)
            at = next((i for i, item in enumerate(items) if item[0] == qid), None) if items else None
            if at is not None:
                del items[at]
            else:
                fe.withdrawn[model].append(qid)
