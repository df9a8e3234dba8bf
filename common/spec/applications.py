"""The spec's ``[applications]`` tables (Clipper §5): an application names several models,
a selection policy and its parameters, a default output, a confidence threshold and what
identifies a context. ``policy_of`` builds the policy object the frontend uses.

    [applications.digits-ensemble]
    models = ["mlp-a", "mlp-b", "lenet"]
    policy = "robust"             # exp3 | exp4 | robust | default | ab
    default_output = [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    threshold = 0.6               # robust: below this confidence, answer default_output
    context = "user"              # what the client's context argument names
    eta = 0.3                     # exp3/exp4/robust: learning rate
    # gamma = 0.05                # exp3: exploration share
    # split = [0.9, 0.1]          # ab: each model's share
    # deadline_ms = 20            # stragglers: answer with what arrived by then

Not read by ``load_spec`` yet (issue 13: the frontend wiring is not done); ``read_applications``
takes the ``applications`` table of a spec's data and the names of its models.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common.spec.tables import NAME, SpecError, Table, fail

POLICY_NAMES = ("exp3", "exp4", "robust", "default", "ab")


@dataclass(frozen=True)
class Application:
    name: str
    models: tuple[str, ...]
    policy: str
    params: dict[str, Any] = field(default_factory=dict)  # eta, gamma, split, threshold, default_output
    context: str = "context"
    deadline_ms: float | None = None


def read_applications(data: Any, known_models: list[str] | None = None) -> dict[str, Application]:
    apps: dict[str, Application] = {}
    for name, raw in Table(data, "applications").data.items():
        path = f"applications.{name}"
        if not NAME.match(name):
            fail(path, "an application's name is letters, digits, '_', '.', '-'")
        t = Table(raw, path)
        models = t.take("models", list[str])
        if not models or len(set(models)) != len(models):
            fail(t.key("models"), f"must name one or more distinct models, got {models!r}")
        for m in models:
            if known_models is not None and m not in known_models:
                fail(t.key("models"), f"unknown model {m!r}; the spec's models: {sorted(known_models)}")
        policy = t.take("policy", str, "exp4" if len(models) > 1 else "default")
        if policy not in POLICY_NAMES:
            fail(t.key("policy"), f"must be one of {list(POLICY_NAMES)}, got {policy!r}")
        params: dict[str, Any] = {}
        if policy in ("exp3", "exp4", "robust"):
            params["eta"] = t.take("eta", float, 0.2 if policy == "exp3" else 0.3)
            if not params["eta"] > 0:
                fail(t.key("eta"), f"must be > 0, got {params['eta']}")
        if policy == "exp3":
            params["gamma"] = t.take("gamma", float, 0.05)
            if not 0 < params["gamma"] <= 1:
                fail(t.key("gamma"), f"must be in (0, 1], got {params['gamma']}")
        if policy == "robust":
            params["threshold"] = t.take("threshold", float, 0.6)
            if not 0 <= params["threshold"] <= 1:
                fail(t.key("threshold"), f"must be in [0, 1], got {params['threshold']}")
            params["default_output"] = t.take("default_output", list[float])
        if policy == "ab":
            params["split"] = t.take("split", list[float])
            if len(params["split"]) != len(models):
                fail(t.key("split"), f"must give a share to each of the {len(models)} models")
        context = t.take("context", str, "context")
        deadline = t.take("deadline_ms", float, None)
        if deadline is not None and not deadline > 0:
            fail(t.key("deadline_ms"), f"must be > 0, got {deadline}")
        t.finish()
        apps[name] = Application(name, tuple(models), policy, params, context, deadline)
    return apps


def policy_of(app: Application, seed: int | None = None):
    """The selection policy object of ``app`` (services/selection/policies.py)."""
    from services.selection import policies

    p, models = app.params, list(app.models)
    try:
        if app.policy == "exp3":
            return policies.Exp3(models, eta=p["eta"], gamma=p["gamma"], seed=seed)
        if app.policy == "exp4":
            return policies.Exp4(models, eta=p["eta"])
        if app.policy == "robust":
            return policies.Robust(models, p["default_output"], threshold=p["threshold"], eta=p["eta"])
        if app.policy == "ab":
            return policies.ABSplit(models, p["split"], seed=seed)
        return policies.Default(models)
    except ValueError as e:
        raise SpecError(f"applications.{app.name}: {e}") from None
