"""HTTP gateway: the Open Inference Protocol v2 (KServe / Triton REST) onto Keel's client path.

The gateway is an HTTP/1.1 server (``services.httpserver``: asyncio and httptools) in one
asyncio loop with one ``AsyncClient`` to the frontends. It decodes HTTP (JSON or binary
tensors, parameters) and encodes answers; the rest -- which targets the frontends serve,
versions, input rules, one Keel query per row, errors -- is ``services.inference.Inference``,
which the gRPC gateway shares. Routes (OIP v2; docs/guide/http.md), ``{m}`` any target the
frontends serve (a model, an application, a graph)::

    GET  /v2/health/live                        200 while the process runs
    GET  /v2/health/ready                       200 once a frontend answers a Status, else 503
    GET  /v2                                    server metadata (name, version, extensions)
    GET  /v2/models/{m}[/versions/{v}]          metadata: versions served now, inputs and outputs, kind and key
    GET  /v2/models/{m}[/versions/{v}]/config   Triton's model configuration (what perf_analyzer reads)
    GET  /v2/models[/{m}[/versions/{v}]]/stats  Triton's model statistics, as the gateway sees them
    GET  /v2/models/{m}[/versions/{v}]/ready    200 when a frontend answers and m (version v) is served
    POST /v2/models/{m}[/versions/{v}]/infer    inference

A one-tensor target (``oip.tensors.is_single``: builtins, ``--input-shape`` models,
applications, graphs) has one input tensor ``input`` of shape ``[-1, *input_shape]`` and one
output ``output`` of shape ``[-1, output_size]`` (FP32), as before signatures; a model with
a signature takes every input by name and answers every output by name, any datatype
(BYTES length-prefixed when binary), the ones ``outputs`` asks for (``oip.rest``,
``oip.tensors``). Either way each row of the inputs is one Keel query
(its request id ``{id}.{n}-{row}`` when the request has an ``id``, n counting requests), all
rows in flight at once. Tensors come as JSON (``data``, row-major) or with the binary-data
extension (the ``Inference-Header-Content-Length`` header; each input's
``binary_data_size``); outputs are binary when asked (``binary_data`` on the output or
``binary_data_output`` on the request). The request parameter ``key`` is the call's key (an
application's selection context, a graph's stream); a plain model refuses one.

Versions are the ones the model's workers serve now, as the frontends know them (a
``keel model rollout`` moves them): never the spec's version at start. A request pinned to
a version (``/versions/{v}/``) sends it in each query and is answered by that version or
refused: 404 when it is not served, 409 when a rollout raced the request and another
version computed it.

The deadline of each query is the request's ``timeout`` parameter (microseconds, as
tritonclient sends it) or ``timeout_ms``; without one, the model's own deadline. The
response's ``parameters`` say where each row's answer came from (``keel_sources``:
model, cache, default, reconstruction, ensemble, ...), which version answered
(``keel_versions``) and, for an application, which models answered and how many agree
(``keel_models``, ``keel_confidence``).

Every refusal is ``{"error": "..."}`` (JSON) with a 4xx status: 400 bad input, 401 no or
unknown bearer token, 404 unknown target, version or path, 405 wrong method, 409 another
version answered, 413 body too large; and the server's own: 503 overloaded or no frontend
answered, 504 deadline, 500 a model's error. TLS (``tls_cert``, ``tls_key``) and a bearer
token allow-list (``tokens_file``, read again when it changes) are off by default. The
status endpoint (a zmq ROUTER) answers ``Status`` like every service (``cancelled``: infer
requests whose client hung up before the answer; their Keel calls were cancelled, so the
frontends dropped their work);
``keel_http_requests_total{code}`` and ``keel_http_request_seconds`` go to Prometheus.
"""
from __future__ import annotations

import asyncio
import hmac
import os
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import orjson
import zmq
import zmq.asyncio

