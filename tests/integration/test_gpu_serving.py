"""On a GPU (``pytest -m gpu``; skipped with the reason elsewhere): a model's workers
placed over every GPU present, each warmed up before it registers, its batches through
pinned buffers and a stream per slot, answering what the CPU computes; and a real CUDA
out-of-memory error (a model that allocates past its memory fraction) split and retried,
with the lowered ceiling reported and a query that alone does not fit answered with a
clear error while the worker serves on."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import zmq

from keel.common import protocol, transport
from keel.common.architectures import build
from keel.common.client import Client
from keel.common.config import WorkerConfig
from keel.common.containers import TorchPredictor
from keel.common.datapath import DataPath, MemoryGuard, QueryTooLarge
from keel.common.devices import present_gpus
from keel.common.modelstore import ModelStore
from keel.common.protocol import Batch, Done, Predictions, Register, Source
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.deploy.local import free_port_block
from keel.services.worker import Worker

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")]

DIM, OUT = 8, 4
GIB = 1 << 30


def mlp_store(tmp_path) -> str:
    torch.manual_seed(0)
    arch = {"in_features": DIM, "n_classes": OUT, "hidden": [16]}
    store = str(tmp_path / "store")
    ModelStore(store).save("mlp", build("mlp", **arch), arch="mlp", arch_config=arch, input_shape=[DIM], output_size=OUT)
    return store


@pytest.mark.slow
def test_workers_over_every_gpu_warm_up_and_answer_what_the_cpu_computes(tmp_path, launcher):
    gpus = [g for g in present_gpus() if g.isdigit()]
    assert gpus, "torch sees a GPU but NVML and nvidia-smi list none"
    store = mlp_store(tmp_path)
    run = launcher("gpu-placed")
    spec = load_spec({"cluster": {"name": "gpu-placed", "store": store, "base_port": free_port_block(), "run_dir": str(run.log_dir)},
                      "hosts": {"local": {"address": "127.0.0.1", "gpus": gpus}},
                      "frontend": {"cache_size": 0},
                      "models": {"mlp": {"gpus": "all", "per_gpu": 2, "max_batch": 32, "deadline_ms": 5000,
                                         "worker": {"slots": 2}}}})
    workers = spec.role("worker")
    assert sorted({w.config.gpu for w in workers}) == sorted(gpus) and len(workers) == 2 * len(gpus)
    cluster = run.start_spec(spec, timeout_s=120.0)
    for w in workers:  # warmed up at the largest batch before registering: one batch run, buffers pinned
        info = request_status(w.config.status_endpoint, 2.0)
        assert info["gpu"] == w.config.gpu and info["device"] == "cuda"
        assert info["datapath"]["batches"] >= 1 and info["datapath"]["pinned_bytes"] > 0 and info["max_batch"] == 32
    xs = np.random.default_rng(1).standard_normal((400, DIM)).astype(np.float32)
    want = TorchPredictor(store, "mlp", None).predict_batch(xs)  # the same weights on the CPU
    with Client(cluster.client_endpoints, timeout_ms=5000) as client:
        results = client.predict_batch("mlp", list(xs))
    assert [r.source for r in results] == [Source.MODEL] * len(xs)
    np.testing.assert_allclose(np.stack([r.output for r in results]), want, rtol=1e-4, atol=1e-4)


def test_each_slot_has_its_own_stream_and_outputs_match_the_cpu():
    torch.manual_seed(0)
    module = build("resnet18", in_channels=3, n_classes=10).eval()
    x = np.random.default_rng(0).standard_normal((16, 3, 32, 32)).astype(np.float32)
    with torch.inference_mode():
        want = DataPath(torch, "cpu").run(module, x)
        path, gpu = DataPath(torch, "cuda"), module.to("cuda")
        outs = [None, None]

        def slot(i):
            with torch.inference_mode():
                outs[i] = path.run(gpu, x)

        threads = [threading.Thread(target=slot, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert path.stats()["streams"] == 2
    for out in outs:
        np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3)
    assert 0.0 < path.stats()["copy_share"] < 1.0
    with torch.inference_mode():
        half = DataPath(torch, "cuda", autocast="float16").run(gpu, x)
    assert half.dtype == np.float32
    np.testing.assert_allclose(half, want, rtol=0.05, atol=0.05)


class Hog(torch.nn.Module):
    """Allocates ``per_query`` bytes on the GPU per query, as a large model's activations."""

    def __init__(self, per_query: int):
        super().__init__()
        self.per_query = per_query

    def forward(self, x):
        held = torch.empty(len(x) * self.per_query, dtype=torch.uint8, device=x.device)
        return x[:, :1] * 0 + held[:1].float()


