"""HTTP gateway: the Open Inference Protocol v2 (KServe / Triton REST) onto Keel's client path.

The gateway is an aiohttp server in one asyncio loop with one ``AsyncClient`` to the
frontends, so an HTTP request becomes Keel queries with their deadlines and request ids,
and every Keel reply comes back to the caller. Routes (OIP v2)::

    GET  /v2/health/live                        200 while the process runs
    GET  /v2/health/ready                       200 once a frontend answers a Status, else 503
    GET  /v2                                    server metadata (name, version, extensions)
    GET  /v2/models/{m}[/versions/{v}]          model metadata: one input, one output
    GET  /v2/models/{m}[/versions/{v}]/ready    200 when the server is ready and knows m
    POST /v2/models/{m}[/versions/{v}]/infer    inference

A model has one input tensor ``input`` of shape ``[-1, *input_shape]`` and one output
``output`` of shape ``[-1, output_size]`` (FP32): each row of the input is one Keel query
(its request id ``{id}.{n}-{row}`` when the request has an ``id``, n counting requests), all rows in flight at once.
Tensors come as JSON (``data``, row-major) or with the binary-data extension (the
``Inference-Header-Content-Length`` header; each input's ``binary_data_size``); outputs are
binary when asked (``binary_data`` on the output or ``binary_data_output`` on the request).

The deadline of each query is the request's ``timeout`` parameter (microseconds, as
tritonclient sends it) or ``timeout_ms``; without one, the model's own deadline. The
response's ``parameters`` say where each row's answer came from (``keel_sources``:
model, cache, default, reconstruction) and which version answered (``keel_versions``).

Errors are ``{"error": "..."}`` with the status of what went wrong: 400 bad input, 404
unknown model or version, 503 overloaded, 504 deadline or no frontend answered, 500 a
model error. The status endpoint (a zmq ROUTER) answers ``Status`` like every service;
``keel_http_requests_total{code}`` and ``keel_http_request_seconds`` go to Prometheus.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import numpy as np
import orjson
import zmq
import zmq.asyncio
from aiohttp import web

from keel.common import curve, logs, protocol, transport
from keel.common.client import AsyncClient
from keel.common.config import GatewayConfig, ModelInfo
from keel.common.metrics import Metrics
from keel.common.protocol import ErrorCode

VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data"]
HEADER_LENGTH = "Inference-Header-Content-Length"

#: OIP datatype <-> numpy dtype
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64"}
OIP_OF = {v: k for k, v in DATATYPES.items()}

#: Keel error code -> HTTP status
STATUS_OF = {ErrorCode.BAD_REQUEST: 400, ErrorCode.UNKNOWN_MODEL: 404, ErrorCode.OVERLOADED: 503,
             ErrorCode.DEADLINE: 504, ErrorCode.TIMEOUT: 504, ErrorCode.MODEL_ERROR: 500, ErrorCode.INTERNAL: 500}


class InferError(Exception):
    """A request the gateway answers with an OIP error: ``status`` and a message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def error_response(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"error": message}), content_type="application/json")


