"""A worker serving on the GPU end to end: a store model placed with ``device = "cuda"``
answers real queries through the frontend and dispatcher with the outputs the CPU gives.
Runs where torch sees a GPU (skipped with the reason elsewhere)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from keel.common.architectures import build
from keel.common.client import Client
from keel.common.containers import TorchPredictor
from keel.common.modelstore import ModelStore
from keel.common.protocol import Source
from keel.common.spec import load_spec
from keel.deploy.local import free_port_block

pytestmark = [pytest.mark.slow, pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

DIM, OUT = 8, 4


def test_a_cuda_worker_answers_what_the_cpu_computes(tmp_path, launcher):
    torch.manual_seed(0)
    arch = {"in_features": DIM, "n_classes": OUT, "hidden": [16]}
    store = str(tmp_path / "store")
    ModelStore(store).save("mlp", build("mlp", **arch), arch="mlp", arch_config=arch, input_shape=[DIM], output_size=OUT)
    run = launcher("gpu")
    spec = load_spec({"cluster": {"name": "gpu", "store": store, "base_port": free_port_block(), "run_dir": str(run.log_dir)},
                      "frontend": {"cache_size": 0},
                      "models": {"mlp": {"workers": 1, "deadline_ms": 5000, "worker": {"device": "cuda"}}}})
    cluster = run.start_spec(spec)
    xs = np.random.default_rng(1).standard_normal((200, DIM)).astype(np.float32)
    want = TorchPredictor(store, "mlp", None).predict_batch(xs)  # the same weights on the CPU
    with Client(cluster.client_endpoints, timeout_ms=5000) as client:
        results = client.predict_batch("mlp", list(xs))
    assert [r.source for r in results] == [Source.MODEL] * len(xs)
    np.testing.assert_allclose(np.stack([r.output for r in results]), want, rtol=1e-4, atol=1e-4)