def test_a_batch_past_the_memory_fraction_is_split_on_a_real_out_of_memory_error():
    total = torch.cuda.get_device_properties(0).total_memory
    path = DataPath(torch, "cuda", memory_fraction=8 * GIB / total)  # about 8 GiB for this process
    guard = MemoryGuard(16)
    x = np.ones((16, DIM), np.float32)
    with torch.inference_mode():
        out = guard.run(lambda batch: path.run(Hog(GIB), batch), x)  # 16 and 8 GiB do not fit, 4 does
        assert out.shape == (16, 1) and guard.ceiling <= 4 and guard.splits >= 2
        with pytest.raises(QueryTooLarge, match="one query alone does not fit"):
            guard.run(lambda batch: path.run(Hog(64 * GIB), batch), x[:2])
        assert guard.run(lambda batch: path.run(Hog(1 << 20), batch), x[:2]).shape == (2, 1)  # it serves on
    torch.cuda.set_per_process_memory_fraction(1.0)


CONTAINER = """
import torch

class Hog:
    '''Allocates PER_QUERY GiB on the GPU per query, within a capped share of it.'''

    def load(self, path):
        self.per_query = float(open(path).read()) * (1 << 30)
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(8 * (1 << 30) / total)

    def predict_batch(self, inputs):
        held = torch.empty(int(len(inputs) * self.per_query), dtype=torch.uint8, device="cuda")
        return inputs * 2 + float(held[:1].sum().item() * 0)
"""


def test_a_gpu_worker_splits_on_out_of_memory_and_reports_its_ceiling(tmp_path, zsock):
    router, frontend = zsock(zmq.ROUTER, bind="tcp://127.0.0.1:*"), zsock(zmq.PULL, bind="tcp://127.0.0.1:*")
    (tmp_path / "hog.py").write_text(CONTAINER)
    (tmp_path / "gib").write_text("1")
    store = ModelStore(tmp_path / "store")
    store.add("hog", tmp_path / "gib", "python", entry=f"{tmp_path / 'hog.py'}:Hog", input_shape=[DIM], output_size=DIM)
    worker = Worker(WorkerConfig(name="w-gpu", model="hog", store=str(store.root), device="cuda", max_batch=16, warmup_batch=0,
                                 dispatcher_worker_endpoint=transport.endpoint_of(router)))
    try:
        identity, *body = router.recv_multipart()
        assert isinstance(protocol.decode(body), Register)
        n = 16
        transport.send(router, Batch(batch_id=1, model="hog", qids=list(range(n)), reply_to=[transport.endpoint_of(frontend)] * n,
                                     inputs=np.ones((n, DIM), np.float32)), envelope=[identity])
        got, done = [], None
        for _ in range(1000):
            worker.tick(0.01)
            while frontend.poll(0):
                got.append(protocol.decode(frontend.recv_multipart()))
            while done is None and router.poll(0):
                msg = protocol.decode(router.recv_multipart()[1:])
                done = msg if isinstance(msg, Done) else None
            if done is not None and sum(len(p.qids) for p in got) == n:
                break
        assert done is not None and done.ok and done.max_batch is not None and done.max_batch <= 4
        assert all(isinstance(p, Predictions) and p.error is None for p in got)
        np.testing.assert_array_equal(np.concatenate([p.outputs for p in got]), np.full((n, DIM), 2.0, np.float32))
    finally:
        worker.shutdown()
        torch.cuda.set_per_process_memory_fraction(1.0)
