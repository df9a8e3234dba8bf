"""Fuzz the live ParM encoder and decoder: garbage frames and well-formed but hostile
messages of every kind (``protocol.MESSAGES``: batches with random coding tags, members and
query ids, predictions with wrong shapes, parity outputs without members, ...) go to their
PULL ports; after each example both processes must be alive and still do their job on a
normal coding group. The strategies are shared with test_worker_fuzz.py."""
from __future__ import annotations

import itertools

import numpy as np
import orjson
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.common import ids, protocol, transport
from keel.common.config import DecoderConfig, EncoderConfig
from keel.common.protocol import Batch, CodingTag, MemberBatch, ParityMembers, Predictions, ModelRole, Source
from keel.common.spec import ServiceLaunch
from keel.deploy.local import local_endpoint

pytestmark = pytest.mark.slow

ANY = "tcp://127.0.0.1:*"
MODELS = ["m", "x", ""]
DTYPES = ["float32", "float64", "int8", "uint8", "bool", "float16", "int64"]
#: where hostile queries' answers go: refused, unconnectable or nobody listening (never a
#: host name: resolving one would stall the peer's I/O thread, which is not under test)
REPLY_TO = ["", "garbage", "tcp://no-port", "udp://127.0.0.1:9", "tcp://127.0.0.1:1", "ipc:///nonexistent/x"]

group_ids = st.one_of(st.integers(0, 2**63 - 1), st.integers(0, 2**33), st.just(((1 << ids.EPOCH_BITS) - 1) << 32))


@st.composite
def tags(draw):
    k = draw(st.integers(2, 6))
    return CodingTag(draw(group_ids), draw(st.integers(0, k)), k)


@st.composite
def arrays(draw, rows: int):
    dtype = draw(st.sampled_from(DTYPES))
    tail = draw(st.lists(st.integers(0, 5), max_size=3))
    return np.zeros((rows, *tail), dtype) + draw(st.integers(0, 3))


@st.composite
def member_lists(draw, k: int):
    batches = [draw(st.one_of(st.none(), st.builds(lambda n: MemberBatch(list(range(n)), ["tcp://127.0.0.1:1"] * n),
                                                      st.integers(0, 4)))) for _ in range(k)]
    if all(b is None for b in batches):
        batches[0] = MemberBatch([1], ["garbage"])
    return batches


@st.composite
def hostile_batch(draw) -> Batch:
    n = draw(st.integers(0, 4))
    tag = draw(st.one_of(st.none(), tags()))
    members = None
    if tag is not None and draw(st.booleans()):
        members = ParityMembers(draw(st.sampled_from(MODELS)), draw(st.sampled_from(["add", "concat"])),
                                draw(member_lists(tag.k)))
    return Batch(batch_id=draw(st.integers(0, 2**63 - 1)), model=draw(st.sampled_from(MODELS)),
                 qids=draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n)),
                 reply_to=draw(st.lists(st.sampled_from(REPLY_TO), min_size=n, max_size=n)),
                 inputs=draw(arrays(n)), role=draw(st.sampled_from([ModelRole.DEPLOYED, ModelRole.PARITY])), group=tag,
                 budgets_ms=draw(st.one_of(st.none(), st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n))),
                 members=members)


@st.composite
def hostile_predictions(draw) -> Predictions:
    n = draw(st.integers(0, 4))
    tag = draw(st.one_of(st.none(), tags()))
    role = draw(st.sampled_from([ModelRole.DEPLOYED, ModelRole.PARITY]))
    members = None
    if tag is not None and draw(st.booleans()):
        members = ParityMembers(draw(st.sampled_from(MODELS)), draw(st.sampled_from(["add", "concat"])),
                                draw(member_lists(tag.k)))
    outputs = draw(st.one_of(st.none(), arrays(n)))
    return Predictions(batch_id=draw(st.integers(0, 2**63 - 1)), model=draw(st.sampled_from(MODELS)),
                       qids=draw(st.one_of(st.lists(st.integers(0, 8), min_size=n, max_size=n),
                                           st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n))),
                       outputs=outputs, role=role, group=tag, members=members,
                       reply_to=draw(st.one_of(st.none(), st.lists(st.sampled_from(REPLY_TO), min_size=n, max_size=n))),
                       budgets_ms=draw(st.one_of(st.none(), st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n))),
                       error=draw(st.one_of(st.none(), st.text(max_size=5))))


def _other_kinds():
    z = np.zeros((1, 2), np.float32)
    return st.sampled_from([
        protocol.Predict(request_id="r", model="m", input=z[0]), protocol.Reply(request_id="r", source="model"),
        protocol.Queries(model="m", qids=[1], budgets_ms=[5.0], reply_to="garbage", inputs=z),
        protocol.Register(worker="w", model="m"), protocol.Done(worker="w", batch_id=1, batch_size=1, service_ms=1.0),
        protocol.Heartbeat(sender="d", known=False), protocol.Status(), protocol.Leave(worker="w"),
        protocol.Configure(slots=1024, threads=256), protocol.Configure(), protocol.Answered(model="m", qids=[1, 2]),
    ])


