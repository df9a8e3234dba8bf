"""``device = "cuda"``: a worker places a store model on the GPU, or refuses clearly where
there is none (this suite passes without a GPU)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import orjson
import pytest
import torch

from keel.common.architectures import build
from keel.common.config import ConfigError
from keel.common.roles import from_dict
from keel.common.containers import DeviceError, TorchPredictor, check_device
from keel.common.modelstore import ModelStore

NO_GPU = not torch.cuda.is_available()


@pytest.fixture
def store(tmp_path):
    arch = {"in_features": 4, "n_classes": 2, "hidden": [3]}
    ModelStore(tmp_path).save("lin", build("mlp", **arch), arch="mlp", arch_config=arch, input_shape=[4], output_size=2)
    return str(tmp_path)


def test_device_option_is_checked():
    assert from_dict("worker", {"device": "cuda:1"}).device == "cuda:1"
    with pytest.raises(ConfigError, match='device must be "cpu", "cuda" or "cuda:N"'):
        from_dict("worker", {"device": "gpu"})


@pytest.mark.skipif(not NO_GPU, reason="this host has a GPU")
def test_cuda_is_refused_clearly_without_a_gpu(store):
    with pytest.raises(DeviceError, match='device = "cuda" but torch sees no GPU on this host'):
        TorchPredictor(store, "lin", None, device="cuda")
    assert check_device("cpu") == "cpu"


@pytest.mark.skipif(not NO_GPU, reason="this host has a GPU")
def test_a_worker_process_asked_for_cuda_exits_with_the_reason(store):
    config = {"name": "w", "model": "lin", "store": store, "device": "cuda", "dispatcher_worker_endpoint": "tcp://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-m", "keel.services.serve", "worker", "--config", orjson.dumps(config).decode()],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert 'device = "cuda" but torch sees no GPU' in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU, reason="needs a GPU")
def test_cuda_places_the_model_on_the_gpu(store):
    pred = TorchPredictor(store, "lin", None, device="cuda")
    assert next(pred.module.parameters()).is_cuda
    x = np.ones((3, 4), np.float32)
    cpu = TorchPredictor(store, "lin", None).predict_batch(x)
    np.testing.assert_allclose(pred.predict_batch(x), cpu, rtol=1e-4, atol=1e-5)
