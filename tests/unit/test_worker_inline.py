"""Which thread runs a batch: the worker's loop runs one itself when the model is expected
to be shorter than the hand-off to an executor (``WorkerConfig.inline_below_ms``) and no
executor is busy; otherwise an executor does. Either way the batch is answered the same:
its predictions to the frontend and a Done to the dispatcher.

An in-process worker driven by ``tick``, a ROUTER in the test playing its dispatcher and a
PULL its frontend."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import WorkerConfig
from keel.common.protocol import Batch, Done, Predictions, Register
from keel.services.worker import Worker

ANY = "tcp://127.0.0.1:*"
DIM = 4


class Recorder:
    """A Python model that notes the thread that ran each batch."""

    input_shape, output_size = [DIM], 2

    def __init__(self):
        self.threads: list[str] = []

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        self.threads.append(threading.current_thread().name)
        return np.ones((len(inputs), self.output_size), np.float32)


@pytest.fixture
def rig(zsock):
    router = zsock(zmq.ROUTER, bind=ANY)
    frontend = zsock(zmq.PULL, bind=ANY)
    made = []

    def make(**options) -> tuple[Worker, Recorder]:
        cfg = WorkerConfig(name="w-inline", model="m", builtin="noop", builtin_input_shape=[DIM], builtin_output_size=2,
                           dispatcher_worker_endpoint=transport.endpoint_of(router), **options)
        worker = Worker(cfg)
        made.append(worker)
        worker.predictor = Recorder()
        identity, *body = router.recv_multipart()
        assert isinstance(protocol.decode(body), Register)
        return worker, identity

    def run_one(worker: Worker, identity: bytes, batch_id: int) -> tuple[Predictions, Done]:
        transport.send(router, Batch(batch_id=batch_id, model="m", qids=[batch_id], reply_to=[transport.endpoint_of(frontend)],
                                     inputs=np.zeros((1, DIM), np.float32)), envelope=[identity])
        predictions = done = None
        for _ in range(200):
            worker.tick(0.01)
            if predictions is None and frontend.poll(0):
                predictions = protocol.decode(frontend.recv_multipart())
            while done is None and router.poll(0):
                msg = protocol.decode(router.recv_multipart()[1:])
                done = msg if isinstance(msg, Done) else None
            if predictions is not None and done is not None:
                return predictions, done
        raise AssertionError(f"batch {batch_id} not answered")

    yield make, run_one
    for worker in made:
        worker.shutdown()


def test_a_short_model_runs_on_the_loop_after_its_first_batch(rig):
    make, run_one = rig
    worker, identity = make()
    for batch_id in (1, 2, 3):
        predictions, done = run_one(worker, identity, batch_id)
        assert predictions.qids == [batch_id] and predictions.outputs.tolist() == [[1.0, 1.0]]
        assert done.batch_id == batch_id and done.ok and done.batch_size == 1
    # the first batch has no service time to go by: an executor runs it
    assert worker.predictor.threads[0].startswith("executor-")
    assert worker.predictor.threads[1:] == [threading.current_thread().name] * 2
    assert worker.service["1"]["n"] == 3  # SERF's profile counts the loop's batches too (one computing)


def test_inline_off_every_batch_goes_to_an_executor(rig):
    make, run_one = rig
    worker, identity = make(inline_below_ms=0.0)
    for batch_id in (1, 2, 3):
        run_one(worker, identity, batch_id)
    assert all(name.startswith("executor-") for name in worker.predictor.threads)


def test_a_model_slower_than_the_bound_stays_on_an_executor(rig):
    make, run_one = rig
    worker, identity = make()
    worker.expected_ms = 5.0  # as after batches of 5 ms: above the 0.5 ms bound
    for batch_id in (1, 2):
        run_one(worker, identity, batch_id)
    assert all(name.startswith("executor-") for name in worker.predictor.threads)
