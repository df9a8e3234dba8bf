"""Fuzz a live worker through a fake dispatcher ROUTER: garbage frames, hostile Batches
(inputs of the wrong shape or dtype, empty batches, garbage reply_to, random budgets,
parity batches with random members), Configure with edge values, Heartbeats saying "you
are unknown", and every other message kind. After each example the worker must have
answered every Batch it could decode with exactly one Done, and still serve a normal
batch. Strategies come from test_parm_fuzz.py."""
from __future__ import annotations

import itertools
from collections import Counter
import time

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_parm_fuzz import frames_of, garbage_frames, hostile, hostile_batch

from keel.common import protocol, transport
from keel.common.config import WorkerConfig
from keel.common.protocol import Batch, Configure, Done, Heartbeat, Predictions, Register
from keel.common.spec import ServiceLaunch
from keel.deploy.local import local_endpoint

pytestmark = pytest.mark.slow

DIM = 6
configures = st.builds(Configure, slots=st.one_of(st.none(), st.sampled_from([1, 2, 1024])),
                       threads=st.one_of(st.none(), st.sampled_from([1, 2, 256])))
examples = st.lists(st.one_of(hostile, st.lists(configures.map(frames_of), max_size=2),
                              st.lists(hostile_batch().map(frames_of), min_size=1, max_size=4),
                              st.lists(garbage_frames, max_size=2)), min_size=1, max_size=3).map(
    lambda groups: [frames for group in groups for frames in group])


class Harness:
    def __init__(self, run):
        self.ctx = zmq.Context()
        self.router = transport.make_socket(self.ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*")
        self.frontend = transport.make_socket(self.ctx, zmq.PULL, bind="tcp://127.0.0.1:*")
        self.frontend_ep = transport.endpoint_of(self.frontend)
        self.cfg = WorkerConfig(name="w-fuzz", model="m", builtin="sleep", builtin_input_shape=[DIM], builtin_output_size=3,
                                dispatcher_worker_endpoint=transport.endpoint_of(self.router), status_endpoint=local_endpoint())
        self.run = run
        run.start(ServiceLaunch(self.cfg.name, "worker", "local", self.cfg))
        self.identity = None
        self._next(lambda m: isinstance(m, Register), 30.0)
        self.ids = itertools.count(10**9)

    def _next(self, match, timeout_s: float = 5.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.router.poll(50):
                continue
            envelope, body = protocol.split_envelope(self.router.recv_multipart())
            self.identity = envelope[0]
            msg = protocol.decode(body)
            if isinstance(msg, Heartbeat):
                transport.send(self.router, Heartbeat(sender="fake"), envelope=envelope)
            if match(msg):
                return msg
        raise AssertionError(f"nothing matched within {timeout_s} s")

    def send(self, frames) -> None:
        self.router.send_multipart([self.identity, *frames])

    def check(self, hostile_batch_ids: list[int]) -> None:
        """Every decodable hostile batch got its Done, then a normal batch is served."""
        self.run.check_alive()
        good = next(self.ids)
        x = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
        self.send(frames_of(Batch(batch_id=good, model="m", qids=[good, good + 1], reply_to=[self.frontend_ep] * 2,
                                  inputs=x, budgets_ms=[60_000.0, 60_000.0])))
        # batches run concurrently (slots > 1 after a Configure): Dones come in any order
        dones: list[Done] = []
        wanted = Counter([*hostile_batch_ids, good])

        def all_in(m) -> bool:
            if isinstance(m, Done):
                dones.append(m)
            return not wanted - Counter(d.batch_id for d in dones)
        self._next(all_in)
        assert Counter(d.batch_id for d in dones) == wanted, "a batch the worker took got no Done (or two)"
        last = next(d for d in dones if d.batch_id == good)
        assert last.ok and last.batch_size == 2
        while True:  # the good batch's predictions (hostile ones that reached us are skipped)
            assert self.frontend.poll(5000), "no predictions for the normal batch"
            msg = protocol.decode(self.frontend.recv_multipart())
            if isinstance(msg, Predictions) and msg.qids == [good, good + 1]:
                np.testing.assert_array_equal(msg.outputs, x[:, :3])
                return

    def close(self):
        self.ctx.destroy(0)


@pytest.fixture(scope="module")
def harness(module_launcher):
    h = Harness(module_launcher("worker-fuzz"))
    yield h
    h.close()


def decodable_batch_id(frames) -> int | None:
    try:
        msg = protocol.decode(frames)
    except protocol.ProtocolError:
        return None
    return msg.batch_id if isinstance(msg, Batch) else None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=examples)
def test_worker_survives_hostile_dispatcher_messages(harness, messages):
    expected = []
    for frames in messages:
        harness.send(frames)
        batch_id = decodable_batch_id(frames)
        if batch_id is not None:
            expected.append(batch_id)
    harness.check(expected)


def test_worker_status_after_fuzzing(harness):
    harness.check([])
    info = transport.request_status(harness.cfg.status_endpoint, 5.0)
    assert info["batches"] >= 1 and info["errors"] >= 1 and info["undeliverable"] >= 1
