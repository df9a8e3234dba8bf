"""Triton's gRPC methods beyond KServe's proto, written by hand on the protobuf wire.

KServe's ``grpc_predict_v2.proto`` (the one this package generates) has no model
configuration and no statistics; Triton's ``GRPCInferenceService`` adds ``ModelConfig``
(``model_config.proto``'s large ``ModelConfig`` message) and ``ModelStatistics``, and
perf_analyzer asks both (``tritonclient.grpc``'s ``get_model_config`` and
``get_inference_statistics`` too). Keel answers only the fields its JSON forms have
(``oip.tensors.model_config``: name, platform, backend, max_batch_size, each input and
output with data_type, dims and reshape, an empty dynamic_batching, the transaction
policy; ``oip.stats``: counts and durations). Writing those few fields by hand keeps
Triton's whole configuration schema (and a second generated package) out of Keel; the
field numbers are Triton's (the tests decode the bytes with tritonclient's own messages).

Example
-------
>>> decode_request(b"\\n\\x03rec\\x12\\x011")
('rec', '1')
"""
from __future__ import annotations

from typing import Any

#: Triton's DataType enum (model_config.proto)
DATA_TYPES = {"TYPE_BOOL": 1, "TYPE_UINT8": 2, "TYPE_UINT16": 3, "TYPE_UINT32": 4, "TYPE_UINT64": 5, "TYPE_INT8": 6,
              "TYPE_INT16": 7, "TYPE_INT32": 8, "TYPE_INT64": 9, "TYPE_FP16": 10, "TYPE_FP32": 11, "TYPE_FP64": 12,
              "TYPE_STRING": 13, "TYPE_BF16": 14}
#: ModelConfig's field numbers (model_config.proto)
NAME, PLATFORM, MAX_BATCH_SIZE, INPUT, OUTPUT, DYNAMIC_BATCHING, BACKEND, TRANSACTION_POLICY = 1, 2, 4, 5, 6, 11, 17, 19
#: ModelInput's dims and reshape; ModelOutput's dims and reshape
INPUT_DIMS, INPUT_RESHAPE, OUTPUT_DIMS, OUTPUT_RESHAPE = 4, 5, 3, 5


class WireError(ValueError):
    """A ModelConfigRequest that is not one."""


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64 (a -1 dim) is its two's complement, ten bytes
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes, message, packed repeated)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _text(number: int, value: str) -> bytes:
    return _field(number, value.encode()) if value else b""


def _dims(number: int, dims: list[int]) -> bytes:
    return _field(number, b"".join(_varint(d) for d in dims)) if dims else b""


def _tensor(tensor: dict, dims_field: int, reshape_field: int) -> bytes:
    body = _text(1, tensor["name"]) + _int(2, DATA_TYPES[tensor["data_type"]]) + _dims(dims_field, tensor["dims"])
    if "reshape" in tensor:  # an empty message is still sent: reshape to [] (a scalar) differs from none
        body += _field(reshape_field, _dims(1, tensor["reshape"]["shape"]))
    return body


def encode_config(config: dict[str, Any]) -> bytes:
    """A ``ModelConfigResponse`` holding ``config`` (``oip.tensors.model_config``'s JSON)."""
    body = _text(NAME, config["name"]) + _text(PLATFORM, config.get("platform", "")) \
        + _int(MAX_BATCH_SIZE, config.get("max_batch_size", 0))
    body += b"".join(_field(INPUT, _tensor(t, INPUT_DIMS, INPUT_RESHAPE)) for t in config.get("input", ()))
    body += b"".join(_field(OUTPUT, _tensor(t, OUTPUT_DIMS, OUTPUT_RESHAPE)) for t in config.get("output", ()))
    if "dynamic_batching" in config:
        body += _field(DYNAMIC_BATCHING, b"")
    body += _text(BACKEND, config.get("backend", ""))
    if "model_transaction_policy" in config:
        body += _field(TRANSACTION_POLICY, _int(1, int(config["model_transaction_policy"].get("decoupled", False))))
    return _field(1, body)


#: InferStatistics' durations, by field number (model statistics JSON names)
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


def encode_statistics(stats: dict[str, Any]) -> bytes:
    """A ``ModelStatisticsResponse`` holding ``stats`` (``oip.stats``' JSON form)."""
    out = b""
    for model in stats["model_stats"]:
        durations = model["inference_stats"]
        infer = b"".join(_field(i, _int(1, durations[k]["count"]) + _int(2, durations[k]["ns"]))
                         for i, k in enumerate(DURATIONS, 1) if k in durations)
        out += _field(1, _text(1, model["name"]) + _text(2, model["version"]) + _int(3, model["last_inference"])
                      + _int(4, model["inference_count"]) + _int(5, model["execution_count"]) + _field(6, infer))
    return out


def decode_request(data: bytes) -> tuple[str, str]:
    """(name, version) of a ``ModelConfigRequest`` or ``ModelStatisticsRequest`` (the
    same two fields); unknown fields are skipped."""
    fields = {1: "", 2: ""}
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _read_varint(data, i)
        elif wire == 2:
            n, i = _read_varint(data, i)
            if i + n > len(data):
                raise WireError("a field runs past the message")
            if number in fields:
                fields[number] = data[i:i + n].decode("utf-8", errors="replace")
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise WireError(f"wire type {wire} is not one a ModelConfigRequest has")
    return fields[1], fields[2]


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise WireError("a varint runs past the message")
        byte = data[i]
        n |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return n, i
        shift += 7
