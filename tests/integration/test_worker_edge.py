"""A live worker process (builtin models) driven by a fake dispatcher: a ROUTER in the test
that takes its Register, answers its heartbeats and sends it Batches and Configure; a PULL
in the test plays the frontend its predictions go to.

Covers: a Done for every batch taken, whatever its reply_to (hardening defect 4), a model
or input failure answered with Done(ok=False, error), expired queries not run, Configure
applied and re-announced, Leave on SIGTERM, Status."""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.config import WorkerConfig
from keel.common.protocol import Batch, Configure, Done, Heartbeat, Leave, Predictions, Register
from keel.common.spec import ServiceLaunch
from keel.common.waiting import wait_until
from keel.deploy.local import local_endpoint

ANY = "tcp://127.0.0.1:*"
DIM = 8


class FakeDispatcher:
    """The dispatcher's ROUTER, played by the test."""

    def __init__(self, zsock):
        self.router = zsock(zmq.ROUTER, bind=ANY)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # as the real dispatcher's: a worker that re-connects under its name (after missing
        # heartbeats this fake answers only inside recv) takes the identity over
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.endpoint = transport.endpoint_of(self.router)
        self.identity: bytes | None = None
        self.next_id = 1

    def recv(self, kinds: tuple[type, ...], timeout_s: float = 10.0):
        """The next message of one of ``kinds``; heartbeats are answered on the way."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.router.poll(50):
                continue
            envelope, body = protocol.split_envelope(self.router.recv_multipart())
            self.identity = envelope[0]
            msg = protocol.decode(body)
            if isinstance(msg, Heartbeat):
                transport.try_send(self.router, Heartbeat(sender="fake"), envelope=envelope)
            if isinstance(msg, kinds):
                return msg
        raise AssertionError(f"no {[k.__name__ for k in kinds]} within {timeout_s} s")

    def send(self, msg) -> None:
        transport.send(self.router, msg, envelope=[self.identity])

    def batch(self, reply_to: list[str], budgets_ms: list[float] | None = None, inputs=None, **kw) -> Batch:
        n = len(reply_to)
        inputs = np.arange(n * DIM, dtype=np.float32).reshape(n, DIM) if inputs is None else inputs
        b = Batch(batch_id=self.next_id, model="m", qids=list(range(100 * self.next_id, 100 * self.next_id + n)),
                  reply_to=reply_to, inputs=inputs, budgets_ms=budgets_ms, **kw)
        self.next_id += 1
        self.send(b)
        return b


@pytest.fixture
def worker(launcher, zsock):
    """(fake dispatcher, frontend PULL and its endpoint, worker config, launcher) for one
    live "sleep" worker (its output: the first 4 input features)."""
    disp = FakeDispatcher(zsock)
    frontend = zsock(zmq.PULL, bind=ANY)
    cfg = WorkerConfig(name="w-edge", model="m", builtin="sleep", builtin_input_shape=[DIM], builtin_output_size=4,
                       dispatcher_worker_endpoint=disp.endpoint, status_endpoint=local_endpoint(), instance="c5.xlarge",
                       price=0.17, torch_threads=3, slots=2)
    run = launcher("worker")
    run.start(ServiceLaunch(cfg.name, "worker", "local", cfg))
    reg = disp.recv((Register,))
    assert (reg.worker, reg.slots, reg.instance, reg.price, reg.threads) == ("w-edge", 2, "c5.xlarge", 0.17, 3)
    return disp, frontend, transport.endpoint_of(frontend), cfg, run


def predictions(sock, timeout_s: float = 5.0) -> Predictions:
    assert sock.poll(int(timeout_s * 1000)), "no predictions"
    return protocol.decode(sock.recv_multipart())


def test_done_for_every_batch_with_unusable_reply_to_and_still_serving(worker):
    disp, frontend, good, _, _ = worker
    hostile = [[""], ["garbage"], ["tcp://no-port"], ["", "udp://x:1"], ["tcp://no-port", good]]
    sent = [disp.batch(reply_to) for reply_to in hostile]
    dones = [disp.recv((Done,)) for _ in sent]  # in the order they finished: two slots run at once
    assert sorted(d.batch_id for d in dones) == [b.batch_id for b in sent]
    assert all(d.ok is False and "undeliverable" in d.error for d in dones)
    # The one deliverable query of the last batch still went out.
    got = predictions(frontend)
    assert got.qids == [sent[-1].qids[1]]
    np.testing.assert_array_equal(got.outputs, sent[-1].inputs[1:, :4])
    # And the worker still serves a good batch.
    b = disp.batch([good, good])
    done = disp.recv((Done,))
    assert (done.batch_id, done.ok, done.error, done.batch_size) == (b.batch_id, True, None, 2)
    got = predictions(frontend)
    assert got.qids == b.qids and got.error is None


def test_model_failure_answers_done_with_error(worker):
    disp, frontend, good, _, _ = worker
    b = disp.batch([good], inputs=np.zeros((1, DIM + 1), np.float32))  # not the model's input shape
    done = disp.recv((Done,))
    assert done.batch_id == b.batch_id and done.ok is False and "shape" in done.error
    got = predictions(frontend)
    assert got.qids == b.qids and got.outputs is None and "shape" in got.error
    b = disp.batch([good])
    assert disp.recv((Done,)).ok is True


def test_expired_queries_are_not_run(worker):
    disp, frontend, good, cfg, _ = worker
    b = disp.batch([good] * 4, budgets_ms=[-1.0, 60_000.0, 0.0, 60_000.0])
    done = disp.recv((Done,))
    assert done.batch_id == b.batch_id and done.ok and done.batch_size == 2
    got = predictions(frontend)
    assert got.qids == [b.qids[1], b.qids[3]]
    np.testing.assert_array_equal(got.outputs, b.inputs[[1, 3], :4])
    b = disp.batch([good], budgets_ms=[-5.0])  # nothing left to run: still a Done
    done = disp.recv((Done,))
    assert done.batch_id == b.batch_id and done.ok and done.batch_size == 0
    assert not frontend.poll(200)
    info = transport.request_status(cfg.status_endpoint, 5.0)
    assert info["expired"] == 3


def test_a_batch_that_expired_on_its_way_is_not_computed(worker):
    """Budgets count from when the dispatcher sent the batch (``sent_at``), not from its
    arrival: a batch that waited past every deadline is answered Done with nothing run."""
    disp, frontend, good, cfg, _ = worker
    b = disp.batch([good] * 3, budgets_ms=[500.0, 800.0, 900.0], sent_at=time.time() - 2.0)
    done = disp.recv((Done,))
    assert done.batch_id == b.batch_id and done.ok and done.batch_size == 0
    assert not frontend.poll(200)
    b = disp.batch([good, good], budgets_ms=[500.0, 60_000.0], sent_at=time.time() - 2.0)
    done = disp.recv((Done,))
    assert done.batch_size == 1 and predictions(frontend).qids == [b.qids[1]]
    assert transport.request_status(cfg.status_endpoint, 5.0)["expired"] == 4


def test_configure_is_applied_and_announced_on_the_next_register(worker):
    disp, _, _, cfg, _ = worker
    disp.send(Configure(slots=5, threads=2))
    disp.send(Configure(threads=7))
    assert wait_until(lambda: transport.request_status(cfg.status_endpoint, 5.0)["configured"] == 2, 10.0)
    info = transport.request_status(cfg.status_endpoint, 5.0)
    assert (info["slots"], info["threads"]) == (5, 7)
    # No Register follows a Configure (the dispatcher would drop what the worker holds) ...
    with pytest.raises(AssertionError, match="no"):
        disp.recv((Register,), timeout_s=0.3)
    # ... but the next one, after the dispatcher lost the worker, carries the new values.
    disp.send(Heartbeat(sender="dispatcher", known=False))
    reg = disp.recv((Register,))
    assert (reg.slots, reg.threads, reg.instance, reg.price) == (5, 7, "c5.xlarge", 0.17)


def test_status_counts(worker):
    disp, _, good, cfg, _ = worker
    disp.batch([good])
    disp.batch([""])
    disp.recv((Done,)), disp.recv((Done,))
    info = transport.request_status(cfg.status_endpoint, 5.0)
    assert info["role"] == "worker" and info["service"] == "w-edge"
    assert (info["batches"], info["errors"], info["undeliverable"], info["slots"], info["threads"]) == (2, 1, 1, 2, 3)


def test_sigterm_sends_leave(worker):
    disp, _, _, cfg, run = worker
    run.kill(cfg.name, signal.SIGTERM)
    leave = disp.recv((Leave,), timeout_s=5.0)
    assert leave.worker == "w-edge"
    assert run.procs[cfg.name].returncode == 0


#: ``keel serve`` with a SIGTERM sent to itself between building the service and running it:
#: the moment a worker has already announced itself (its Register leaves from __init__) but
#: its loop has not started, which a test or a supervisor stopping it on that sign can hit
TERM_BEFORE_RUN = """
import os, signal, sys
from keel.services import serve
built = serve.build
def build(role, cfg):
    service = built(role, cfg)
    os.kill(os.getpid(), signal.SIGTERM)
    return service
serve.build = build
sys.exit(serve.main(sys.argv[1:]))
"""


def test_sigterm_before_the_loop_starts_still_sends_leave(zsock, tmp_path):
    """The cause of test_sigterm_sends_leave's flake: a SIGTERM that arrives after the worker's
    Register is out but before ``run`` set its handlers killed it by the default action."""
    import subprocess
    import sys

    from keel.common import config

    disp = FakeDispatcher(zsock)
    cfg = WorkerConfig(name="w-early", model="m", builtin="sleep", builtin_input_shape=[DIM], builtin_output_size=4,
                       dispatcher_worker_endpoint=disp.endpoint, status_endpoint=local_endpoint())
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", TERM_BEFORE_RUN, "worker", "--config", config.to_json(cfg)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert proc.wait(30) == 0, (tmp_path / "worker.log").read_text()[-2000:]
        assert disp.recv((Register,), timeout_s=5.0).worker == "w-early"
        assert disp.recv((Leave,), timeout_s=5.0).worker == "w-early"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
