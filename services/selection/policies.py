"""Model selection policies (Clipper §5, Listing 2).

A policy is stateless; its state is a ``State`` made by ``init`` and passed to every call,
so one policy object serves any number of contexts (§5.3). The four calls:

- ``init() -> State``
- ``select(state, x) -> tuple[str, ...]``: the models to query for input ``x``
- ``combine(state, x, predictions) -> Combined``: the answer from the predictions that
  arrived (model -> output vector), with a confidence in [0, 1]; a model missing from
  ``predictions`` (a straggler at the deadline, §5.2.2) counts as disagreeing
- ``observe(state, x, y, predictions) -> State``: learn from feedback ``y`` (the true
  class) given what each queried model predicted

Outputs are score vectors over classes; a model's prediction is its argmax, and the loss
of a prediction is 0/1 (wrong class), which is in [0, 1] as §5.1 asks.

Exp3 (§5.1). Weights live in log space (``log_w``); model i is drawn with
``p_i = (1 - gamma) * w_i / sum(w) + gamma / k`` (the paper gives no exploration term; without
one a model whose weight collapsed is never tried again and cannot recover as Fig. 8 shows,
NOTES.md). After feedback only the drawn model's weight changes:
``log_w_i -= eta * loss / p_i`` (importance-weighted, Auer et al.). ``eta`` is how fast it
reacts (default 0.2: on Fig. 8's scenario 0.1 left the degraded model 14% of the
next 300 draws, 0.2 left it 8%); ``gamma`` the share of draws spread evenly (default 0.05).

Exp4 (§5.2). Every model is queried; the answer is the weight-averaged score vector (a
missing model's weight is left out, which is the paper's "substitute the average"); the
confidence is the fraction of all k models whose prediction agrees with the answer. Every
model's loss is observed, so every weight is updated Hedge-style: ``log_w_i -= eta * loss_i``
(the paper does not give Exp4's update; NOTES.md). ``eta`` default 0.3.

Both keep every log weight within ``spread`` (default 5) of the largest: a model that was
bad for a long while is then at most e^5 ~ 150x behind, so it wins again within a few
hundred feedbacks once it is good (Fig. 8's recovery). Without the bound, Exp3's
importance-weighted losses (loss / p with p ~ gamma / k) and Exp4's thousands of losses
push a degraded model so far down that it never comes back; the bound is the log-space
form of Exp3.S's weight sharing (Auer et al. 2002, for a best arm that changes).

Robust (§5.2.1): Exp4 whose answer is the application's default output, marked, when the
confidence is below ``threshold``.

Example
-------
>>> import numpy as np

from keel.common.spec.applications import Application
from keel.common.spec.tables import SpecError
>>> policy = Exp4(["a", "b", "c"])
>>> state = policy.init()
>>> out = policy.combine(state, None, {"a": np.array([0.9, 0.1]), "b": np.array([0.8, 0.2])})
>>> int(np.argmax(out.output)), round(out.confidence, 3), out.missing
(0, 0.667, ('c',))
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from keel.common.spec.applications import Application
from keel.common.spec.tables import SpecError


@dataclass
class State:
    """What a policy learned for one context: a log-weight per model, in the policy's
    model order, and how much feedback it has seen."""

    log_w: list[float]
    feedback: int = 0

    def to_dict(self) -> dict:
        return {"log_w": [float(v) for v in self.log_w], "feedback": self.feedback}

    @classmethod
    def from_dict(cls, data: dict) -> State:
        return cls([float(v) for v in data["log_w"]], int(data.get("feedback", 0)))


@dataclass(frozen=True)
class Combined:
    """A request's answer: the output vector, the confidence, the models that answered and
    those that did not (stragglers), and whether it is the default output (low confidence)."""

    output: np.ndarray | None
    confidence: float
    answered: tuple[str, ...]
    missing: tuple[str, ...] = ()
    default: bool = False


class Policy(Protocol):
    models: tuple[str, ...]

    def init(self) -> State: ...

    def select(self, state: State, x: np.ndarray | None) -> tuple[str, ...]: ...

    def combine(self, state: State, x: np.ndarray | None, predictions: dict[str, np.ndarray]) -> Combined: ...

    def observe(self, state: State, x: np.ndarray | None, y: int, predictions: dict[str, np.ndarray]) -> State: ...


def loss(y: int, output: np.ndarray) -> float:
    """0/1 loss of a score vector against the true class."""
    return float(int(np.argmax(output)) != int(y))


def probabilities(log_w: list[float] | np.ndarray) -> np.ndarray:
    """Normalised weights from log weights (max subtracted: no overflow, no underflow to 0/0)."""
    lw = np.asarray(log_w, np.float64)
    w = np.exp(lw - lw.max())
    return w / w.sum()


class _Weighted:
    """What the weighted policies share: models in a fixed order, a fresh state, the
    bounded update of log weights."""

    def __init__(self, models: list[str] | tuple[str, ...], eta: float, spread: float = 5.0):
        if not models:
            raise ValueError("a policy needs at least one model")
        if len(set(models)) != len(models):
            raise ValueError(f"models must be distinct: {list(models)}")
        if not eta > 0:
            raise ValueError(f"eta must be > 0, got {eta}")
        if not spread > 0:
            raise ValueError(f"spread must be > 0, got {spread}")
        self.models, self.eta, self.spread = tuple(models), float(eta), float(spread)
        self.index = {m: i for i, m in enumerate(self.models)}

    def _updated(self, state: State, losses: dict[int, float]) -> State:
        """``state`` with ``log_w[i] -= losses[i]``, shifted so the largest is 0 and none
        below ``-spread``."""
        log_w = list(state.log_w)
        for i, amount in losses.items():
            log_w[i] -= amount
        top = max(log_w)
        return State([max(v - top, -self.spread) for v in log_w], state.feedback + 1)

    def init(self) -> State:
        return State([0.0] * len(self.models))

    def weights(self, state: State) -> dict[str, float]:
        return dict(zip(self.models, probabilities(state.log_w).tolist()))


class Exp3(_Weighted):
    """Single model selection (§5.1): one model per request, drawn by weight."""

    def __init__(self, models, eta: float = 0.2, gamma: float = 0.05, spread: float = 5.0, seed: int | None = None):
        super().__init__(models, eta, spread)
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.gamma = float(gamma)
        self.rng = np.random.default_rng(seed)

    def draw_probabilities(self, state: State) -> np.ndarray:
        k = len(self.models)
        return (1.0 - self.gamma) * probabilities(state.log_w) + self.gamma / k

    def select(self, state: State, x=None) -> tuple[str, ...]:
        return (self.models[int(self.rng.choice(len(self.models), p=self.draw_probabilities(state)))],)

    def combine(self, state: State, x, predictions: dict[str, np.ndarray]) -> Combined:
        answered = tuple(m for m in self.models if m in predictions)
        if not answered:
            return Combined(None, 0.0, (), self.models)
        chosen = answered[0]
        return Combined(np.asarray(predictions[chosen]), 1.0, (chosen,))

    def observe(self, state: State, x, y: int, predictions: dict[str, np.ndarray]) -> State:
        p = self.draw_probabilities(state)
        return self._updated(state, {self.index[m]: self.eta * loss(y, out) / p[self.index[m]]
                                     for m, out in predictions.items()})  # the one drawn model


class Exp4(_Weighted):
    """Ensemble selection (§5.2): every model queried, outputs averaged by weight."""

    def __init__(self, models, eta: float = 0.3, spread: float = 5.0):
        super().__init__(models, eta, spread)

    def select(self, state: State, x=None) -> tuple[str, ...]:
        return self.models

    def combine(self, state: State, x, predictions: dict[str, np.ndarray]) -> Combined:
        answered = tuple(m for m in self.models if m in predictions)
        missing = tuple(m for m in self.models if m not in predictions)
        if not answered:
            return Combined(None, 0.0, (), missing)
        p = probabilities([state.log_w[self.index[m]] for m in answered])
        output = sum(w * np.asarray(predictions[m], np.float64) for w, m in zip(p, answered))
        top = int(np.argmax(output))
        agree = sum(int(np.argmax(predictions[m])) == top for m in answered)
        return Combined(np.asarray(output, np.float32), agree / len(self.models), answered, missing)

    def observe(self, state: State, x, y: int, predictions: dict[str, np.ndarray]) -> State:
        return self._updated(state, {self.index[m]: self.eta * loss(y, out) for m, out in predictions.items()})


class Robust(Exp4):
    """Exp4 that answers ``default_output`` (marked) when its confidence is below
    ``threshold`` (§5.2.1)."""

    def __init__(self, models, default_output, threshold: float = 0.6, eta: float = 0.3, spread: float = 5.0):
        super().__init__(models, eta, spread)
        if not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        self.default_output = np.asarray(default_output, np.float32)
        self.threshold = float(threshold)

    def combine(self, state: State, x, predictions: dict[str, np.ndarray]) -> Combined:
        out = super().combine(state, x, predictions)
        if out.confidence < self.threshold:
            return Combined(self.default_output, out.confidence, out.answered, out.missing, default=True)
        return out


class Default(_Weighted):
    """One model, always (a plain deployment, as an application)."""

    def __init__(self, models):
        super().__init__(models[:1], 1.0)

    def select(self, state: State, x=None) -> tuple[str, ...]:
        return self.models

    def combine(self, state: State, x, predictions: dict[str, np.ndarray]) -> Combined:
        model = self.models[0]
        if model not in predictions:
            return Combined(None, 0.0, (), (model,))
        return Combined(np.asarray(predictions[model]), 1.0, (model,))

    def observe(self, state: State, x, y: int, predictions: dict[str, np.ndarray]) -> State:
        return State(list(state.log_w), state.feedback + 1)


class ABSplit(Default):
    """A fixed split (an A/B test): model i gets share ``split[i]`` of the requests, drawn
    at random; feedback changes nothing."""

    def __init__(self, models, split: list[float], seed: int | None = None):
        _Weighted.__init__(self, models, 1.0)
        if len(split) != len(self.models) or any(s < 0 for s in split) or not math.isclose(sum(split), 1.0):
            raise ValueError(f"split must give each of {len(self.models)} models a share >= 0, summing to 1: {split}")
        self.split = np.asarray(split, np.float64)
        self.rng = np.random.default_rng(seed)

    def select(self, state: State, x=None) -> tuple[str, ...]:
        return (self.models[int(self.rng.choice(len(self.models), p=self.split))],)

    def combine(self, state: State, x, predictions: dict[str, np.ndarray]) -> Combined:
        answered = tuple(m for m in self.models if m in predictions)
        if not answered:
            return Combined(None, 0.0, (), self.models)
        return Combined(np.asarray(predictions[answered[0]]), 1.0, answered[:1])


POLICIES = {"exp3": Exp3, "exp4": Exp4, "robust": Robust, "default": Default, "ab": ABSplit}


def policy_of(app: Application, seed: int | None = None):
    """The selection policy object of ``app``, as its spec table names it."""
    p, models = app.params, list(app.models)
    try:
        if app.policy == "exp3":
            return Exp3(models, eta=p["eta"], gamma=p["gamma"], seed=seed)
        if app.policy == "exp4":
            return Exp4(models, eta=p["eta"])
        if app.policy == "robust":
            return Robust(models, p["default_output"], threshold=p["threshold"], eta=p["eta"])
        if app.policy == "ab":
            return ABSplit(models, p["split"], seed=seed)
        return Default(models)
    except ValueError as e:
        raise SpecError(f"applications.{app.name}: {e}") from None
