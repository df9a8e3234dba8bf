"""The floor of Keel's request path: a bare pyzmq chain of Keel's hops, doing nothing but
forwarding, measured in the same run as Keel (``keel bench core``).

The chain has Keel's processes, socket kinds and message sizes::

    client --DEALER/ROUTER--> frontend --PUSH/PULL--> dispatcher --ROUTER/DEALER--> worker
       ^                        |  ^                                                 |
       +-------ROUTER/DEALER----+  +--------------------PUSH/PULL--------------------+

Each hop sends the frames Keel sends there for a one-query message -- the header of a
real ``Predict``, ``Queries``, ``Batch``, ``Predictions`` or ``Reply`` (encoded once, at
start, as templates) and the input or output tensor -- after two small routing frames
that stand in for what Keel keeps in memory: the client's identity (the frontend's
pending table) and an 8-byte tag the client matches its answer by (the request id). The
input tensor is forwarded as received (zero-copy); the worker answers with the template
output. Every process reads everything ready after each poll, as Keel's loops do, and
sends and reads through the same helpers (``transport.send_frames``, ``recv_nowait``).
Every hop is ZeroMQ ``ipc``, as Keel's are on one machine (``common.spec.ports``: the
benchmarks' clusters are, and their clients use the frontend's local endpoint).

What the floor leaves out, and Keel does: decoding and checking each message, admission,
de-duplication, deadlines, batching, the worker's ``Done`` to the dispatcher (credits),
the executor thread hand-off, metrics. The gap between Keel and the floor is their cost.

Example
-------
>>> with Floor(workers=2) as floor:                                    # doctest: +SKIP
...     client = FloorClient(floor.client_endpoint)
...     client.predict(np.zeros(64, np.float32)).latency_ms
"""
from __future__ import annotations

import itertools
import math
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import zmq

from keel.common import protocol
from keel.common.transport import recv_nowait, send_frames
from keel.common.waiting import wait_until
from keel.common.protocol import Batch, Done, Predict, Predictions, Queries, Reply

_TAG = struct.Struct("<Q")
POLL_MS = 1000
#: how long the chain's processes may take to start answering
READY_TIMEOUT_S = 60.0


def messages(shape: list[int], output_size: int) -> dict:
    """Keel's message on each hop for one query of ``shape`` float32, with ids, names and
    times of realistic length (and the worker's ``Done``, which leaves the path)."""
    x = np.zeros(shape, np.float32)
    out = np.zeros((1, output_size), np.float32)
    qid, now, endpoint = (1 << 52) + 123_456, time.time(), "tcp://127.0.0.1:45123"
    rid, client = "123456-0123abcd-100000", "123456-0123abcd"
    return {
        "predict": Predict(request_id=rid, model="m", input=x, timeout_ms=1000.0, client=client),
        "queries": Queries(model="m", qids=[qid], budgets_ms=[999.93], reply_to=endpoint, inputs=x[None], sent_at=now),
        "batch": Batch(batch_id=qid, model="m", qids=[qid], reply_to=[endpoint], inputs=x[None], budgets_ms=[999.81],
                       sent_at=now),
        "predictions": Predictions(batch_id=qid, model="m", qids=[qid], outputs=out, worker="m-0", service_ms=0.012,
                                   version="1"),
        "reply": Reply(request_id=rid, source="model", output=out[0], model="m", version="1"),
        "done": Done(worker="m-0", batch_id=qid, batch_size=1, service_ms=0.012, ok=True),
    }


def templates(shape: list[int], output_size: int) -> dict[str, bytes | np.ndarray]:
    """The header frames (and the output tensor) of Keel's messages on each hop
    (``messages``)."""
    msgs = messages(shape, output_size)
    del msgs["done"]  # not on the path the chain forwards
    heads: dict[str, bytes | np.ndarray] = {k: bytes(protocol.encode(m)[0]) for k, m in msgs.items()}
    heads["output"] = msgs["reply"].output
    return heads


# --------------------------------------------------------------------------- the processes


def _drain(sock: zmq.Socket):
    while True:
        try:
            yield recv_nowait(sock)
        except zmq.Again:
            return


def _frontend(client_ep: str, query_ep: str, prediction_ep: str, shape: list[int], output_size: int) -> None:
    heads = templates(shape, output_size)
    ctx = zmq.Context()
    router, pull, push = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for s in (router, pull, push):
        s.linger = 0
    router.bind(client_ep)
    pull.bind(prediction_ep)
    push.connect(query_ep)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(pull, zmq.POLLIN)
    queries, reply = heads["queries"], heads["reply"]
    while True:  # until SIGTERM
        ready = dict(poller.poll(POLL_MS))
        if router in ready:
            for ident, tag, _, x in _drain(router):  # Predict -> Queries
                send_frames(push, [ident, tag, queries, x])
        if pull in ready:
            for ident, tag, _, out in _drain(pull):  # Predictions -> Reply
                send_frames(router, [ident, tag, reply, out])


