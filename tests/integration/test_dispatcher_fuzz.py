"""Fuzz a live dispatcher process on both its ports (the query PULL and the worker ROUTER)
with garbage frames and with well-formed but hostile messages of every kind; after each
example a normal query must still reach a normal worker, the process must be alive, and
its log must show no handler or chore that failed (a caught exception is still a bug).

Bounded: derandomized hypothesis (a failure reproduces), ~150 examples per test."""
from __future__ import annotations

import itertools
import time

import numpy as np
import orjson
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.common import protocol, transport
from keel.common.config import BatchPolicy, DispatcherConfig
from keel.common.protocol import (
    MAX_ID, Answered, Batch, CodingTag, Configure, Done, Heartbeat, Leave, MemberBatch, ParityMembers, Predict,
    Predictions, Queries, Register, Reply, ModelRole, Status,
)
from keel.common.spec import ServiceLaunch
from keel.deploy.local import local_endpoint

HOSTILE = (b"h0", b"h1", b"h2")
HOSTILE_NAMES = ("h0", "h1", "x", "m")  # names hostile peers register under ("normal" would replace the normal worker)
REPLY_TO = "tcp://127.0.0.1:1"


class Rig:
    """A dispatcher process, a normal worker, hostile peers and a frontend, all on loopback."""

    def __init__(self, launcher):
        self.launcher = launcher("fuzz")
        self.cfg = DispatcherConfig(
            name="dispatcher", query_endpoint=local_endpoint(), worker_endpoint=local_endpoint(),
            encoder_endpoint=local_endpoint(),
            models={"m": BatchPolicy(fixed_batch=4, k=2, parity_model="m-parity"), "plain": BatchPolicy()},
        )
        self.ctx = zmq.Context()
        self.encoder = self._sock(zmq.PULL, bind=self.cfg.encoder_endpoint)  # batch copies land here
        self.proc = self.launcher.start(ServiceLaunch("dispatcher", "dispatcher", "local", self.cfg))
        self.frontend = self._sock(zmq.PUSH, connect=self.cfg.query_endpoint)
        self.hostile = [self._sock(zmq.DEALER, connect=self.cfg.worker_endpoint, identity=i) for i in HOSTILE]
        self.asker = self._sock(zmq.DEALER, connect=self.cfg.worker_endpoint, identity=b"asker")
        self.normal = self._sock(zmq.DEALER, connect=self.cfg.worker_endpoint, identity=b"normal")
        self.probes = itertools.count(10**15)
        self.wait_status(lambda info: True)
        self.register_normal()

    def _sock(self, kind: int, bind: str | None = None, connect: str | None = None, identity: bytes | None = None):
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if identity:
            sock.setsockopt(zmq.IDENTITY, identity)
        if bind:
            sock.bind(bind)
        if connect:
            sock.connect(connect)
        return sock

    def close(self) -> None:
        self.ctx.destroy(0)

    def status(self, timeout_s: float = 2.0) -> dict | None:
        transport.send(self.asker, Status(service="?"))
        deadline = time.monotonic() + timeout_s
        while self.asker.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            msg = protocol.decode(self.asker.recv_multipart())
            if isinstance(msg, Status) and msg.info is not None:
                return msg.info
            if time.monotonic() > deadline:
                break
        return None

    def wait_status(self, predicate, timeout_s: float = 20.0) -> dict:
        deadline, info = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the dispatcher exited with {self.proc.returncode}"
            info = self.status(0.5)
            if info is not None and predicate(info):
                return info
            transport.send(self.normal, Heartbeat(sender="normal"))  # known=False back: it registers again
            self.drain()
        raise AssertionError(f"dispatcher status did not reach the expected state; last {info}")

    def register_normal(self) -> None:
        transport.send(self.normal, Register(worker="normal", model="m", slots=4))
        self.wait_status(lambda info: "normal" in info["workers"])

    def drain(self) -> list[Batch]:
        """Read what every test peer was sent; the normal worker finishes its batches."""
        for sock in [*self.hostile, self.encoder]:
            while sock.poll(0):
                sock.recv_multipart()
        got = []
        while self.normal.poll(0):
            msg = protocol.decode(self.normal.recv_multipart())
            if isinstance(msg, Batch):
                got.append(msg)
                transport.send(self.normal, Done(worker="normal", batch_id=msg.batch_id, batch_size=len(msg.qids), service_ms=1.0))
            elif isinstance(msg, Heartbeat) and not msg.known:
                transport.send(self.normal, Register(worker="normal", model="m", slots=4))
        return got

    def send(self, where: int, frames: list) -> None:
        sock = self.frontend if where == 0 else self.hostile[where - 1]
        sock.send_multipart(frames, flags=zmq.NOBLOCK)

    def check_serving(self) -> None:
        """Hostile peers leave (under every name they may have registered), then a normal
        query must reach the normal worker."""
        for sock in self.hostile:
            for name in HOSTILE_NAMES:
                transport.send(sock, Leave(worker=name))
        self.wait_status(lambda info: set(info["workers"]) == {"normal"}, timeout_s=10.0)
        probe = next(self.probes)
        transport.send(self.frontend, Queries(model="m", qids=[probe], budgets_ms=[60_000.0], reply_to=REPLY_TO,
                                              inputs=np.zeros((1, 4), np.float32)))
        deadline = time.monotonic() + 10.0
        last_beat = 0.0
        while time.monotonic() < deadline:
            if any(probe in b.qids for b in self.drain()):
                break
            if time.monotonic() - last_beat > 0.1:
                transport.send(self.normal, Heartbeat(sender="normal"))
                last_beat = time.monotonic()
            self.normal.poll(10)
        else:
            raise AssertionError(f"the probe query {probe} did not reach the normal worker; status {self.status()}")
        assert self.proc.poll() is None

    def failures_logged(self) -> list[str]:
        log = (self.launcher.log_dir / f"{self.cfg.name}.log").read_text(errors="replace")
        return [line[:400] for line in log.splitlines() if '"handler failed"' in line or '"chore failed"' in line
                or '"timer failed"' in line]


