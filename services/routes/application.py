"""The application route: model selection (Clipper §5) over the models' queries.

Admission asks the application's policy which models to query in the call's context
(``services.selection.runtime``: the key is the context) and sends one query to each; the
call is answered once every selected model answered or failed, combined by the policy
(the reply names the models used and the confidence), and remembered for its feedback.
At the deadline it is answered with what arrived (stragglers count as disagreeing, the
source says ``partial``), by the deadline rule when nothing did (``routes``). An
application has no cache (its answer depends on its learned state) and no versions.
"""
from __future__ import annotations

import numpy as np

from keel.common.protocol import ErrorCode, Predict, Predictions, Source
from keel.services.requests import Request
from keel.services.routes import FULL, Pending, QueryRoute


class ApplicationRoute(QueryRoute):
    kind = "application"

    def __init__(self, name: str, apps, fe):
        self.name, self.apps, self.fe = name, apps, fe
        self.info = apps.infos[name]
        self.dtype = np.dtype(self.info.input_dtype)
        self.what = f"{self.kind} {name}"  # how refusals name it
        self.default = apps.default_output(name)
        #: the straggler budget (§5.2.2): answer with what arrived by then
        self.budget = apps.apps[name].deadline_ms

    def deadline_ms(self, asked: float | None) -> float:
        if self.budget is None:
            return asked or self.info.deadline_ms
        return min(asked, self.budget) if asked else self.budget

    def admit(self, request: Request, msg: Predict, x: np.ndarray, deadline: float, full: bool):
        if full:
            return FULL
        fe = self.fe
        models, call = self.apps.select(self.name, msg.key or "", x)
        qids = tuple(fe.ids.next() for _ in models)
        pending = Pending(qids, models, self.name, None, deadline, None, [request], self, call=call)
        if fe.manager is not None:
            pending.input = x
        for qid, model in zip(qids, models):
            fe.outbox[model].append((qid, deadline, x))
        return pending

    def on_output(self, pending: Pending, qid: int, model: str, output: np.ndarray | None, why: str | None,
                  source: str, msg: Predictions) -> None:
        """One selected model's output (None: its batch failed): the call is answered once
        every selected model has answered or failed."""
        fe = self.fe
        if output is not None:
            pending.call.outputs[model] = output
            if source == Source.RECONSTRUCTION:
                fe.reconstructed_by[model].append(qid)
        if not any(q in fe.pending for q in pending.qids):
            fe.settle(pending)
            self._answer(pending, expired=False)

    def expire(self, pending: Pending) -> None:
        self.fe.settle(pending)
        self._answer(pending, expired=True)

    def _answer(self, pending: Pending, expired: bool) -> None:
        """Combine what arrived; with nothing, the deadline rule at the deadline, else (every
        model failed) the default output or a model error."""
        call, fe = pending.call, self.fe
        answer = self.apps.combine(call, call.outputs)
        if answer is None:
            if expired:
                self.deadline_answer(pending.requests)
            elif self.default is not None:
                fe.answer(pending.requests, Source.DEFAULT, self.name, None, self.default)
            else:
                fe.answer(pending.requests, Source.ERROR, self.name, None, None,
                          f"every model application {self.name} queried failed: {', '.join(call.models)}",
                          ErrorCode.MODEL_ERROR)
            return
        fe.answer(pending.requests, answer.source, self.name, None, answer.output, models=answer.models,
                  confidence=answer.confidence)
        for rid in {r.request_id for r in pending.requests}:
            self.apps.remember(rid, call)