def _dispatcher(query_ep: str, worker_ep: str, shape: list[int], output_size: int) -> None:
    batch = templates(shape, output_size)["batch"]
    ctx = zmq.Context()
    pull, router = ctx.socket(zmq.PULL), ctx.socket(zmq.ROUTER)
    for s in (pull, router):
        s.linger = 0
    pull.bind(query_ep)
    router.bind(worker_ep)
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    poller.register(router, zmq.POLLIN)
    workers: list[bytes] = []
    turn = itertools.count()
    while True:  # until SIGTERM
        ready = dict(poller.poll(POLL_MS))
        if router in ready:
            for ident, *_ in _drain(router):  # a worker's hello (Keel: Register)
                workers.append(ident.bytes)
        if pull in ready and workers:
            for ident, tag, _, x in _drain(pull):  # Queries -> Batch, the workers in turn
                send_frames(router, [workers[next(turn) % len(workers)], ident, tag, batch, x])


def _worker(worker_ep: str, prediction_eps: str, name: str, shape: list[int], output_size: int) -> None:
    """``prediction_eps``: every frontend's, comma-separated; a query's answer goes to the
    frontend its tag names (``FloorClient``: the tag's top byte), as Keel's to its reply_to."""
    heads = templates(shape, output_size)
    predictions, output = heads["predictions"], heads["output"]
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    pushes = [ctx.socket(zmq.PUSH) for _ in prediction_eps.split(",")]
    for s in (dealer, *pushes):
        s.linger = 0
    dealer.identity = name.encode()
    dealer.connect(worker_ep)
    for push, ep in zip(pushes, prediction_eps.split(",")):  # frontend k's at index k
        push.connect(ep)
    dealer.send(b"hello")
    while True:  # until SIGTERM
        if not dealer.poll(POLL_MS):
            continue
        for ident, tag, _, _ in _drain(dealer):  # Batch -> Predictions
            send_frames(pushes[tag.bytes[-1]], [ident, tag, predictions, output])  # the tag's top byte: its frontend


