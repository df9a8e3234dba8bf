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

``load_spec`` reads the table (``read_applications``) and hands every frontend its
applications (``attach``): a client calls an application by its name where a model's would
go (``client.predict("digits-ensemble", x, context="alice")``), so an application may not be
named like a model, and its models must take the same input and give outputs of one size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from keel.common.spec.tables import NAME, Table, fail

POLICY_NAMES = ("exp3", "exp4", "robust", "default", "ab")


@dataclass(frozen=True)
class Application:
    name: str
    models: tuple[str, ...]
    policy: str
    params: dict[str, Any] = field(default_factory=dict)  # eta, gamma, split, threshold, default_output
    context: str = "context"
    deadline_ms: float | None = None

    def to_dict(self) -> dict:
        """As ``FrontendConfig.applications`` carries it (JSON)."""
        return {"models": list(self.models), "policy": self.policy, "params": dict(self.params),
                "context": self.context, "deadline_ms": self.deadline_ms}

    @classmethod
    def from_dict(cls, name: str, data: dict) -> Application:
        return cls(name, tuple(data["models"]), data["policy"], dict(data.get("params", {})),
                   data.get("context", "context"), data.get("deadline_ms"))


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
            split = params["split"]
            if len(split) != len(models) or any(s < 0 for s in split) or not math.isclose(sum(split), 1.0):
                fail(t.key("split"), f"must give each of the {len(models)} models a share >= 0, summing to 1, got {split}")
        context = t.take("context", str, "context")
        deadline = t.take("deadline_ms", float, None)
        if deadline is not None and not deadline > 0:
            fail(t.key("deadline_ms"), f"must be > 0, got {deadline}")
        t.finish()
        apps[name] = Application(name, tuple(models), policy, params, context, deadline)
    return apps


def attach(apps: dict[str, Application], services: list, run_dir: str) -> None:
    """Give every frontend of ``services`` the applications, after checking them against the
    models it serves; a frontend without a ``selection_store`` keeps its context states in
    ``run_dir/<frontend>-selection.sqlite``."""
    import os

    for svc in services:
        if svc.role != "frontend":
            continue
        infos = svc.config.models
        for app in apps.values():
            path = f"applications.{app.name}"
            if app.name in infos:
                fail(path, "is also a model's name; a client calls either by name, so they must differ")
            shapes = {(tuple(infos[m].input_shape), infos[m].input_dtype, infos[m].output_size) for m in app.models}
            if len(shapes) > 1:
                fail(f"{path}.models", "must take the same input (shape, dtype) and give outputs of one size: "
                     + ", ".join(f"{m}: {infos[m].input_dtype}{infos[m].input_shape} -> {infos[m].output_size}"
                                 for m in app.models))
            default = app.params.get("default_output")
            if default is not None and len(default) != infos[app.models[0]].output_size:
                fail(f"{path}.default_output", f"needs {infos[app.models[0]].output_size} values (the models' output size)")
        svc.config.applications = {name: app.to_dict() for name, app in apps.items()}
        if apps and not svc.config.selection_store:
            svc.config.selection_store = os.path.abspath(os.path.join(run_dir, f"{svc.name}-selection.sqlite"))