def split_body(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    """(the JSON header, the binary part) of an OIP request or response body."""
    if header_length is None:
        json_part, binary = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise InferError(400, f"{HEADER_LENGTH} {header_length!r} is not an integer") from None
        if not 0 <= n <= len(body):
            raise InferError(400, f"{HEADER_LENGTH} {n} is outside the body's {len(body)} bytes")
        json_part, binary = body[:n], body[n:]
    try:
        header = orjson.loads(json_part)
    except orjson.JSONDecodeError as exc:
        raise InferError(400, f"the request is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise InferError(400, "the request must be a JSON object")
    return header, binary


def read_input(header: dict, binary: bytes, info: ModelInfo) -> np.ndarray:
    """The one input tensor of a request as (rows, *input_shape) of the model's dtype."""
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InferError(400, f"a Keel model takes exactly one input tensor, got {0 if not isinstance(inputs, list) else len(inputs)}")
    tensor = inputs[0]
    name, shape, datatype = tensor.get("name", "input"), tensor.get("shape"), tensor.get("datatype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InferError(400, f"input {name!r}: shape must be a list of sizes >= 0, got {shape!r}")
    if datatype not in DATATYPES:
        raise InferError(400, f"input {name!r}: datatype {datatype!r} is not one of {sorted(DATATYPES)}")
    count = int(np.prod(shape))
    params = tensor.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        if type(size) is not int or size != len(binary):
            raise InferError(400, f"input {name!r}: binary_data_size {size!r} but {len(binary)} binary bytes came")
        itemsize = np.dtype(DATATYPES[datatype]).itemsize
        if size != count * itemsize:
            raise InferError(400, f"input {name!r}: {size} bytes do not hold shape {shape} of {datatype}")
        x = np.frombuffer(binary, DATATYPES[datatype]).reshape(shape)
    else:
        data = tensor.get("data")
        if data is None:
            raise InferError(400, f"input {name!r} has neither data nor binary_data_size")
        try:
            x = np.asarray(data, DATATYPES[datatype])
        except (TypeError, ValueError) as exc:
            raise InferError(400, f"input {name!r}: data is not {datatype}: {exc}") from None
        if x.size != count:
            raise InferError(400, f"input {name!r}: {x.size} values do not fill shape {shape}")
        x = x.reshape(shape)
    want = list(info.input_shape)
    if list(x.shape[1:]) != want:
        raise InferError(400, f"input {name!r}: shape {shape} is not [-1, {', '.join(map(str, want))}] "
                              f"(rows of the model's input shape {want})")
    if OIP_OF.get(info.input_dtype) != datatype:
        wanted = OIP_OF.get(info.input_dtype, info.input_dtype)
        if not np.can_cast(x.dtype, info.input_dtype, "same_kind"):
            raise InferError(400, f"input {name!r}: datatype {datatype} cannot be taken as the model's {wanted}")
        x = x.astype(info.input_dtype)
    return x


def deadline_ms(header: dict) -> float | None:
    """The request's deadline (ms): ``timeout`` (us, tritonclient) or ``timeout_ms``."""
    params = header.get("parameters") or {}
    if not isinstance(params, dict):
        raise InferError(400, "parameters must be a JSON object")
    for key, scale in (("timeout_ms", 1.0), ("timeout", 1e-3)):
        value = params.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
                raise InferError(400, f"parameters.{key} must be a number > 0, got {value!r}")
            return float(value) * scale
    return None


def wants_binary(header: dict) -> bool:
    params = header.get("parameters") or {}
    if params.get("binary_data_output"):
        return True
    outputs = header.get("outputs") or []
    return any(isinstance(o, dict) and (o.get("parameters") or {}).get("binary_data") for o in outputs)


class Gateway:
    """The OIP v2 HTTP server of a cluster (see the module docstring)."""

    role = "gateway"

    def __init__(self, cfg: GatewayConfig):
        self.cfg = cfg
        self.name = cfg.name
        self.log = logs.setup(cfg.name)
        self.models = cfg.models
        self.client: AsyncClient | None = None
        self.counts = {"requests": 0, "queries": 0, "errors": 0}
        self.runner: web.AppRunner | None = None
        self.port: int | None = None
        self.stopping: asyncio.Event | None = None
        self.metrics = Metrics(cfg.name)
        self.m_requests = self.metrics.counter("http_requests_total", "infer requests answered, by HTTP status", ["code"])
        self.m_latency = self.metrics.histogram("http_request_seconds", "infer latency at the gateway")

    # ------------------------------------------------------------------ app

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        r = app.router
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(prefix, self.model_metadata)
            r.add_get(prefix + "/ready", self.model_ready)
            r.add_post(prefix + "/infer", self.infer)
        return app

    async def start(self) -> None:
        """Bind the HTTP port and connect to the frontends (in the running loop)."""
        self.client = AsyncClient(self.cfg.frontend_endpoints, timeout_ms=self.cfg.timeout_ms,
                                  retries=self.cfg.retries)
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.cfg.http_host, self.cfg.http_port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # the bound port (http_port 0: any)
        self.log.info("started", role=self.role, pid=os.getpid(), http=f"http://{self.cfg.http_host}:{self.port}")

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.client is not None:
            await self.client.close()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        self.metrics.serve(self.cfg.metrics_port)
        await self.start()
        status = asyncio.ensure_future(self._serve_status()) if self.cfg.status_endpoint else None
        try:
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
                    transport.try_send_frames(sock, envelope + frames)
        finally:
            sock.close(0)
            curve.stop(ctx)
            ctx.term()

    def status(self) -> dict:
        return {"service": self.name, "role": self.role, "http_port": self.port, **self.counts}

    # ------------------------------------------------------------------ health and metadata

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _frontend_answers(self) -> bool:
        loop = asyncio.get_running_loop()
        for endpoint in self.cfg.frontend_endpoints:
            if await loop.run_in_executor(None, transport.request_status, endpoint, 0.5) is not None:
                return True
        return False

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if await self._frontend_answers() else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "keel", "version": VERSION, "extensions": EXTENSIONS}, dumps=_dumps)

    def _model(self, request: web.Request) -> tuple[str, ModelInfo]:
        name = request.match_info["model"]
        info = self.models.get(name)
        if info is None:
            raise InferError(404, f"unknown model {name!r}; models: {sorted(self.models)}")
        version = request.match_info.get("version")
        if version not in (None, "", info.version):
            raise InferError(404, f"model {name!r} serves version {info.version}, not {version!r}")
        return name, info

    async def model_metadata(self, request: web.Request) -> web.Response:
        try:
            name, info = self._model(request)
        except InferError as exc:
            return error_response(exc.status, str(exc))
        return web.json_response({
            "name": name, "versions": [info.version], "platform": "keel",
            "inputs": [{"name": "input", "datatype": OIP_OF.get(info.input_dtype, info.input_dtype),
                        "shape": [-1, *info.input_shape]}],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, info.output_size]}],
        }, dumps=_dumps)

    async def model_ready(self, request: web.Request) -> web.Response:
        try:
            self._model(request)
        except InferError as exc:
            return error_response(exc.status, str(exc))
        return web.Response(status=200 if await self._frontend_answers() else 503)

    # ------------------------------------------------------------------ infer

    async def infer(self, request: web.Request) -> web.Response:
        self.counts["requests"] += 1
        start = time.perf_counter()
        try:
            response = await self._infer(request)
        except InferError as exc:
            self.counts["errors"] += 1
            response = error_response(exc.status, str(exc))
        self.m_requests.labels(code=str(response.status)).inc()
        self.m_latency.observe(time.perf_counter() - start)
        return response

    async def _infer(self, request: web.Request) -> web.Response:
        name, info = self._model(request)
        header, binary = split_body(await request.read(), request.headers.get(HEADER_LENGTH))
        x = read_input(header, binary, info)
        timeout = deadline_ms(header) or info.deadline_ms
        rid = header.get("id")
        if rid is not None and (not isinstance(rid, str) or not rid or len(rid) > 200):
            raise InferError(400, "id must be a non-empty string of at most 200 characters")
        assert self.client is not None
        self.counts["queries"] += len(x)
        # HTTP callers pick ids freely (two may both send "1"), so a Keel id is the caller's
        # id made unique by this request's number: traceable in the frontends' logs, never
        # taken for a retry of another caller's query
        tag = f"{rid}.{self.counts['requests']}" if rid else None
        calls = [self.client.predict(name, row, timeout_ms=timeout, request_id=f"{tag}-{i}" if tag else None)
                 for i, row in enumerate(x)]
        results = [await calls[0]] if len(calls) == 1 else await asyncio.gather(*calls)  # one row: no task
        failed = next((r for r in results if r.output is None), None)
        if failed is not None:
            code = failed.error_code or ErrorCode.INTERNAL
            where = f" (row {results.index(failed)})" if len(results) > 1 else ""
            raise InferError(STATUS_OF.get(code, 500), f"{code}{where}: {failed.error or failed.source}")
        out = np.stack([np.asarray(r.output, np.float32) for r in results]) if results else \
            np.zeros((0, info.output_size), np.float32)
        body: dict[str, Any] = {
            "model_name": name, "model_version": results[0].version if results else info.version,
            "parameters": {"keel_sources": [str(r.source) for r in results],
                           "keel_versions": [r.version for r in results],
                           "keel_latency_ms": max((r.latency_ms for r in results), default=0.0)},
        }
        if rid is not None:
            body["id"] = rid
        output: dict[str, Any] = {"name": "output", "datatype": "FP32", "shape": list(out.shape)}
        body["outputs"] = [output]
        if not wants_binary(header):
            output["data"] = out.reshape(-1).tolist()
            return web.Response(body=_dumps(body), content_type="application/json")
        raw = out.tobytes()
        output["parameters"] = {"binary_data_size": len(raw)}
        head = _dumps(body).encode()
        return web.Response(body=head + raw, content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(len(head))})


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode()