garbage_frames = st.one_of(
    st.lists(st.binary(max_size=40), min_size=1, max_size=3),
    st.builds(lambda h, extra: [orjson.dumps(h)] + extra,
              st.dictionaries(st.sampled_from(["v", "kind", "group", "members", "qids", "tensors", "model", "reply_to"]),
                              st.one_of(st.integers(-2, 2**64 - 1), st.text(max_size=4), st.none(), st.booleans(),
                                        st.sampled_from(list(protocol.MESSAGES)),
                                        st.lists(st.integers(-1, 3), max_size=4)), max_size=6),
              st.lists(st.binary(max_size=16), max_size=2)),
)


def frames_of(msg) -> list[bytes]:
    return [bytes(f) for f in protocol.encode(msg)]


#: one example: a few hostile messages, each already a list of frames
hostile = st.lists(st.one_of(garbage_frames, hostile_batch().map(frames_of), hostile_predictions().map(frames_of),
                             _other_kinds().map(frames_of)), min_size=1, max_size=6)


# --------------------------------------------------------------------------- encoder and decoder


class Coding:
    """Live encoder and decoder; the test plays the dispatcher's parity PULL, the workers'
    PUSHes and the frontend PULL."""

    def __init__(self, run):
        self.ctx = zmq.Context()
        self.dispatcher = self.sock(zmq.PULL, bind=ANY)
        self.frontend = self.sock(zmq.PULL, bind=ANY)
        self.frontend_ep = transport.endpoint_of(self.frontend)
        self.enc_cfg = EncoderConfig(name="enc-fuzz", batch_endpoint=local_endpoint(), partial_group_ms=20.0,
                                     dispatcher_query_endpoint=transport.endpoint_of(self.dispatcher),
                                     parity_models={"m": "m-parity"}, status_endpoint=local_endpoint(), max_open_groups=32)
        self.dec_cfg = DecoderConfig(name="dec-fuzz", endpoint=local_endpoint(), status_endpoint=local_endpoint(),
                                     max_open_groups=64)
        self.run = run
        run.start(ServiceLaunch(self.enc_cfg.name, "encoder", "local", self.enc_cfg))
        run.start(ServiceLaunch(self.dec_cfg.name, "decoder", "local", self.dec_cfg))
        self.to_encoder = self.sock(zmq.PUSH, connect=self.enc_cfg.batch_endpoint)
        self.to_decoder = self.sock(zmq.PUSH, connect=self.dec_cfg.endpoint)
        run.wait_status(self.enc_cfg.status_endpoint)
        run.wait_status(self.dec_cfg.status_endpoint)
        self.seq = itertools.count(1)

    def sock(self, kind, bind=None, connect=None):
        s = transport.make_socket(self.ctx, kind, bind=bind, connect=connect)
        return s

    def close(self):
        self.ctx.destroy(0)

    def group_id(self) -> int:
        # the largest epoch an IdSpace makes: no hostile id can make it stale
        return (((1 << ids.EPOCH_BITS) - 1) << 32) | (0xFFFFFFFF - next(self.seq))

    def check(self) -> None:
        self.run.check_alive()
        self._encoder_works()
        self._decoder_works()

    def _wait_for(self, sock, match, what: str):
        while sock.poll(5000):
            msg = protocol.decode(sock.recv_multipart())
            if match(msg):
                return msg
        raise AssertionError(f"{what}: nothing within 5 s")

    def _encoder_works(self):
        g = self.group_id()
        xs = [np.full((1, 4), i + 1.0, np.float32) for i in range(2)]
        for i, x in enumerate(xs):
            transport.send(self.to_encoder, Batch(batch_id=i + 1, model="m", qids=[10 + i], reply_to=[self.frontend_ep],
                                                  inputs=x, group=CodingTag(g, i, 2)))
        p = self._wait_for(self.dispatcher, lambda m: isinstance(m, Batch) and m.group is not None and m.group.group == g,
                           "encoder's parity batch")
        np.testing.assert_array_equal(p.inputs, xs[0] + xs[1])

    def _decoder_works(self):
        g = self.group_id()
        qid = next(self.seq) + 10**6
        out = np.arange(3, dtype=np.float32)[None]
        transport.send(self.to_decoder, Predictions(
            batch_id=1, model="m-parity", qids=[0], outputs=out, role=ModelRole.PARITY, group=CodingTag(g, 2, 2),
            members=ParityMembers("m", "add", [MemberBatch([qid], [self.frontend_ep]), None])))
        r = self._wait_for(self.frontend, lambda m: isinstance(m, Predictions) and m.qids == [qid], "decoder's reconstruction")
        assert r.source == Source.RECONSTRUCTION
        np.testing.assert_array_equal(r.outputs, out)


@pytest.fixture(scope="module")
def coding(module_launcher):
    c = Coding(module_launcher("coding-fuzz"))
    yield c
    c.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=hostile)
def test_encoder_and_decoder_survive_hostile_messages(coding, messages):
    for frames in messages:
        coding.to_encoder.send_multipart(frames)
        coding.to_decoder.send_multipart(frames)
    coding.check()


def test_fuzzed_services_report_what_they_refused(coding):
    coding.check()
    enc = transport.request_status(coding.enc_cfg.status_endpoint, 5.0)
    dec = transport.request_status(coding.dec_cfg.status_endpoint, 5.0)
    assert enc["groups_open"] <= coding.enc_cfg.max_open_groups and dec["groups_open"] <= coding.dec_cfg.max_open_groups
    assert enc["encoded"] >= 1 and dec["reconstructed"] >= 1