@pytest.fixture
def rig(launcher):
    r = Rig(launcher)
    yield r
    r.close()


# --------------------------------------------------------------------------- strategies

ids = st.one_of(st.integers(0, 100), st.integers(0, MAX_ID))
names = st.one_of(st.sampled_from(["m", "plain", "m-parity", "unknown", "", "normal", "h0"]), st.text(max_size=12))
worker_names = st.sampled_from(HOSTILE_NAMES)
floats = st.one_of(st.floats(-1e3, 1e5, allow_nan=False), st.sampled_from([0.0, -1e300, 1e300, 1e-300]))
dtypes = st.sampled_from(["float32", "float64", "int8", "uint8", "bool", "int64"])
roles = st.sampled_from([ModelRole.DEPLOYED, ModelRole.PARITY])


@st.composite
def rows(draw, n: int) -> np.ndarray:
    shape = (n, *draw(st.lists(st.integers(0, 5), max_size=2)))
    return np.zeros(shape, draw(dtypes))


@st.composite
def queries(draw) -> Queries:
    n = draw(st.integers(0, 5))
    return Queries(model=draw(names), qids=draw(st.lists(ids, min_size=n, max_size=n)),
                   budgets_ms=draw(st.lists(floats, min_size=n, max_size=n)), reply_to=draw(st.text(max_size=20)),
                   inputs=draw(rows(n)))


@st.composite
def batches(draw) -> Batch:
    n = draw(st.integers(0, 4))
    k = draw(st.integers(2, 4))
    group = draw(st.none() | st.builds(CodingTag, ids, st.integers(0, k), st.just(k)))
    members = None
    if group is not None and draw(st.booleans()):
        members = ParityMembers(draw(names), "add", [MemberBatch([1], [REPLY_TO])] + [None] * (k - 1))
    return Batch(batch_id=draw(ids), model=draw(names), qids=draw(st.lists(ids, min_size=n, max_size=n)),
                 reply_to=[REPLY_TO] * n, inputs=draw(rows(n)), role=draw(roles), group=group, members=members,
                 budgets_ms=draw(st.none() | st.lists(floats, min_size=n, max_size=n)))


