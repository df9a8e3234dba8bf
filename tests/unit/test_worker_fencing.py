"""A worker refuses a batch from a stale dispatcher: one stamped with an older epoch than
the manager's newest decision the worker knows (messages stamped with an older
epoch are refused). A real Worker, stepped with ``tick``; the test plays the dispatcher
(a ROUTER) and the frontend (a PULL)."""
from __future__ import annotations

import time

import numpy as np
import zmq

from keel.common import protocol, transport
from keel.common.config import WorkerConfig
from keel.common.protocol import Batch, Done, Predictions, Register
from keel.services.worker import Worker

ANY = "tcp://127.0.0.1:*"
DIM = 4


class Decided:
    """Stands in for the worker's link to the manager (three other processes): the holder
    of group "dispatcher" and its epoch, as the manager's log has them."""

    def __init__(self, holder: str, epoch: int):
        self.decision = (holder, epoch, {})

    def holder(self, group: str) -> tuple[str, int, dict]:
        return self.decision

    def watch(self, *_) -> None: ...

    def unwatch(self, *_) -> None: ...

    def close(self) -> None: ...


def _recv(worker: Worker, sock: zmq.Socket, kinds: tuple, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        worker.tick(0.01)
        while sock.poll(0):
            frames = sock.recv_multipart(copy=False)
            msg = protocol.decode(frames[1:] if sock.type == zmq.ROUTER else frames)
            if isinstance(msg, kinds):
                return msg
    raise AssertionError(f"no {kinds} within {timeout_s} s")


def test_a_batch_from_a_stale_dispatcher_is_refused_and_a_current_one_runs(zsock):
    dispatcher = zsock(zmq.ROUTER, bind=ANY)
    frontend = zsock(zmq.PULL, bind=ANY)
    cfg = WorkerConfig(name="w-fence", model="m", builtin="sleep", builtin_input_shape=[DIM], builtin_output_size=DIM,
                       dispatcher_worker_endpoint=transport.endpoint_of(dispatcher), heartbeat_interval_s=30.0)
    worker = Worker(cfg)
    try:
        _recv(worker, dispatcher, (Register,))
        worker.manager = Decided("dispatcher-b", 5)
        reply_to = transport.endpoint_of(frontend)

        def batch(batch_id: int, fence: int) -> Batch:
            b = Batch(batch_id=batch_id, model="m", qids=[batch_id], reply_to=[reply_to],
                      inputs=np.full((1, DIM), batch_id, np.float32), fence=fence)
            dispatcher.send_multipart([b"w-fence", *protocol.encode(b)])
            return b

        batch(1, fence=4)  # the old dispatcher, thawed: epoch 4 < 5
        done = _recv(worker, dispatcher, (Done,))
        assert (done.batch_id, done.ok, done.batch_size) == (1, False, 0)
        assert "stale dispatcher" in done.error and "epoch 4" in done.error
        assert not frontend.poll(100) and worker.counts["fenced"] == 1
        batch(2, fence=5)  # the holder's
        got = _recv(worker, frontend, (Predictions,))
        assert got.qids == [2]
        np.testing.assert_array_equal(got.outputs, np.full((1, DIM), 2, np.float32))
        done = _recv(worker, dispatcher, (Done,))
        assert (done.batch_id, done.ok) == (2, True) and worker.counts["fenced"] == 1
    finally:
        worker.shutdown()
