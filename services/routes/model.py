"""The model route: a request for one model is one query to the dispatcher (Clipper §4).

Admission looks the query up in the CLOCK prediction cache (keyed by model, the version
served and the input) and attaches it to an identical query already in flight (one
computation, many waiters); else it is one new query in the frontend's outbox, sent with
the others of this tick in one ``Queries``. The first of {prediction, reconstruction}
answers (a reconstruction is reported ``Answered`` to the dispatcher and kept to grade the
late prediction); a model's answer is cached under the key it was admitted with. This is
the path every plain request takes: per request it does what it must and no more.
"""
from __future__ import annotations

import time

import numpy as np

from keel.common import tracing
from keel.common.protocol import ErrorCode, Predict, Predictions, Source
from keel.common.protocol.named import fingerprint
from keel.common.signature import Signature
from keel.services.requests import Request, State
from keel.services.routes import CACHED, FULL, Pending, QueryRoute

#: reconstructed outputs kept to grade against their late predictions, at most
GRADED = 50_000


class ModelRoute(QueryRoute):
    kind = "model"
    traced = True

    def __init__(self, name: str, info, fe):
        self.name, self.info, self.fe = name, info, fe
        self.dtype = np.dtype(info.input_dtype)
        self.what = f"{self.kind} {name}"  # how refusals name it
        self.default = None if info.default_output is None else np.asarray(info.default_output, np.float32)
        if info.signature is not None:  # named tensors in and out (``common.signature``)
            self.signature = Signature.from_dict(info.signature)
        self.models = (name,)
        self.bname = name.encode()
        self.outbox = fe.outbox[name]  # the frontend's list of this model's queries, sent each tick
        #: cache key -> the computation in flight for it (identical requests share it)
        self.shared: dict[bytes, Pending] = {}

    def version(self) -> str:
        """The version its workers serve: the spec's until they (or a rollout) say another."""
        return self.fe.serving.get(self.name, self.info.version)

    def admit(self, request: Request, msg: Predict, x: np.ndarray, deadline: float, full: bool):
        fe = self.fe
        version = fe.serving.get(self.name, self.info.version)
        key = None
        if fe.cache is not None:
            # every input in the key: a named model's all (``named.fingerprint``)
            key = b"%s\0%s\0%s" % (self.bname, version.encode(), x.tobytes() if self.signature is None else fingerprint(x))
            output = fe.cache.get(key)
            if output is not None:
                fe.answer([request], Source.CACHE, self.name, version, output)
                return CACHED
            shared = self.shared.get(key)
            if shared is not None:  # the same query is in flight: share its computation
                request.to(State.WAITING)
                shared.requests.append(request)
                return shared
        if full:
            return FULL
        qid = fe.ids.next()
        pending = Pending((qid,), self.models, self.name, version, deadline, key, [request], self)
        if fe.manager is not None:
            pending.input = x
        self.outbox.append((qid, deadline, x))
        if key is not None:
            self.shared[key] = pending
        return pending

    def on_output(self, pending: Pending, qid: int, model: str, output: np.ndarray | None, why: str | None,
                  source: str, msg: Predictions) -> None:
        """The query's prediction or reconstruction (``output``), or why it failed (``why``)."""
        fe = self.fe
        self.settle(pending)
        if why is not None:
            fe.answer(pending.requests, Source.ERROR, self.name, pending.version, None, f"model {model} {why}",
                      ErrorCode.MODEL_ERROR)
            return
        if source == Source.RECONSTRUCTION:
            fe.reconstructed_by[model].append(qid)
            fe.reconstructed[qid] = output
            if len(fe.reconstructed) > GRADED:
                del fe.reconstructed[next(iter(fe.reconstructed))]
        version = pending.version if msg.version is None else msg.version
        # the key names the version expected at admission: another version's output is not cached under it
        if source == Source.MODEL and fe.cache is not None and pending.key is not None and version == pending.version:
            fe.cache.put(pending.key, output)
        trace = [*msg.trace, time.time()] if msg.trace is not None and msg.traced == qid else None
        if tracing.ON:  # a sampled request's span ends with its answer, a reconstruction's too
            tracing.answered(fe.name, qid, source, version)
        fe.answer(pending.requests, source, self.name, version, output, trace=trace, later=True,
                  bundle=len(msg.qids) > 1)

    def expire(self, pending: Pending) -> None:
        """Clipper's SLO behaviour: the model's default output, else ``deadline``."""
        self.settle(pending)
        self.deadline_answer(pending.requests, pending.version)

    def settle(self, pending: Pending) -> None:
        """Decided: forget how requests found it (its one query is out of ``pending`` already)."""
        by_request = self.fe.by_request
        for request in pending.requests:
            by_request.pop(request.dedup, None)
        if pending.key is not None:
            self.shared.pop(pending.key, None)

    def drop(self, pending: Pending) -> None:
        if pending.key is not None:
            self.shared.pop(pending.key, None)
        super().drop(pending)

    def status(self) -> dict:
        return {"shared": len(self.shared)}
