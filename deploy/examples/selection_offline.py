"""Model selection offline (Clipper §5): an Exp4 ensemble over three models learns from
feedback, one state per user kept in a SQLite context store that survives reopening.

Run: ``PYTHONPATH=. python deploy/examples/selection_offline.py``
The same through a live cluster, with ``client.predict(app, x, key=...)`` and
``client.feedback``: deploy/examples/selection_client.py.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from keel.common.spec.applications import read_applications
from keel.services.selection.policies import policy_of
from keel.services.selection.contexts import ContextStore
from keel.services.selection.policies import State

apps = read_applications({"ens": {"models": ["good", "so-so", "bad"], "policy": "robust", "threshold": 0.6,
                                  "default_output": [0.5, 0.5], "context": "user"}})
policy = policy_of(apps["ens"])
rng = np.random.default_rng(0)
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "selection.sqlite"
    store = ContextStore(path)
    for t in range(200):
        y = int(rng.integers(0, 2))
        preds = {m: np.eye(2, dtype=np.float32)[y if rng.random() < acc else 1 - y]
                 for m, acc in (("good", 0.95), ("so-so", 0.75), ("bad", 0.4))}
        state = State.from_dict(store.get("ens", "alice", now=t) or policy.init().to_dict())
        out = policy.combine(state, None, preds)
        store.put("ens", "alice", policy.observe(state, None, y, preds).to_dict(), now=t)
    store.close()
    store = ContextStore(path)  # as after a frontend restart
    learned = State.from_dict(store.get("ens", "alice", now=200))
    print("alice's weights after 200 feedbacks:",
          {m: round(w, 3) for m, w in policy.weights(learned).items()})
    print("last answer:", out.output, "confidence", round(out.confidence, 2), "default" if out.default else "")
    store.close()
