"""gRPC gateway: the Open Inference Protocol v2's gRPC form beside the HTTP gateway.

KServe's ``inference.GRPCInferenceService`` (services/oip/grpc_predict_v2.proto; Triton
answers the same methods, so the unmodified ``tritonclient[grpc]`` calls it), served by
``grpc.aio`` in the HTTP gateway's own process and asyncio loop on ``grpc_port``
(``http_host``). Everything that is not the transport -- which targets the frontends serve,
their versions, validating an input, one Keel query per row -- is ``services.inference``'s,
shared with the HTTP gateway; this module only decodes and encodes messages::

    ServerLive                  live while the process runs
    ServerReady                 ready once a frontend answers
    ModelReady                  ready when the target (model, application, graph), or its version, is served
    ServerMetadata              name, version
    ModelMetadata               versions served now, every input and output by name (the signature's)
    ModelConfig                 Triton's model configuration (``oip.triton``; not in KServe's proto)
    ModelStatistics             Triton's model statistics, as the gateway sees them (``oip.stats``)
    ModelInfer                  inference

A one-tensor target has one input ``input`` of shape ``[-1, *input_shape]`` and one output
``output`` of shape ``[-1, output_size]`` (FP32); a model with a signature takes and answers
its tensors by name (``oip.tensors``), only the outputs the request names. Each row is
one Keel query. Inputs come raw (``raw_input_contents``, one buffer per input, as
tritonclient sends them; BYTES length-prefixed) or typed (the datatype's field of
``contents``; FP16 and BF16 only raw); outputs come back the same way (raw whenever an
output has no typed field). The request's
``model_version`` pins a version; its parameters ``key`` (string: an application's
context, a graph's stream) and ``timeout`` (us, as tritonclient sends it) or
``timeout_ms``; without one, the call's gRPC deadline, else the target's own. The response's
parameters say, as comma-separated strings, where each row's answer came from
(``keel_sources``) and which version answered (``keel_versions``).

Refusals are gRPC status codes mapped from the HTTP gateway's statuses (``CODE_OF``):
INVALID_ARGUMENT bad input, UNAUTHENTICATED no or unknown bearer token (metadata
``authorization: Bearer ...``; the server health methods need none), NOT_FOUND unknown
target or version, ABORTED another version answered, RESOURCE_EXHAUSTED overloaded or a
message over ``max_body_bytes``, UNAVAILABLE no frontend answered, DEADLINE_EXCEEDED,
INTERNAL. TLS when ``tls_cert`` and ``tls_key`` are set. A call its client cancels (or
whose client goes away) has its task cancelled by grpc, and with it the call's Keel
requests (the frontend drops their work; counted ``cancelled`` in the gateway's status).

The generated modules define the protobuf package ``inference``, as tritonclient's do:
one process can load only one of them, so the gateway imports this module only when
``grpc_port`` is set, and tests talk to it from another process. What it shares with the
HTTP gateway (its Inference, token list, counts, metrics, version and request parameter
rules) the gateway hands to ``GrpcServer``: this module imports nothing of it, so the
gateway may import this one.
"""
from __future__ import annotations

import asyncio
import math
from typing import Any

import grpc
import numpy as np

from keel.common import inputs
from keel.common.protocol import ErrorCode
from keel.services.inference import Inference, InferError, call_parameters
from keel.services.oip import grpc_predict_v2_pb2 as pb
from keel.services.oip import grpc_predict_v2_pb2_grpc as pb_grpc
from keel.services.oip import tensors, triton

SERVICE = "inference.GRPCInferenceService"
#: what a load balancer probes without a token (as the HTTP gateway's health paths)
OPEN_METHODS = (f"/{SERVICE}/ServerLive", f"/{SERVICE}/ServerReady")
#: how long in-flight calls have to finish when the gateway stops (s)
STOP_GRACE_S = 2.0

#: the HTTP gateway's status -> gRPC status code
CODE_OF = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
           404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.ABORTED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
           429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
           504: grpc.StatusCode.DEADLINE_EXCEEDED}

#: OIP datatype -> (its field of InferTensorContents, that field's numpy type); FP16 and BF16 have none
CONTENTS_OF = tensors.CONTENTS_OF


def code_of(exc: InferError) -> grpc.StatusCode:
    """The gRPC code of a refusal; an overloaded frontend (a 503 over HTTP, where a
    client retries elsewhere) is RESOURCE_EXHAUSTED, gRPC's word for it."""
    if exc.status == 503 and exc.message.startswith(ErrorCode.OVERLOADED):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return CODE_OF.get(exc.status, grpc.StatusCode.INTERNAL)


