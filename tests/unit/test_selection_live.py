"""The live experiment's model container: the model's probabilities, and the scrambled
class only where the query's flag asks for it and only in the degradable model."""
from __future__ import annotations

import numpy as np

from keel.bench.selection_live import ScoreContainer, queries, save_model
from keel.bench.selection_models import scores, train


def test_the_container_answers_the_models_probabilities_and_scrambles_only_on_the_flag(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.random((60, 8, 8)), rng.integers(0, 10, 60)
    model = train("mlp", 8, None, 0, x, y)
    flags = np.array([0, 0, 4, 0], np.float32)  # query 2: scrambled to class 3
    rows = queries(x[:4], flags)
    for degradable in (False, True):
        save_model(model, tmp_path / "m.npz", degradable)
        c = ScoreContainer()
        c.load(str(tmp_path / "m.npz"))
        out = c.predict_batch(rows)
        expected = scores(model, x[:4])
        if degradable:
            expected[2] = np.eye(10)[3]
        np.testing.assert_allclose(out, expected, atol=1e-5)