messages = st.one_of(
    queries(),
    batches(),
    st.builds(Register, worker=worker_names, model=names, role=roles, slots=st.integers(1, 1024),
              max_batch=st.integers(1, 65536), instance=st.text(max_size=10), price=st.floats(0, 1e6), threads=st.integers(1, 256)),
    st.builds(Done, worker=names, batch_id=ids, batch_size=st.integers(0, 65536), service_ms=st.floats(0, 1e9),
              ok=st.booleans(), error=st.none() | st.text(max_size=10)),
    st.builds(Heartbeat, sender=names, known=st.booleans()),
    st.builds(Status, service=names, info=st.none() | st.just({"a": 1})),
    st.builds(Leave, worker=names),
    st.builds(Configure, slots=st.none() | st.integers(1, 1024), threads=st.none() | st.integers(1, 256)),
    st.builds(Answered, model=names, qids=st.lists(ids, max_size=50)),
    st.builds(Predict, request_id=st.text(min_size=1, max_size=8), model=names, input=st.just(np.zeros(3, np.float32))),
    st.builds(Reply, request_id=st.text(max_size=8), source=st.just("model")),
    st.builds(Predictions, batch_id=ids, model=names, qids=st.just([1]), outputs=st.just(np.zeros((1, 2), np.float32))),
)
ports = st.integers(0, len(HOSTILE))  # 0: the query PULL; 1..: hostile DEALERs on the worker ROUTER

json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=6)
fields = st.sampled_from(["model", "qids", "budgets_ms", "reply_to", "worker", "batch_id", "slots", "max_batch", "role",
                          "group", "members", "tensors", "ok", "threads", "info", "known", "batch_size"])
headers = st.builds(lambda kind, extra: orjson.dumps({"v": 1, "kind": kind, **extra}),
                    st.sampled_from(sorted(protocol.MESSAGES)) | st.text(max_size=8), st.dictionaries(fields, json_values, max_size=6))
crafted = st.sampled_from([  # what orjson cannot make: big numbers, NaN, nesting, duplicate keys, not UTF-8
    b'{"v":1,"kind":"done","worker":"h0","batch_id":99999999999999999999999,"batch_size":1,"service_ms":1}',
    b'{"v":1,"kind":"queries","model":"m","qids":[1],"budgets_ms":[NaN],"reply_to":"x","tensors":[]}',
    b'{"v":1,"kind":"register","worker":"h0","model":"m","worker":"normal"}',
    b'[' * 10_000, b'{"v":1,"kind":"\xff\xfe"}', b'\xff\xfe\xfd', b'{"v":1.0,"kind":"heartbeat","sender":"x"}',
    b'{"v":1,"kind":"queries","model":"m","qids":[1,2],"budgets_ms":[1e308,1e308],"reply_to":"x",'
    b'"tensors":[{"dtype":"float32","shape":[2,1099511627776]}]}',
])
garbage = (st.lists(st.binary(max_size=64), min_size=1, max_size=4)
           | st.tuples(headers | crafted, st.lists(st.binary(max_size=64), max_size=2)).map(lambda t: [t[0], *t[1]]))

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --------------------------------------------------------------------------- tests


def test_hostile_messages_of_every_kind_on_both_ports(rig):
    @FUZZ
    @given(st.lists(st.tuples(ports, messages), min_size=1, max_size=8))
    def run(sent):
        for where, msg in sent:
            rig.send(where, protocol.encode(msg))
        rig.check_serving()
        examples.append(len(sent))

    examples: list[int] = []
    run()
    assert len(examples) >= 100
    assert rig.failures_logged() == []


def test_garbage_frames_on_both_ports(rig):
    @FUZZ
    @given(st.lists(st.tuples(ports, garbage), min_size=1, max_size=8))
    def run(sent):
        for where, frames in sent:
            rig.send(where, frames)
        rig.check_serving()
        examples.append(len(sent))

    examples: list[int] = []
    run()
    assert len(examples) >= 100
    assert rig.failures_logged() == []
