"""The experiment's replay: one state per context learns each group's own best model,
where one global state cannot."""
from __future__ import annotations

import numpy as np

from keel.bench.selection_experiment import _replay
from keel.services.selection.policies import Exp4


def test_replay_per_context_beats_a_global_state_when_groups_differ():
    rng = np.random.default_rng(0)
    n, k = 2_000, 4
    groups = rng.integers(0, k, n)
    y = rng.integers(0, 10, n)
    outputs = np.zeros((n, k, 10), np.float32)
    for t in range(n):
        for j in range(k):  # model j is right for group j only
            outputs[t, j, y[t] if j == groups[t] else (y[t] + 1 + j) % 10] = 1.0
    names = [f"m{j}" for j in range(k)]
    per_ctx, _, _ = _replay(Exp4(names), outputs, y, groups=groups)
    glob, _, _ = _replay(Exp4(names), outputs, y)
    later = slice(400, None)
    assert (per_ctx[later] != y[later]).mean() < 0.05
    assert (glob[later] != y[later]).mean() > 0.3