def _gateway(http_port: str, client_ep: str, shape: list[int], output_size: int) -> None:
    """The gateway's floor: HTTP/1.1 on asyncio and httptools (as ``services.httpserver``, on
    the gateway's event loop) in front of the chain. Each request's body ends with the binary input tensor, forwarded as
    the floor's client sends it; each answer is written back as an OIP response with a
    template JSON head and the output tensor received (binary). No routing, no checks, no
    JSON decoding: what the gateway does past that is its cost."""
    import asyncio

    import httptools
    import orjson

    from keel.services import httpserver

    predict = templates(shape, output_size)["predict"]
    x_bytes = int(np.prod(shape)) * 4
    out_bytes = output_size * 4
    head = orjson.dumps({"model_name": "m", "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, output_size],
                                                         "parameters": {"binary_data_size": out_bytes}}]})
    response = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s"
                % (len(head), len(head) + out_bytes, head))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(client_ep)
    waiting: dict[int, asyncio.Transport] = {}
    tags = itertools.count(1)

    def answer() -> None:  # the descriptor is edge-triggered: read until nothing waits
        while sock.get(zmq.EVENTS) & zmq.POLLIN:
            for tag, _, out in _drain(sock):
                conn = waiting.pop(_TAG.unpack(tag.bytes)[0], None)
                if conn is not None and not conn.is_closing():
                    conn.write(response + out.bytes)

    class Connection(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport, self.parser, self.body = transport, httptools.HttpRequestParser(self), []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body, self.body = b"".join(self.body), []
            n = next(tags)
            waiting[n] = self.transport
            send_frames(sock, [_TAG.pack(n), predict, body[-x_bytes:]])
            answer()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(sock.get(zmq.FD), answer)
        await loop.create_server(Connection, "127.0.0.1", int(http_port), reuse_address=True)
        answer()
        await asyncio.Event().wait()  # until SIGTERM

    httpserver.run(serve())  # the gateway's event loop


class FloorGateway:
    """The gateway's floor (``_gateway``) in front of a running ``Floor``, on ``http_port``;
    ended (SIGTERM, by process id) on exit."""

    def __init__(self, floor: Floor, http_port: int):
        self.floor, self.http_port = floor, http_port
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> FloorGateway:
        shape = ",".join(map(str, self.floor.shape))
        self.proc = subprocess.Popen([sys.executable, "-m", "keel.bench.floor", "gateway", str(self.http_port),
                                      self.floor.client_endpoint, shape, str(self.floor.output_size)])
        if not wait_until(self._accepts, READY_TIMEOUT_S, interval_s=0.05) or self.proc.poll() is not None:
            self.__exit__()
            raise RuntimeError("the floor's gateway did not start")
        return self

    def _accepts(self) -> bool:
        """It takes a connection (or it has exited: no use waiting)."""
        try:
            socket.create_connection(("127.0.0.1", self.http_port), timeout=1.0).close()
            return True
        except OSError:
            return self.proc.poll() is not None

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            _end([self.proc])


class Floor:
    """The bare chain's processes (frontend, dispatcher, ``workers`` workers), started on
    loopback on entry and ended (SIGTERM, by process id) on exit."""

    def __init__(self, base_port: int, workers: int = 2, shape: list[int] | None = None, output_size: int = 10,
                 frontends: int = 1):
        self.shape, self.output_size = list(shape or [64]), output_size
        ep = lambda i: f"ipc://@keel-floor-{base_port + i}"  # noqa: E731
        # frontend 0: client ep(0), predictions ep(2); frontend k > 0: ep(2 + 2k), ep(3 + 2k)
        clients = [ep(0)] + [ep(2 + 2 * k) for k in range(1, frontends)]
        predictions = [ep(2)] + [ep(3 + 2 * k) for k in range(1, frontends)]
        self.client_endpoints, self.client_endpoint = clients, clients[0]
        self.roles = [["frontend", c, ep(1), p] for c, p in zip(clients, predictions)] + [["dispatcher", ep(1), ep(3)]]
        self.roles += [["worker", ep(3), ",".join(predictions), f"floor-w{i}"] for i in range(workers)]
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Floor:
        shape = ",".join(map(str, self.shape))
        for role in self.roles:
            self.procs.append(subprocess.Popen([sys.executable, "-m", "keel.bench.floor", *role, shape, str(self.output_size)]))
        try:  # ready when every frontend answers (the processes start in seconds on a loaded machine)
            with FloorClient(self.client_endpoints, self.shape, self.output_size) as client:
                for _ in self.client_endpoints:
                    client.predict("m", np.zeros(self.shape, np.float32), timeout_ms=READY_TIMEOUT_S * 1000)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        _end(self.procs)


def _end(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each (by process id), then SIGKILL what has not exited within 3 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=3.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=1.0)


def main(argv: list[str]) -> None:
    """``python -m keel.bench.floor ROLE ENDPOINTS... SHAPE OUTPUT_SIZE``: one process of the chain."""
    role, *rest = argv
    shape, output_size = [int(d) for d in rest[-2].split(",")], int(rest[-1])
    roles = {"frontend": _frontend, "dispatcher": _dispatcher, "worker": _worker, "gateway": _gateway}
    roles[role](*rest[:-2], shape, output_size)


if __name__ == "__main__":
    main(sys.argv[1:])


# --------------------------------------------------------------------------- the client


@dataclass(slots=True)
class FloorResult:
    """What ``open_loop`` and the latency loop read of an answer (a ``Result``'s shape)."""

    request_id: str
    latency_ms: float
    source: str = "model"
    error_code: str | None = None


class FloorClient:
    """Bare DEALERs with ``Client``'s ``predict``/``submit``/``collect`` shape, so Keel's
    load generator (``common.loadgen.open_loop``) drives the floor as it drives Keel. With
    several frontends' endpoints it sends to them in turn, the frontend's index in its tag's
    top byte (the worker answers to that frontend)."""

    def __init__(self, endpoints: str | list[str], shape: list[int] | None = None, output_size: int = 10):
        self.predict_head = templates(list(shape or [64]), output_size)["predict"]
        self.ctx = zmq.Context()
        self.socks, self.poller = [], zmq.Poller()
        for ep in [endpoints] if isinstance(endpoints, str) else endpoints:
            sock = self.ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(ep)
            self.poller.register(sock, zmq.POLLIN)
            self.socks.append(sock)
        self.sent: dict[int, float] = {}
        self.counter = itertools.count(1)

    def submit(self, model: str, x: np.ndarray, timeout_ms: float | None = None) -> str:
        n = next(self.counter)
        self.sent[n] = time.perf_counter()
        frontend = n % len(self.socks)
        send_frames(self.socks[frontend], [_TAG.pack(n | frontend << 56), self.predict_head, x])
        return str(n)

    def collect(self, timeout_ms: float = 0.0) -> list[FloorResult]:
        out: list[FloorResult] = []
        for sock, _ in self.poller.poll(math.ceil(timeout_ms)):  # as Client's: ZeroMQ counts whole ms
            for tag, _, _ in _drain(sock):
                n = _TAG.unpack(tag.bytes)[0] & ~(0xFF << 56)
                sent = self.sent.pop(n, None)
                if sent is not None:
                    out.append(FloorResult(str(n), (time.perf_counter() - sent) * 1000.0))
        return out

    def predict(self, model: str, x: np.ndarray, timeout_ms: float = 5000.0) -> FloorResult:
        """One request, waited for (one outstanding)."""
        rid = self.submit(model, x)
        deadline = time.perf_counter() + timeout_ms / 1000.0
        while time.perf_counter() < deadline:
            for result in self.collect(timeout_ms):
                if result.request_id == rid:
                    return result
        raise TimeoutError(f"the floor chain did not answer in {timeout_ms} ms")

    def __enter__(self) -> FloorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for sock in self.socks:
            sock.close(0)
        self.ctx.term()
