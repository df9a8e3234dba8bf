"""OpenTelemetry traces (``common.tracing``): a request sampled at the frontend is one
trace with a span at each hop it crossed (frontend, dispatcher, worker), each the child
of the one before, linked by its request id; a request that arrives with a W3C
``traceparent`` joins its caller's trace; a ``traceparent`` whose sampled flag is off is
not traced. The services run in this process, each ticked by a thread of its own, and
export to an in-memory exporter. Needs the ``otel`` extra."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (pip install 'keel[otel]') traces requests")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from keel.common import protocol, tracing  # noqa: E402
from keel.common.protocol import Predict, Reply  # noqa: E402
from keel.common.roles import ROLES  # noqa: E402
from keel.common.spec import load_spec  # noqa: E402
from keel.common.waiting import wait_until  # noqa: E402
from keel.deploy.local import free_port_block  # noqa: E402

pytestmark = pytest.mark.timeout(60)


NOOP = {"builtin": "noop", "input_shape": [4], "output_size": 2, "workers": 1}
#: ParM as deploy/examples/parm.toml: the sleep model is linear, its own parity model
PARM = {"builtin": "sleep", "input_shape": [4], "output_size": 2, "fixed_ms": 1.0, "fixed_batch": 1,
        "workers": 2, "k": 2, "mode": "parm", "encoder": "add"}

#: a HAMS graph of two stateless operators, a -> b
CHAIN = {"mode": "bare", "input_shape": [4], "edges": [["frontend", "a"], ["a", "b"], ["b", "frontend"]],
         "operators": {"a": {"kind": "mlp", "input_shape": [4], "output_shape": [3], "max_batch": 4},
                       "b": {"kind": "mlp", "input_shape": [3], "output_shape": [2], "max_batch": 4}}}


@pytest.fixture
def cluster(request, tmp_path):
    """The services of one model (``NOOP``, or the spec a test passes indirectly; "graph":
    ``CHAIN``), traced
    at rate 1; the last item is a set of service names to freeze (their thread stops
    ticking them)."""
    exporter = InMemorySpanExporter()
    tracing.configure(1.0, None)
    tracing.start("keel-test", exporter=exporter)
    spec = load_spec({"cluster": {"name": "traced", "base_port": free_port_block(), "run_dir": str(tmp_path)},
                      "frontend": {"cache_size": 0},  # every request reaches a worker
                      **({"graphs": {"chain": CHAIN}} if getattr(request, "param", None) == "graph"
                         else {"models": {"m": getattr(request, "param", NOOP)}})})
    services = [ROLES[s.role].build(s.config) for s in spec.services]
    stop = threading.Event()
    frozen: set[str] = set()

    def loop(svc):
        while not stop.is_set():
            if svc.name in frozen:
                stop.wait(0.01)
            else:
                svc.tick(0.01)

    threads = [threading.Thread(target=loop, args=(s,), daemon=True) for s in services]
    for t in threads:
        t.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(spec.local_client_endpoints[0])
    try:
        yield sock, exporter, services, frozen
    finally:
        sock.close(0)
        ctx.term()
        stop.set()
        for t in threads:
            t.join(5)
        for svc in services:
            svc.shutdown()
        tracing.stop()
        tracing.configure(None, None)


def ask(sock, request_id: str, traceparent: str | None = None) -> Reply:
    sock.send_multipart(protocol.encode(Predict(request_id=request_id, model="m", input=np.ones(4, np.float32),
                                                timeout_ms=5000, traceparent=traceparent)))
    assert sock.poll(10_000), "no reply"
    reply = protocol.decode(sock.recv_multipart())
    assert isinstance(reply, Reply) and reply.error is None, reply
    return reply


def spans_of(exporter, request_id: str, n: int) -> list:
    """The spans of the trace whose request span names ``request_id``, once ``n`` are in."""
    def find():
        spans = exporter.get_finished_spans()
        root = [s for s in spans if s.attributes.get("keel.request_id") == request_id]
        if not root:
            return None
        trace = [s for s in spans if s.context.trace_id == root[0].context.trace_id]
        return trace if len(trace) >= n else None

    found = wait_until(find, 10.0)
    assert found, [(s.name, dict(s.attributes)) for s in exporter.get_finished_spans()]
    return found


def test_a_sampled_request_is_one_trace_with_a_span_at_each_hop(cluster):
    sock, exporter, *_ = cluster
    ask(sock, "r1")
    spans = {s.name: s for s in spans_of(exporter, "r1", 3)}
    assert set(spans) == {"keel.request", "keel.dispatcher", "keel.worker"}
    request, dispatcher, worker = spans["keel.request"], spans["keel.dispatcher"], spans["keel.worker"]
    assert request.parent is None  # no caller's context: the frontend started the trace
    assert dispatcher.parent.span_id == request.context.span_id  # each hop the child of the one before
    assert worker.parent.span_id == dispatcher.context.span_id
    assert request.attributes["keel.model"] == "m" and request.attributes["keel.source"] == "model"
    assert dispatcher.attributes["keel.qid"] == worker.attributes["keel.qid"] == request.attributes["keel.qid"]
    assert dispatcher.attributes["keel.service"] == "dispatcher" and worker.attributes["keel.service"] == "worker-m-0"
    # in order on the wall clock: the worker's compute inside the request's time
    assert request.start_time <= dispatcher.start_time <= worker.start_time <= worker.end_time <= request.end_time


def test_a_callers_traceparent_is_joined_and_an_unsampled_one_is_not_traced(cluster):
    sock, exporter, *_ = cluster
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    ask(sock, "joined", f"00-{trace_id}-{parent}-01")
    spans = spans_of(exporter, "joined", 3)
    request = next(s for s in spans if s.name == "keel.request")
    assert f"{request.context.trace_id:032x}" == trace_id and f"{request.parent.span_id:016x}" == parent
    ask(sock, "not-sampled", f"00-{'1' * 32}-{'2' * 16}-00")
    ask(sock, "after", None)  # sampled: its spans are in once this one's are
    spans_of(exporter, "after", 3)
    assert not [s for s in exporter.get_finished_spans() if s.attributes.get("keel.request_id") == "not-sampled"]
    assert not [s for s in exporter.get_finished_spans() if s.context.trace_id == int("1" * 32, 16)]


def test_tracing_off_adds_nothing_to_a_request():
    assert tracing.ON is False  # another test's cluster turned it off again
    msg = Predict(request_id="x", model="m", input=np.zeros(4, np.float32))
    assert msg.traceparent is None and protocol.decode(protocol.encode(msg)).traceparent is None


def test_the_client_passes_a_traceparent(cluster):
    from keel.common.client import Client

    _, exporter, services, _ = cluster
    frontend = next(s for s in services if s.role == "frontend")
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"
    with Client([frontend.cfg.local_client_endpoint or frontend.cfg.client_endpoint], timeout_ms=5000) as client:
        result = client.predict("m", np.full(4, 2.0, np.float32), request_id="by-client",
                                traceparent=f"00-{trace_id}-00f067aa0ba902b7-01")
        assert result.error is None
        with pytest.raises(ValueError, match="not a W3C trace context"):
            client.predict("m", np.ones(4, np.float32), traceparent="00-nope")
    request = next(s for s in spans_of(exporter, "by-client", 3) if s.name == "keel.request")
    assert f"{request.context.trace_id:032x}" == trace_id


@pytest.mark.parametrize("cluster", [PARM], indirect=True)
def test_a_reconstructed_request_is_one_trace_with_its_encoder_and_decoder_spans(cluster):
    sock, exporter, services, frozen = cluster
    dispatcher = next(s for s in services if s.role == "dispatcher")
    assert wait_until(lambda: len(dispatcher.workers) == 3, 10.0), dispatcher.status()  # 2 deployed, 1 parity
    frozen.add("worker-m-0")  # as SIGSTOP: it holds what it is sent and never answers
    wanted = {"keel.request", "keel.dispatcher", "keel.encoder", "keel.decoder"}

    def full_trace(request_id: str) -> dict | None:
        """Its trace's spans by name once the four hops are in (a batch carries one traced
        query, so the encoder's and decoder's spans join one of a group's traces)."""
        def find():
            spans = exporter.get_finished_spans()
            root = [s for s in spans if s.attributes.get("keel.request_id") == request_id]
            named = root and {s.name: s for s in spans if s.context.trace_id == root[0].context.trace_id}
            return named if named and wanted <= set(named) else None
        return wait_until(find, 2.0)

    spans = None
    for round_ in range(20):  # rounds until a reconstruction whose trace carries the encoder and decoder
        reconstructed = []
        for i in range(4):  # apart, so each is a batch of its own and the one its batch's trace follows
            sock.send_multipart(protocol.encode(Predict(request_id=f"r{round_}-{i}", model="m",
                                                        input=np.full(4, float(i), np.float32), timeout_ms=5000)))
            time.sleep(0.02)
        for _ in range(4):
            assert sock.poll(10_000), "no reply"
            reply = protocol.decode(sock.recv_multipart())
            assert isinstance(reply, Reply) and reply.error is None, reply
            if reply.source == protocol.Source.RECONSTRUCTION:
                reconstructed.append(reply.request_id)
        spans = next((found for rid in reconstructed if (found := full_trace(rid))), None)
        if spans:
            break
    assert spans, [(s.name, dict(s.attributes)) for s in exporter.get_finished_spans()][-12:]
    request, dispatcher_, encoder, decoder = (spans[n] for n in ("keel.request", "keel.dispatcher", "keel.encoder", "keel.decoder"))
    assert request.attributes["keel.source"] == "reconstruction"
    assert dispatcher_.parent.span_id == request.context.span_id  # the hops' chain: dispatcher, encoder, decoder
    assert encoder.parent.span_id == dispatcher_.context.span_id
    assert decoder.parent.span_id == encoder.context.span_id
    qid = request.attributes["keel.qid"]
    assert encoder.attributes["keel.qid"] == decoder.attributes["keel.qid"] == qid
    assert encoder.attributes["keel.group"] == decoder.attributes["keel.group"]
    assert encoder.attributes["keel.service"] == "encoder" and decoder.attributes["keel.service"] == "decoder"
    assert decoder.end_time <= request.end_time  # the reconstruction answered it


