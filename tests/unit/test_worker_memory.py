"""A worker whose device runs out of memory serves on: a batch that does not fit is split
and retried (every query answered), ``Done.max_batch`` tells the dispatcher the ceiling;
a query that alone does not fit is answered with a clear error; a warm-up batch at the
largest size runs before the worker registers, and one that does not fit lowers the
``max_batch`` it registers with. The out-of-memory error is simulated on the CPU: a
Python container raises ``torch.cuda.OutOfMemoryError`` above a batch size.

An in-process worker driven by ``tick``, a ROUTER in the test playing its dispatcher and
a PULL its frontend."""
from __future__ import annotations

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import WorkerConfig
from keel.common.modelstore import ModelStore
from keel.common.protocol import Batch, Done, Predictions, Register
from keel.services.worker import Worker

ANY = "tcp://127.0.0.1:*"
DIM = 3
CONTAINER = """
import numpy as np
import torch

class Fits:
    '''Runs out of device memory above LIMIT queries (a file beside it sets LIMIT).'''

    def load(self, path):
        self.limit = int(open(path).read())

    def predict_batch(self, inputs):
        if len(inputs) > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return inputs * 2
"""


@pytest.fixture
def rig(zsock, tmp_path):
    router = zsock(zmq.ROUTER, bind=ANY)
    frontend = zsock(zmq.PULL, bind=ANY)
    made = []

    def make(limit: int, **options) -> tuple[Worker, bytes, Register]:
        (tmp_path / "fits.py").write_text(CONTAINER)
        (tmp_path / "limit").write_text(str(limit))
        store = ModelStore(tmp_path / f"store-{limit}")
        store.add("fits", tmp_path / "limit", "python", entry=f"{tmp_path / 'fits.py'}:Fits", input_shape=[DIM], output_size=DIM)
        cfg = WorkerConfig(name="w-mem", model="fits", store=str(store.root), max_batch=16,
                           dispatcher_worker_endpoint=transport.endpoint_of(router), **options)
        worker = Worker(cfg)
        made.append(worker)
        identity, *body = router.recv_multipart()
        register = protocol.decode(body)
        assert isinstance(register, Register)
        return worker, identity, register

    def run(worker: Worker, identity: bytes, batch_id: int, n: int) -> tuple[list[Predictions], Done]:
        qids = list(range(batch_id * 100, batch_id * 100 + n))
        transport.send(router, Batch(batch_id=batch_id, model="fits", qids=qids, reply_to=[transport.endpoint_of(frontend)] * n,
                                     inputs=np.arange(n * DIM, dtype=np.float32).reshape(n, DIM)), envelope=[identity])
        predictions, done = [], None
        for _ in range(300):
            worker.tick(0.01)
            while frontend.poll(0):
                predictions.append(protocol.decode(frontend.recv_multipart()))
            while done is None and router.poll(0):
                msg = protocol.decode(router.recv_multipart()[1:])
                done = msg if isinstance(msg, Done) else None
            if predictions and done is not None:
                return predictions, done
        raise AssertionError(f"batch {batch_id} not answered")

    yield make, run
    for worker in made:
        worker.shutdown()


def test_a_batch_past_memory_is_split_every_query_answered_and_the_ceiling_reported(rig):
    make, run = rig
    worker, identity, register = make(limit=3)
    assert register.max_batch == 16  # no warm-up on the CPU by default
    predictions, done = run(worker, identity, 1, 8)
    assert done.ok and done.batch_size == 8 and done.max_batch == 2
    got = np.concatenate([p.outputs for p in predictions])
    np.testing.assert_array_equal(got, np.arange(8 * DIM, dtype=np.float32).reshape(8, DIM) * 2)
    assert [q for p in predictions for q in p.qids] == list(range(100, 108))
    predictions, done = run(worker, identity, 2, 1)  # it serves on, and says the ceiling again
    assert done.ok and done.max_batch == 2
    status = worker.status()
    assert status["max_batch"] == 2 and status["oom_splits"] == 2 and status["device"] == "cpu"


def test_a_query_that_alone_does_not_fit_gets_a_clear_error_and_the_worker_serves_on(rig):
    make, run = rig
    worker, identity, _ = make(limit=0)
    predictions, done = run(worker, identity, 1, 2)
    assert not done.ok and "one query alone does not fit" in done.error
    assert all(p.error and "does not fit" in p.error for p in predictions)
    assert worker.status()["too_large"] == 1
    _, done = run(worker, identity, 2, 1)  # the next batch is run, not refused
    assert not done.ok and worker.counts["batches"] == 2


def test_a_warm_up_that_does_not_fit_lowers_the_max_batch_the_worker_registers_with(rig):
    make, run = rig
    worker, identity, register = make(limit=5, warmup_batch=16)
    assert register.max_batch == 4  # 16 and 8 did not fit
    _, done = run(worker, identity, 1, 4)
    assert done.ok and done.max_batch == 4
