"""``keel selection show APP [--context C]``: what an application's selection policy has
learned, per context: each model's weight (the draw probability for Exp3, the combining
weight for Exp4) and how many feedbacks it has seen.

Example
-------
::

    keel selection show digits --spec deploy/examples/selection.toml --context alice
    keel selection show digits --store runs/selection/frontend-selection.sqlite

The store is a frontend's context store (services/selection/contexts.py); with ``--spec``
and no ``--store``, the first frontend's (``selection_store``, by default in the run dir).
``--spec`` also names the models (the application's ``models`` list) — without it they
print as their index.
"""
from __future__ import annotations

import argparse
import time


def show(app: str, store_path: str, context: str | None = None, models: list[str] | None = None,
         now: float | None = None) -> list[str]:
    """The lines ``keel selection show`` prints."""
    from pathlib import Path

    from keel.services.selection.contexts import ContextStore
    from keel.services.selection.policies import State, probabilities

    if not Path(store_path).is_file():
        return [f"no context store at {store_path} (a frontend writes it when an application is first used)"]
    store = ContextStore(store_path)
    try:
        now = time.time() if now is None else now
        contexts = [context] if context is not None else store.contexts(app)
        lines = [f"application {app}: {len(contexts)} context(s)"]
        for c in contexts:
            data = store.get(app, c, now=now)
            if data is None:
                lines.append(f"  {c}: no state (never used, or expired): starts from equal weights")
                continue
            state = State.from_dict(data)
            names = models if models and len(models) == len(state.log_w) else [f"#{i}" for i in range(len(state.log_w))]
            weights = "  ".join(f"{n}={w:.3f}" for n, w in zip(names, probabilities(state.log_w)))
            lines.append(f"  {c}: {state.feedback} feedback(s)  {weights}")
        return lines
    finally:
        store.close()


def cmd_show(args: argparse.Namespace) -> int:
    models = None
    store = args.store
    if store is None and args.spec is None:
        print("give --store FILE, or --spec SPEC to read the frontend's store from it")
        return 2
    if store is None:
        from keel.common.spec import load_spec

        frontends = [s for s in load_spec(args.spec).role("frontend") if s.config.selection_store]
        if not frontends:
            print(f"{args.spec} has no applications: no frontend keeps a context store")
            return 2
        store = frontends[0].config.selection_store
    if args.spec:
        from keel.common.spec.applications import read_applications
        from keel.common.spec.tables import read_source

        apps = read_applications(read_source(args.spec).get("applications", {}))
        if args.app not in apps:
            print(f"no application {args.app!r} in {args.spec}; it has {sorted(apps)}")
            return 2
        models = list(apps[args.app].models)
    for line in show(args.app, store, args.context, models):
        print(line)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("selection", help="model selection (Clipper §5): what an application has learned")
    which = p.add_subparsers(dest="selection_cmd", required=True)
    s = which.add_parser("show", help="each context's model weights")
    s.add_argument("app")
    s.add_argument("--context", default=None, help="one context (default: all of the application's)")
    s.add_argument("--store", default=None, help="the frontend's context store (SQLite file; default: from --spec)")
    s.add_argument("--spec", default=None, help="cluster spec, to name the application's models")
    s.set_defaults(func=cmd_show)