@pytest.mark.parametrize("cluster", ["graph"], indirect=True)
def test_a_sampled_graph_request_has_a_span_at_each_operator(cluster):
    sock, exporter, *_ = cluster
    reply = None
    for attempt in range(50):  # until the operators are up: the frontend answers an error before
        sock.send_multipart(protocol.encode(Predict(request_id=f"g{attempt}", model="chain",
                                                    input=np.ones(4, np.float32), timeout_ms=2000)))
        assert sock.poll(10_000), "no reply"
        reply = protocol.decode(sock.recv_multipart())
        if reply.error is None:
            break
        time.sleep(0.1)
    assert isinstance(reply, Reply) and reply.error is None, reply
    spans = spans_of(exporter, reply.request_id, 3)
    request = next(s for s in spans if s.name == "keel.request")
    assert request.attributes["keel.source"] == "model" and request.attributes["keel.graph"] == "chain"
    ops = {s.attributes["keel.operator"]: s for s in spans if s.name == "keel.operator"}
    assert set(ops) == {"a", "b"}, [(s.name, dict(s.attributes)) for s in spans]
    assert ops["a"].parent.span_id == request.context.span_id  # the graph's path: frontend, a, b
    assert ops["b"].parent.span_id == ops["a"].context.span_id
    origin = request.attributes["keel.origin"]
    assert ops["a"].attributes["keel.origin"] == ops["b"].attributes["keel.origin"] == origin
    assert request.start_time <= ops["a"].start_time <= ops["b"].end_time <= request.end_time