from keel.common import curve, inputs, logs, protocol, transport
from keel.common.async_client import AsyncClient
from keel.common.config import GatewayConfig
from keel.common.inputs import OIP_OF
from keel.common.metrics import Metrics
from keel.services import httpserver
from keel.services.httpserver import HTTPError, HTTPServer, Request, Response, Router
from keel.services.inference import Inference, InferError, call_parameters
from keel.services.oip import rest, tensors
from keel.services.oip.rest import HEADER_LENGTH, HEADER_LENGTH_KEY, _object, read_input, split_body, wants_binary

VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "model_configuration"]

#: paths a load balancer probes without a token
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")

__all__ = ["Gateway", "GatewayError", "InferError"]  # InferError lives in services.inference


class GatewayError(Exception):
    """The gateway cannot start as configured: a TLS or tokens file is missing or unsafe."""


def error_response(status: int, message: str, headers: dict | None = None) -> Response:
    return Response(status, orjson.dumps({"error": message}), "application/json", headers)


def json_response(obj: Any) -> Response:
    return Response(200, _dumps(obj), "application/json")


class Tokens:
    """The bearer-token allow-list: one token a line of ``path`` (blank and ``#`` lines
    ignored), read again when the file changes, so a token removed there is refused at
    once. Like a CURVE secret, a file others may read is refused."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.stamp: tuple | None = None
        self.tokens: list[bytes] = []
        self.read()

    def read(self) -> None:
        """Load the tokens when the file changed; raises ``GatewayError`` when it is unsafe."""
        try:
            st = self.path.stat()
        except OSError as exc:
            raise GatewayError(f"tokens_file {self.path}: {exc.strerror or exc}") from None
        if st.st_mode & 0o077:
            raise GatewayError(f"tokens_file {self.path} is readable by others (mode {st.st_mode & 0o777:o}); chmod 600 it")
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self.stamp:
            lines = self.path.read_text().splitlines()
            self.tokens = [t.strip().encode() for t in lines if t.strip() and not t.lstrip().startswith("#")]
            self.stamp = stamp

    def refuse(self, authorization: str | None) -> str | None:
        """Why a request with this ``Authorization`` header may not pass; None: it may."""
        try:
            self.read()
        except GatewayError as exc:  # gone or opened up since start: let nobody in
            return f"the gateway's token list cannot be used: {exc}"
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "this gateway wants an Authorization: Bearer <token> header"
        given = token.strip().encode()
        allowed = False
        for known in self.tokens:  # every one compared, in constant time: no timing says how close a guess was
            allowed |= hmac.compare_digest(known, given)
        return None if allowed else "the bearer token is not on this gateway's allow-list"


class Gateway:
    """The OIP v2 HTTP server of a cluster (see the module docstring)."""

    role = "gateway"

    def __init__(self, cfg: GatewayConfig):
        self.cfg = cfg
        self.name = cfg.name
        self.log = logs.setup(cfg.name)
        self.client: AsyncClient | None = None
        self.inference: Inference | None = None
        self.tokens: Tokens | None = None
        # the queries are Inference's count (status() reports it): one for every transport
        self.counts = {"requests": 0, "errors": 0, "unauthorized": 0, "cancelled": 0}
        self.routes = self.router()
        self.server: HTTPServer | None = None
        self.port: int | None = None
        self.grpc: Any = None  # the gRPC server (services.gateway_grpc.GrpcServer) when grpc_port is set
        self.grpc_port: int | None = None
        self.stopping: asyncio.Event | None = None
        self.metrics = Metrics(cfg.name)
        self.m_requests = self.metrics.counter("http_requests_total", "infer requests answered, by HTTP status", ["code"])
        self.m_latency = self.metrics.histogram("http_request_seconds", "infer latency at the gateway")

    # ------------------------------------------------------------------ app

    def router(self) -> Router:
        r = Router()
        r.add("GET", "/v2/health/live", self.live)
        r.add("GET", "/v2/health/ready", self.ready)
        r.add("GET", "/v2", self.server_metadata)
        r.add("GET", "/v2/models/stats", self.statistics)  # before /v2/models/{model}: first match wins
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add("GET", prefix, self.model_metadata)
            r.add("GET", prefix + "/ready", self.model_ready)
            r.add("GET", prefix + "/config", self.model_config)
            r.add("GET", prefix + "/stats", self.statistics)
            r.add("POST", prefix + "/infer", self.infer)
        return r

    async def handle(self, request: Request) -> Response:
        """The bearer token first (when the gateway has a list), then the route's handler;
        every refusal, the router's own included (no such path, wrong method), and a failure
        of the gateway itself come back as the protocol's JSON error."""
        if self.tokens is not None and request.path not in OPEN_PATHS:
            why = self.tokens.refuse(request.headers.get("authorization"))
            if why is not None:
                self.counts["unauthorized"] += 1
                return error_response(401, why, {"WWW-Authenticate": 'Bearer realm="keel"'})
        try:
            handler, request.match_info = self.routes.resolve(request.method, request.path)
            return await handler(request)
        except Exception as exc:  # every failure becomes a JSON answer
            return self.refusal(request, exc)

    def refusal(self, request: Request, exc: Exception) -> Response:
        """The JSON error answering ``exc``."""
        if isinstance(exc, InferError):
            return error_response(exc.status, str(exc))
        if isinstance(exc, HTTPError):  # the router's: no such path, a method the path does not take
            return error_response(exc.status, exc.message, exc.headers)
        self.log.exception("request failed", path=request.path)
        return error_response(500, f"the gateway failed on this request: {type(exc).__name__} (see its log)")

    def tls_context(self) -> ssl.SSLContext | None:
        if self.cfg.tls_cert is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # TLS 1.2 or later
        try:
            context.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise GatewayError(f"tls_cert {self.cfg.tls_cert} / tls_key {self.cfg.tls_key}: {exc}") from None
        return context

    async def start(self) -> None:
        """Bind the HTTP port and connect to the frontends (in the running loop)."""
        tls = self.tls_context()
        self.tokens = Tokens(self.cfg.tokens_file) if self.cfg.tokens_file else None
        self.client = AsyncClient(self.cfg.frontend_endpoints, timeout_ms=self.cfg.timeout_ms,
                                  retries=self.cfg.retries)
        self.inference = Inference(self.cfg, self.client)
        self.server = HTTPServer(self.handle, error_response, max_body_bytes=self.cfg.max_body_bytes)
        self.port = await self.server.start(self.cfg.http_host, self.cfg.http_port, ssl=tls)  # http_port 0: any
        if self.cfg.grpc_port is not None:
            # imported only here: its protobuf package is tritonclient.grpc's, and one process holds one of them
            from keel.services.gateway_grpc import GrpcServer
            self.grpc = GrpcServer(self, VERSION)
            try:
                self.grpc_port = await self.grpc.start()
            except OSError as exc:  # a port in use, an unreadable TLS file: the gateway cannot start as configured
                raise GatewayError(f"grpc_port {self.cfg.grpc_port}: {exc}") from None
        scheme = "https" if tls else "http"
        self.log.info("started", role=self.role, pid=os.getpid(), http=f"{scheme}://{self.cfg.http_host}:{self.port}",
                      grpc=self.grpc_port, tokens=self.tokens is not None)

    async def close(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop()
        if self.server is not None:
            await self.server.close()
        if self.inference is not None:  # after the server: no request asks for targets any more
            await self.inference.close()
        if self.client is not None:
            await self.client.close()

    def run(self) -> None:
        try:
            httpserver.run(self._main())  # on uvloop's loop where it is installed
        except GatewayError as exc:
            self.log.error("cannot start", error=str(exc))
            raise SystemExit(2) from None

    async def _main(self) -> None:
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        self.metrics.serve(self.cfg.metrics_port)
        status = None
        try:
            await self.start()
            status = asyncio.ensure_future(self._serve_status()) if self.cfg.status_endpoint else None
            await self.stopping.wait()
        finally:
            if status is not None:
                status.cancel()
            await self.close()
            self.log.info("stopped")

    async def _serve_status(self) -> None:
        """Answer Status on a ROUTER like the other services (``keel status``, readiness)."""
        ctx = zmq.asyncio.Context()
        sock = transport.make_socket(ctx, zmq.ROUTER, bind=self.cfg.status_endpoint)
        try:
            while True:
                frames = await sock.recv_multipart(copy=False)
                envelope, body = protocol.split_envelope(frames)
                try:
                    msg = protocol.decode(body)
                except protocol.ProtocolError:
                    continue
                if isinstance(msg, protocol.Status):
                    frames = protocol.encode(protocol.Status(service=self.name, info=self.status()))
                    # an asyncio socket: its whole message at once (frame by frame, a refused
                    # envelope would not stop the frames after it); never blocks, a peer gone is dropped
                    sock.send_multipart(envelope + frames, zmq.NOBLOCK, copy=False)
        finally:
            sock.close(0)
            curve.stop(ctx)
            ctx.term()

    def status(self) -> dict:
        return {"service": self.name, "role": self.role, "http_port": self.port, "grpc_port": self.grpc_port,
                "tls": self.cfg.tls_cert is not None, "tokens": self.tokens is not None, **self.counts,
                "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],  # uvloop or asyncio
                "queries": self.inference.queries if self.inference is not None else 0}  # every transport's

    # ------------------------------------------------------------------ health, metadata, versions

    async def live(self, request: Request) -> Response:
        return Response(200)

    async def ready(self, request: Request) -> Response:
        if not await self.inference.statuses():
            raise InferError(503, "no frontend answered")
        return Response(200)

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": "keel", "version": VERSION, "extensions": EXTENSIONS})

    async def _target(self, request: Request, fresh: bool = False) -> tuple[str, dict, str | None]:
        """(name, target, the version the path pins or None): 404 unknown, 503 no frontend."""
        name = request.match_info["model"]
        pinned = request.match_info.get("version") or None
        if fresh:  # metadata and readiness say what is served now: a rollout shows at once
            await self.inference.targets(fresh=True)
        return name, await self.inference.target(name, pinned), pinned

    async def _infer_target(self, request: Request) -> tuple[str, dict, str | None]:
        name, pinned = request.match_info["model"], request.match_info.get("version") or None
        return name, await self.inference.target_or_spec(name, pinned), pinned

    async def model_metadata(self, request: Request) -> Response:
        name, target, _ = await self._target(request, fresh=True)
        signature = tensors.signature_of(target)
        if not tensors.is_single(signature):
            return json_response(tensors.metadata(name, target, signature))
        return json_response({
            "name": name, "versions": target["versions"], "platform": "keel",
            "inputs": [{"name": "input", "datatype": OIP_OF.get(target["input_dtype"], target["input_dtype"]),
                        "shape": [-1, *target["input_shape"]]}],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, target["output_size"]]}],
            "parameters": {"keel_kind": target["kind"], "keel_key": target["key"]},
        })

    async def model_config(self, request: Request) -> Response:
        name, target, _ = await self._target(request, fresh=True)
        return json_response(tensors.model_config(name, tensors.signature_of(target)))

    async def statistics(self, request: Request) -> Response:
        """Triton's model statistics (``oip.stats``): one target's, or every target's."""
        if "model" in request.match_info:
            name, _, pinned = await self._target(request, fresh=True)
            return json_response(self.inference.statistics.to_json([name], pinned))
        return json_response(self.inference.statistics.to_json(sorted(await self.inference.targets(fresh=True))))

    async def model_ready(self, request: Request) -> Response:
        await self._target(request, fresh=True)
        return Response(200)

    # ------------------------------------------------------------------ infer

    async def infer(self, request: Request) -> Response:
        self.counts["requests"] += 1
        start = time.perf_counter()
        try:
            response = await self._infer(request)
        except asyncio.CancelledError:  # the client hung up (or the call was cancelled): its Keel calls are cancelled
            self.counts["cancelled"] += 1
            self.log.info("cancelled: the connection closed before the answer", path=request.path)
            raise
        except Exception as exc:  # counted by status here, answered as the guard would
            response = self.refusal(request, exc)
            self.counts["errors"] += 1
        self.m_requests.labels(code=str(response.status)).inc()
        self.m_latency.observe(time.perf_counter() - start)
        return response

    async def _infer(self, request: Request) -> Response:
        name, target, pinned = await self._infer_target(request)
        header, binary = split_body(request.body, request.headers.get(HEADER_LENGTH_KEY))
        signature = tensors.signature_of(target)
        if not tensors.is_single(signature):
            return await self._infer_named(request, name, pinned, header, binary)
        x = read_input(header, binary, target)
        key, timeout = call_parameters(_object(header.get("parameters"), "parameters"))
        binary_output = wants_binary(header)
        rid = request_id(header)
        out, results = await self.inference.infer(name, x, key=key, version=pinned, timeout_ms=timeout, request_id=rid,
                                                  traceparent=request.headers.get("traceparent"))  # W3C trace context
        body = response_header(name, pinned, rid, results)
        output: dict[str, Any] = {"name": "output", "datatype": "FP32", "shape": list(out.shape)}
        body["outputs"] = [output]
        if not binary_output:
            output["data"] = out.reshape(-1).tolist()
            return json_response(body)
        raw = out.tobytes()
        output["parameters"] = {"binary_data_size": len(raw)}
        head = _dumps(body)
        return Response(200, head + raw, "application/octet-stream", {HEADER_LENGTH: str(len(head))})


    async def _infer_named(self, request: Request, name: str, pinned: str | None, header: dict,
                           binary: bytes) -> Response:
        """A target with a signature beyond one ``input``: every input by name, every
        datatype, the outputs asked for (``oip.rest``)."""
        try:
            inputs_ = rest.read_inputs(header, binary)
            names, binary_of = rest.read_outputs(header)
        except inputs.InputError as exc:
            raise InferError(400, str(exc)) from None
        key, timeout = call_parameters(_object(header.get("parameters"), "parameters"))
        rid = request_id(header)
        outs, results = await self.inference.infer_named(name, inputs_, outputs=names, key=key, version=pinned,
                                                         timeout_ms=timeout, request_id=rid,
                                                         traceparent=request.headers.get("traceparent"))
        body = response_header(name, pinned, rid, results)
        try:
            body["outputs"], raw = rest.write_outputs(outs, binary_of)
        except inputs.InputError as exc:
            raise InferError(400, str(exc)) from None
        if not raw and not any("parameters" in o for o in body["outputs"]):
            return json_response(body)
        head = _dumps(body)
        return Response(200, head + raw, "application/octet-stream", {HEADER_LENGTH: str(len(head))})

def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def request_id(header: dict) -> str | None:
    rid = header.get("id")
    if rid is not None and (not isinstance(rid, str) or not rid or len(rid) > 200):
        raise InferError(400, "id must be a non-empty string of at most 200 characters")
    return rid


def response_header(name: str, pinned: str | None, rid: str | None, results: list) -> dict[str, Any]:
    """An infer response's JSON header but its outputs: where each row's answer came from."""
    params: dict[str, Any] = {"keel_sources": [str(r.source) for r in results],
                              "keel_versions": [r.version for r in results],
                              "keel_latency_ms": max((r.latency_ms for r in results), default=0.0)}
    if any(r.models is not None for r in results):  # an application's: which models answered, how sure
        params["keel_models"] = [r.models for r in results]
        params["keel_confidence"] = [r.confidence for r in results]
    body: dict[str, Any] = {"model_name": name, "parameters": params}
    version = results[0].version if results else pinned
    if version is not None:
        body["model_version"] = version
    if rid is not None:
        body["id"] = rid
    return body