def parameters(params: Any) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` as a dict of plain values."""
    return {name: getattr(p, p.WhichOneof("parameter_choice")) for name, p in params.items()
            if p.WhichOneof("parameter_choice") is not None}


def read_input(request: pb.ModelInferRequest) -> np.ndarray:
    """The one input tensor of a request, as its shape and datatype say (``Inference``
    then checks it against the target's)."""
    if len(request.inputs) != 1:
        raise InferError(400, f"a Keel target takes exactly one input tensor, got {len(request.inputs)}")
    tensor = request.inputs[0]
    what = f"input {inputs.short(tensor.name)}"
    shape = list(tensor.shape)
    if any(d < 0 for d in shape):
        raise InferError(400, f"{what}: shape must be sizes >= 0, got {shape}")
    if tensor.datatype not in inputs.DATATYPES:
        raise InferError(400, f"{what}: datatype {inputs.short(tensor.datatype)} is not one of "
                              f"{sorted(inputs.DATATYPES)}")
    dtype = np.dtype(inputs.DATATYPES[tensor.datatype])
    count = math.prod(shape)  # exact: a product past int64 is only a size that does not match
    if request.raw_input_contents:
        if len(request.raw_input_contents) != 1:
            raise InferError(400, f"raw_input_contents has {len(request.raw_input_contents)} tensors for 1 input")
        if tensor.HasField("contents"):
            raise InferError(400, f"{what}: give raw_input_contents or contents, not both")
        raw = request.raw_input_contents[0]
        if len(raw) != count * dtype.itemsize:
            raise InferError(400, f"{what}: {len(raw)} bytes do not hold shape {shape} of {tensor.datatype}")
        return np.frombuffer(raw, dtype).reshape(shape)
    if tensor.datatype not in CONTENTS_OF or tensor.datatype == "BYTES":
        raise InferError(400, f"{what}: {tensor.datatype} travels only in raw_input_contents")
    field, wire = CONTENTS_OF[tensor.datatype]
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise InferError(400, f"{what}: {len(values)} values in contents.{field} do not fill shape {shape}")
    try:
        return inputs.cast(np.array(values, dtype=wire), dtype, what).reshape(shape)
    except inputs.InputError as exc:
        raise InferError(400, str(exc)) from None


def read_inputs(request: pb.ModelInferRequest) -> dict[str, tuple[str, np.ndarray]]:
    """Every input of a request by name: (datatype, array of its shape), from
    ``raw_input_contents`` (one buffer per input, in order; BYTES length-prefixed) or each
    input's typed ``contents`` (BYTES: ``bytes_contents``)."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InferError(400, f"raw_input_contents has {len(raw)} tensors for {len(request.inputs)} inputs")
    out: dict[str, tuple[str, np.ndarray]] = {}
    try:
        if not request.inputs:
            raise inputs.InputError("the request has no inputs")
        for i, tensor in enumerate(request.inputs):
            shape = list(tensor.shape)
            what = tensors.check_header(tensor.name, tensor.datatype, shape)
            if tensor.name in out:
                raise inputs.InputError(f"{what} is given twice")
            if raw:
                if tensor.HasField("contents"):
                    raise inputs.InputError(f"{what}: give raw_input_contents or contents, not both")
                x = tensors.from_raw(raw[i], tensor.datatype, shape, what)
            else:
                x = tensors.from_contents(tensor.contents, tensor.datatype, shape, what)
            out[tensor.name] = (tensor.datatype, x)
    except inputs.InputError as exc:
        raise InferError(400, str(exc)) from None
    return out


def request_options(request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> dict[str, Any]:
    """``Inference.infer``'s keywords from the request: key, version, deadline, id."""
    key, timeout = call_parameters(parameters(request.parameters))  # the same rules as over HTTP
    left = context.time_remaining()  # the caller's own deadline (tritonclient's client_timeout)
    if timeout is None and left is not None:
        timeout = max(left * 1000.0, 1.0)
    if len(request.id) > 200:
        raise InferError(400, "id must be at most 200 characters")
    metadata = context.invocation_metadata() if hasattr(context, "invocation_metadata") else None
    return {"key": key, "version": request.model_version or None, "timeout_ms": timeout,
            "request_id": request.id or None,  # and a W3C trace context, as over HTTP's header
            "traceparent": next((v for k, v in metadata or () if k == "traceparent"), None)}


def tensor_metadata(name: str, datatype: str, shape: list[int]) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(name=name, datatype=datatype, shape=shape)


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """The six OIP v2 methods Keel serves, on one ``Inference`` (see the module docstring)."""

    def __init__(self, gateway: Any, version: str, m_requests: Any):
        self.inference: Inference = gateway.inference
        self.log = gateway.log
        self.counts = gateway.counts  # the gateway's: its status counts both transports' requests
        self.version = version
        self.m_requests = m_requests

    async def _answer(self, context: grpc.aio.ServicerContext, work: Any, method: str) -> Any:
        """``work``'s response; its refusal as a status code (aborting the call)."""
        try:
            return await work
        except asyncio.CancelledError:  # the caller cancelled the call (grpc cancels this task): so are its Keel calls
            if method == "ModelInfer":
                self.counts["cancelled"] += 1
                self.log.info("cancelled: the call was cancelled", method=method)
            raise
        except InferError as exc:
            code, message = code_of(exc), exc.message
        except Exception as exc:  # every failure is a status, never a dropped call
            self.log.exception("request failed", method=method)
            code, message = grpc.StatusCode.INTERNAL, f"the gateway failed on this request: {type(exc).__name__} " \
                                                      "(see its log)"
        if method == "ModelInfer":
            self.counts["errors"] += 1
            self.m_requests.labels(code=code.name).inc()
        await context.abort(code, message)

    # ------------------------------------------------------------------ health and metadata

    async def target(self, name: str, version: str) -> dict:
        """The target, as the frontends say now (a rollout shows at once); "" is no version."""
        await self.inference.targets(fresh=True)
        return await self.inference.target(name, version or None)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=bool(await self.inference.statuses()))

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        async def ready() -> pb.ModelReadyResponse:
            try:
                await self.target(request.name, request.version)
            except InferError as exc:
                if exc.status not in (404, 503):  # not served, or no frontend says: not ready, as Triton answers
                    raise
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=True)
        return await self._answer(context, ready(), "ModelReady")

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="keel", version=self.version)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        async def metadata() -> pb.ModelMetadataResponse:
            target = await self.target(request.name, request.version)
            signature = tensors.signature_of(target)
            if not tensors.is_single(signature):
                meta = tensors.metadata(request.name, target, signature)
                return pb.ModelMetadataResponse(
                    name=request.name, versions=meta["versions"], platform=meta["platform"],
                    inputs=[tensor_metadata(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]],
                    outputs=[tensor_metadata(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]])
            dtype = target["input_dtype"]
            return pb.ModelMetadataResponse(
                name=request.name, versions=target["versions"], platform="keel",
                inputs=[tensor_metadata("input", inputs.OIP_OF.get(dtype, dtype), [-1, *target["input_shape"]])],
                outputs=[tensor_metadata("output", "FP32", [-1, target["output_size"]])])
        return await self._answer(context, metadata(), "ModelMetadata")

    async def ModelConfig(self, request: bytes, context: Any) -> bytes:
        """Triton's model configuration (``oip.triton``: not in KServe's proto)."""
        async def config() -> bytes:
            try:
                name, version = triton.decode_request(request)
            except triton.WireError as exc:
                raise InferError(400, f"not a ModelConfigRequest: {exc}") from None
            target = await self.target(name, version)
            return triton.encode_config(tensors.model_config(name, tensors.signature_of(target)))
        return await self._answer(context, config(), "ModelConfig")

    async def ModelStatistics(self, request: bytes, context: Any) -> bytes:
        """Triton's model statistics (``oip.stats``): one target's, or every one's (no name)."""
        async def statistics() -> bytes:
            try:
                name, version = triton.decode_request(request)
            except triton.WireError as exc:
                raise InferError(400, f"not a ModelStatisticsRequest: {exc}") from None
            if name:
                await self.target(name, version)
                names = [name]
            else:
                names = sorted(await self.inference.targets(fresh=True))
            return triton.encode_statistics(self.inference.statistics.to_json(names, version or None))
        return await self._answer(context, statistics(), "ModelStatistics")

    # ------------------------------------------------------------------ infer

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        self.counts["requests"] += 1
        return await self._answer(context, self._infer(request, context), "ModelInfer")

    async def _infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        target = await self.inference.target_or_spec(request.model_name, request.model_version or None)
        if not tensors.is_single(tensors.signature_of(target)):
            return await self._infer_named(request, context)
        for output in request.outputs:
            if output.name != "output":
                raise InferError(400, f"a Keel target has one output, 'output', not {inputs.short(output.name)}")
        x = read_input(request)
        options = request_options(request, context)
        out, results = await self.inference.infer(request.model_name, x, **options)
        response = self._response(request, options, results)
        output = response.outputs.add(name="output", datatype="FP32", shape=list(out.shape))
        if request.raw_input_contents:  # answered as asked: raw for raw, typed for typed
            response.raw_output_contents.append(out.astype("<f4", copy=False).tobytes())
        else:
            output.contents.fp32_contents.extend(out.ravel().tolist())
        self.m_requests.labels(code=grpc.StatusCode.OK.name).inc()
        return response

    async def _infer_named(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        """A target with a signature beyond one ``input``: every input by name, every
        datatype, the outputs asked for; outputs raw when the inputs came raw or an output
        has no typed field (FP16, BF16), typed otherwise."""
        named = read_inputs(request)
        options = request_options(request, context)
        names = [o.name for o in request.outputs] or None
        outs, results = await self.inference.infer_named(request.model_name, named, outputs=names, **options)
        response = self._response(request, options, results)
        raw = bool(request.raw_input_contents) or any(tensors.datatype_of(x) not in CONTENTS_OF for x in outs.values())
        for name, x in outs.items():
            output = response.outputs.add(name=name, datatype=tensors.datatype_of(x), shape=list(x.shape))
            if raw:
                response.raw_output_contents.append(tensors.to_raw(x))
            else:
                tensors.fill_contents(output.contents, x)
        self.m_requests.labels(code=grpc.StatusCode.OK.name).inc()
        return response

    @staticmethod
    def _response(request: pb.ModelInferRequest, options: dict, results: list) -> pb.ModelInferResponse:
        """An infer response but its outputs: the version and where each row's answer came from."""
        response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        version = results[0].version if results else options["version"]
        if version is not None:
            response.model_version = version
        response.parameters["keel_sources"].string_param = ",".join(str(r.source) for r in results)
        response.parameters["keel_versions"].string_param = ",".join(r.version or "" for r in results)
        response.parameters["keel_latency_ms"].double_param = max((r.latency_ms for r in results), default=0.0)
        return response


class BearerTokens(grpc.aio.ServerInterceptor):
    """The HTTP gateway's token allow-list, asked of the ``authorization`` metadata of
    every call but the server health methods."""

    def __init__(self, tokens: Any, counts: dict[str, int]):
        self.tokens = tokens
        self.counts = counts

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        if details.method not in OPEN_METHODS:
            given = next((v for k, v in details.invocation_metadata or () if k == "authorization"), None)
            why = self.tokens.refuse(given if isinstance(given, str) else None)
            if why is not None:
                self.counts["unauthorized"] += 1
                return _refusing(grpc.StatusCode.UNAUTHENTICATED, why)
        return await continuation(details)


def _refusing(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)
    return grpc.unary_unary_rpc_method_handler(refuse)


class GrpcServer:
    """The gRPC server of a gateway (``services.gateway.Gateway``, started: its ``cfg``,
    ``inference``, ``tokens``, ``log``, ``counts``, ``metrics``), with the gateway's
    ``version``. ``start()`` binds
    ``http_host:grpc_port`` in the running loop and returns the port bound (``OSError``
    when it cannot); ``stop()`` lets in-flight calls finish."""

    def __init__(self, gateway: Any, version: str):
        self.cfg = gateway.cfg
        m_requests = gateway.metrics.counter("grpc_requests_total", "gRPC infer requests answered, by status code",
                                             ["code"])
        self.servicer = Servicer(gateway, version, m_requests)
        tokens = gateway.tokens
        self.interceptors = [BearerTokens(tokens, gateway.counts)] if tokens is not None else []
        self.server: grpc.aio.Server | None = None

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.cfg.tls_cert is None:
            return None
        try:
            with open(self.cfg.tls_key, "rb") as key, open(self.cfg.tls_cert, "rb") as cert:
                return grpc.ssl_server_credentials([(key.read(), cert.read())])
        except OSError as exc:
            raise OSError(f"tls_cert {self.cfg.tls_cert} / tls_key {self.cfg.tls_key}: {exc}") from None

    async def start(self) -> int:
        options = [("grpc.max_receive_message_length", self.cfg.max_body_bytes),
                   # grpc sets SO_REUSEPORT by default: a second gateway on the port would share it, not fail
                   ("grpc.so_reuseport", 0)]
        self.server = grpc.aio.server(interceptors=self.interceptors, options=options)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        triton_methods = {"ModelConfig": grpc.unary_unary_rpc_method_handler(self.servicer.ModelConfig),
                          "ModelStatistics": grpc.unary_unary_rpc_method_handler(self.servicer.ModelStatistics)}
        # bytes in, bytes out (``oip.triton`` writes them), after the generated methods
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, triton_methods),))
        address = f"{self.cfg.http_host}:{self.cfg.grpc_port}"
        credentials = self.credentials()
        try:
            port = (self.server.add_secure_port(address, credentials) if credentials is not None
                    else self.server.add_insecure_port(address))
        except RuntimeError as exc:  # grpc's word for "cannot bind"
            raise OSError(f"cannot listen on {address}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        await self.server.start()
        return port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(STOP_GRACE_S)
            self.server = None

