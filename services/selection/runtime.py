"""Model selection at the frontend (Clipper §5): what the frontend asks of an application's
policy for one call, and how it learns from that call's feedback.

Per call: the context's state (from the context store; created on first use) picks the
models to query (``select``); when every selected model has answered, or at the deadline
with those that have (§5.2.2: a missing model counts as disagreeing), the policy combines
the outputs into the answer (``combine``) and the call is remembered in the feedback log
(request id -> application, context, each model's output). ``feedback`` takes that entry
(once), scores each model's output against the true class (``observe``) and stores the
context's new state at once, so a frontend restart keeps what was learned.

An answer's source says how it was made: ``model`` (one model, e.g. Exp3's draw),
``ensemble`` (every selected model combined), ``partial`` (combined without the models
that had not answered: a straggler at the deadline or a failed batch) or
``low_confidence`` (the application's default output: its models disagreed, §5.2.1).

Metrics (``keel_selection_*``, labelled by application and model): model weights (in the
context that last learned), calls per chosen model, feedback and 0/1 loss per model,
confidence of answers, models missing from an answer, low-confidence defaults.

Example
-------
>>> from keel.common.config import FrontendConfig, ModelInfo
>>> from keel.common.metrics import Metrics
>>> cfg = FrontendConfig(models={m: ModelInfo([2], 2) for m in ("a", "b")},
...                      applications={"ab": {"models": ["a", "b"], "policy": "exp4", "params": {"eta": 0.3}}})
>>> apps = Applications(cfg, Metrics("frontend"))
>>> models, call = apps.select("ab", "alice")
>>> models
('a', 'b')
>>> str(apps.combine(call, {"a": np.array([0.9, 0.1], np.float32)}).source)  # b missing: combined without it
'partial'
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

import numpy as np
import structlog

from keel.common.config import FrontendConfig, ModelInfo
from keel.common.protocol import ErrorCode, Source
from keel.common.spec.applications import Application
from keel.services.selection.policies import policy_of
from keel.services.selection.contexts import ContextStore
from keel.services.selection.feedback import Entry, FeedbackLog
from keel.services.selection.policies import State, loss

log = structlog.get_logger("selection")

#: confidence histogram buckets: agreement is a share of at most a few models
CONFIDENCE_BUCKETS = (0.2, 0.34, 0.5, 0.6, 0.67, 0.75, 0.8, 0.9, 1.0)


@dataclass(slots=True)
class Call:
    """One application call in flight: the context, the state it selected with, the
    models it queried."""

    app: str
    context: str
    state: State
    models: tuple[str, ...]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # arrived so far, by model


@dataclass(frozen=True, slots=True)
class Answer:
    output: np.ndarray
    source: str
    models: list[str]  # the models whose outputs it used
    confidence: float


class Applications:
    """Every application of one frontend: their policies, the context store, the feedback log."""

    def __init__(self, cfg: FrontendConfig, metrics):
        self.apps = {name: Application.from_dict(name, data) for name, data in cfg.applications.items()}
        self.policies = {name: policy_of(app) for name, app in self.apps.items()}
        #: what a call of each application must look like: its first model's (they agree)
        self.infos: dict[str, ModelInfo] = {name: cfg.models[app.models[0]] for name, app in self.apps.items()}
        self.store = ContextStore(cfg.selection_store or ":memory:", cfg.context_ttl_s, cfg.context_cap)
        self.log = FeedbackLog(cfg.feedback_ttl_s, cfg.feedback_cap)
        self.m_weight = metrics.gauge("selection_weight", "a model's weight, in the context that last learned",
                                      ["app", "model"])
        self.m_chosen = metrics.counter("selection_chosen_total", "calls that queried a model", ["app", "model"])
        self.m_feedback = metrics.counter("selection_feedback_total", "feedbacks scored per model", ["app", "model"])
        self.m_loss = metrics.counter("selection_feedback_loss_total", "0/1 loss per model, summed over feedbacks",
                                      ["app", "model"])
        self.m_confidence = metrics.histogram("selection_confidence", "confidence of application answers", ["app"],
                                              buckets=CONFIDENCE_BUCKETS)
        self.m_missing = metrics.counter("selection_missing_total", "models missing from an answer (stragglers, "
                                         "failed batches)", ["app", "model"])
        self.m_low = metrics.counter("selection_low_confidence_total", "default outputs answered for low confidence",
                                     ["app"])
        self.m_unknown = metrics.counter("selection_feedback_refused_total", "feedbacks refused (unknown, expired, "
                                         "repeated request id, bad label)")
        self.m_store_errors = metrics.counter("selection_store_errors_total", "context store reads and writes that "
                                              "failed (the call went on without them)", ["op"])

    def __contains__(self, name: str) -> bool:
        return name in self.apps

    def state(self, app: str, context: str) -> State:
        """The context's state; a new one (stored) on first use or after its TTL."""
        now = time.time()
        try:
            data = self.store.get(app, context, now)
        except sqlite3.Error as e:
            self._store_failed("read", e)
            data = None
        if data is not None:
            return State.from_dict(data)
        state = self.policies[app].init()
        self._save(app, context, state, now)
        return state

    def _save(self, app: str, context: str, state: State, now: float) -> None:
        """Store a context's state. A store that fails (disk full, a locked or damaged file)
        must not leave a call unanswered: the call goes on with the state in hand, the
        failure is logged and counted, and that learning is not kept across a restart."""
        try:
            self.store.put(app, context, state.to_dict(), now)
        except sqlite3.Error as e:
            self._store_failed("write", e)

    def _store_failed(self, what: str, e: Exception) -> None:
        self.m_store_errors.labels(op=what).inc()
        log.warning("context store failed", op=what, error=str(e))

    def select(self, app: str, context: str, x: np.ndarray | None = None) -> tuple[tuple[str, ...], Call]:
        """The models a call of ``app`` in ``context`` queries."""
        state = self.state(app, context)
        models = self.policies[app].select(state, x)
        for m in models:
            self.m_chosen.labels(app=app, model=m).inc()
        return models, Call(app, context, state, tuple(models))

    def combine(self, call: Call, outputs: dict[str, np.ndarray]) -> Answer | None:
        """The answer from ``outputs`` (those of ``call.models`` that arrived); None if none did."""
        combined = self.policies[call.app].combine(call.state, None, outputs)
        if combined.output is None:
            return None
        missing = [m for m in call.models if m not in outputs]
        for m in missing:
            self.m_missing.labels(app=call.app, model=m).inc()
        self.m_confidence.labels(app=call.app).observe(combined.confidence)
        if combined.default:
            self.m_low.labels(app=call.app).inc()
            source = Source.LOW_CONFIDENCE
        elif missing:
            source = Source.PARTIAL
        else:
            source = Source.ENSEMBLE if len(call.models) > 1 else Source.MODEL
        return Answer(np.asarray(combined.output, np.float32), source, list(combined.answered), combined.confidence)

    def default_output(self, app: str) -> np.ndarray | None:
        """What a call answers when no model did by its deadline: the application's default
        output, else its first model's, else nothing (a ``deadline`` error)."""
        default = self.apps[app].params.get("default_output")
        if default is None:
            default = self.infos[app].default_output
        return None if default is None else np.asarray(default, np.float32)

    def remember(self, request_id: str, call: Call) -> None:
        """Keep an answered call's outputs for its feedback."""
        outputs = {m: np.asarray(v).tolist() for m, v in call.outputs.items()}
        self.log.put(request_id, Entry(call.app, call.context, outputs), time.monotonic())

    def feedback(self, request_id: str, label: int) -> tuple[str | None, str | None]:
        """Learn from the true class of an answered call: (error, error code), both None if
        it was learned from."""
        found = self.log.entries.get(request_id)
        if found is None or time.monotonic() - found[0] > self.log.ttl_s:
            self.m_unknown.inc()
            return (f"no answered application call {request_id[:64]!r} to learn from: unknown, feedback given "
                    f"already, or answered more than {self.log.ttl_s:g} s ago"), ErrorCode.UNKNOWN_REQUEST
        entry = found[1]
        size = self.infos[entry.app].output_size
        if not 0 <= label < size:
            self.m_unknown.inc()
            return f"label {label} is not a class of application {entry.app} (0..{size - 1})", ErrorCode.BAD_REQUEST
        self.log.take(request_id, time.monotonic())
        policy = self.policies[entry.app]
        outputs = {m: np.asarray(v, np.float32) for m, v in entry.predictions.items() if m in policy.index}
        state = policy.observe(self.state(entry.app, entry.context), None, label, outputs)
        self._save(entry.app, entry.context, state, time.time())
        for m, out in outputs.items():
            self.m_feedback.labels(app=entry.app, model=m).inc()
            self.m_loss.labels(app=entry.app, model=m).inc(loss(label, out))
        for m, w in policy.weights(state).items():
            self.m_weight.labels(app=entry.app, model=m).set(w)
        return None, None

    def close(self) -> None:
        self.store.close()
