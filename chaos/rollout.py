"""A model with versions for rollout experiments, and the store it lives in.

``Offset`` is a Python container (Clipper §3's ``predict_batch``): it answers the first
``OUTPUT_SIZE`` features of a query plus the offset its version's file holds, so a reply
says by its value alone which version computed it, and the chaos harness's offline check
can compare every answer with the version the reply names.

``prepare(out_dir)`` is an experiment's ``prepare`` hook: it adds two versions of
``offset`` (offsets 0 and 100) to a model store under ``out_dir`` through ``keel model
add``'s own path (each checked by one batch) and returns the cluster keys that point the
spec at that store.

Example
-------
>>> import numpy as np
>>> m = Offset(); m.offset = 100.0
>>> m.predict_batch(np.zeros((2, 64), np.float32))[:, 0]
array([100., 100.], dtype=float32)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

OUTPUT_SIZE = 10
INPUT_SIZE = 64  # the digits dataset the chaos workload sends
OFFSETS = {"1": 0.0, "2": 100.0}


class Offset:
    """Version v answers x[:10] + offset(v)."""

    offset = 0.0

    def load(self, path: str) -> None:
        self.offset = float(Path(path).read_text())

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        flat = np.asarray(inputs, np.float32).reshape(len(inputs), -1)
        return flat[:, :OUTPUT_SIZE] + np.float32(self.offset)


def prepare(out_dir: Path) -> dict:
    """A store with versions 1 and 2 of ``offset`` under ``out_dir``; the cluster keys to use it."""
    from keel.deploy.model_cli import add_model

    store = Path(out_dir) / "store"
    for version, offset in OFFSETS.items():
        source = Path(out_dir) / f"offset-v{version}.txt"
        source.write_text(repr(offset))
        manifest = add_model(str(store), "offset", str(source), python="keel.chaos.rollout:Offset",
                             input_shape=[INPUT_SIZE], output_size=OUTPUT_SIZE)
        if manifest.version != version:
            raise RuntimeError(f"{store} already held versions of offset: use a fresh output folder")
    return {"cluster": {"store": str(store)}}
