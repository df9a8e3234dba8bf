"""OIP v2 over HTTP: a request's JSON header and binary part <-> tensors, pure.

The HTTP gateway (``services.gateway``) splits a body into its JSON header and the binary
part after it (the binary-data extension: ``Inference-Header-Content-Length``,
``split_body``). A one-tensor target's request is its one ``input`` (``read_input``,
``wants_binary``: refusals as ``InferError``, as before signatures); for a model with a
signature this module reads every input of the header -- JSON ``data``, or ``binary_data_size`` bytes of
the binary part, inputs taking their bytes in order -- and the outputs asked for, and
writes the response's header and binary part. Datatypes and BYTES are ``oip.tensors``'.
Every malformed thing is an ``InputError`` (the gateway's 400).

Example
-------
>>> header = {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 2], "data": [5, 6]}],
...           "outputs": [{"name": "p"}]}
>>> {n: (d, x.tolist()) for n, (d, x) in read_inputs(header, b"").items()}
{'ids': ('INT64', [[5, 6]])}
>>> read_outputs(header)
(['p'], {'p': False})
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from keel.common import inputs
from keel.common.inputs import DATATYPES, InputError, short
from keel.services.inference import InferError
from keel.services.oip.tensors import check_header, datatype_of, from_json, from_raw, to_json, to_raw

HEADER_LENGTH = "Inference-Header-Content-Length"
HEADER_LENGTH_KEY = HEADER_LENGTH.lower()  # as the server's Request keys its headers


def _mapping(value: Any, what: str) -> dict:
    """``value`` when a JSON object, {} when absent; anything else refused naming ``what``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{what} must be a JSON object, got {short(value)}")
    return value


_short = short


def _object(value: Any, what: str) -> dict:
    """``value`` when a JSON object, {} when absent; anything else is a 400 naming ``what``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InferError(400, f"{what} must be a JSON object, got {_short(value)}")
    return value


def split_body(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    """(the JSON header, the binary part) of an OIP request or response body."""
    if header_length is None:
        json_part, binary = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise InferError(400, f"{HEADER_LENGTH} {_short(header_length)} is not an integer") from None
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


def read_input(header: dict, binary: bytes, target: dict) -> np.ndarray:
    """The one input tensor of a request, decoded from JSON ``data`` or the binary part,
    as (rows, *input_shape) of its own datatype; ``Inference`` validates and converts it."""
    inputs_ = header.get("inputs")
    if not isinstance(inputs_, list) or len(inputs_) != 1 or not isinstance(inputs_[0], dict):
        n = len(inputs_) if isinstance(inputs_, list) else 0
        raise InferError(400, f"a Keel target takes exactly one input tensor (an object in inputs), got {n}")
    tensor = inputs_[0]
    name, shape, datatype = tensor.get("name", "input"), tensor.get("shape"), tensor.get("datatype")
    if not isinstance(name, str):
        raise InferError(400, f"input name must be a string, got {_short(name)}")
    what = f"input {_short(name)}"
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InferError(400, f"{what}: shape must be a list of sizes >= 0, got {_short(shape)}")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InferError(400, f"{what}: datatype {_short(datatype)} is not one of {sorted(DATATYPES)}")
    want = list(target["input_shape"])
    if shape[1:] != want:  # before the data: the size it must have follows from the shape
        raise InferError(400, f"{what}: shape {_short(shape)} is not [-1, {', '.join(map(str, want))}] "
                              f"(rows of the input shape {want})")
    # exact (Python ints): a shape whose product overflows int64 is only a size that does not match
    count = shape[0] * math.prod(want)
    dtype = np.dtype(DATATYPES[datatype])
    size = _object(tensor.get("parameters"), f"{what} parameters").get("binary_data_size")
    if size is not None:
        if type(size) is not int or size != len(binary):
            raise InferError(400, f"{what}: binary_data_size {_short(size)} but {len(binary)} binary bytes came")
        if size != count * dtype.itemsize:
            raise InferError(400, f"{what}: {size} bytes do not hold shape {shape} of {datatype}")
        x = np.frombuffer(binary, dtype)
    else:
        if binary:
            raise InferError(400, f"{what}: {len(binary)} binary bytes came but the input has no binary_data_size")
        data = tensor.get("data")
        if data is None:
            raise InferError(400, f"{what} has neither data nor binary_data_size")
        try:
            x = inputs.from_values(data, datatype, what)
        except inputs.InputError as exc:
            raise InferError(400, str(exc)) from None
        if x.size != count:
            raise InferError(400, f"{what}: {x.size} values do not fill shape {shape}")
    return x.reshape(shape)


def wants_binary(header: dict) -> bool:
    """Whether the output is asked for as binary data; a malformed ``outputs`` is a 400."""
    binary = bool(_object(header.get("parameters"), "parameters").get("binary_data_output"))
    outputs = header.get("outputs")
    if outputs is None:
        return binary
    if not isinstance(outputs, list):
        raise InferError(400, f"outputs must be a list of the outputs wanted, got {_short(outputs)}")
    for i, output in enumerate(outputs):
        if not isinstance(output, dict):
            raise InferError(400, f"outputs[{i}] must be a JSON object, got {_short(output)}")
        if output.get("name") != "output":
            raise InferError(400, f"outputs[{i}]: a Keel model has one output, 'output', not {_short(output.get('name'))}")
        binary |= bool(_object(output.get("parameters"), f"outputs[{i}].parameters").get("binary_data"))
    return binary


# ---------------------------------------------------------------------- named tensors

def read_inputs(header: dict, binary: bytes) -> dict[str, tuple[str, np.ndarray]]:
    """Every input of a request: name -> (datatype, array of its shape). An input with
    ``parameters.binary_data_size`` takes that many bytes of ``binary`` (in the order of
    the inputs), the others their JSON ``data``; the sizes must use up ``binary``."""
    tensors = header.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise InputError("inputs must be a non-empty list of tensors (objects with name, datatype, shape, data)")
    out: dict[str, tuple[str, np.ndarray]] = {}
    view, offset = memoryview(binary), 0
    for i, tensor in enumerate(tensors):
        if not isinstance(tensor, dict):
            raise InputError(f"inputs[{i}] must be a JSON object, got {short(tensor)}")
        name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
        what = check_header(name, datatype, shape)
        if name in out:
            raise InputError(f"{what} is given twice")
        size = _mapping(tensor.get("parameters"), f"{what} parameters").get("binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0 or offset + size > len(binary):
                raise InputError(f"{what}: binary_data_size {short(size)}, but {len(binary) - offset} binary "
                                 "bytes are left")
            out[name] = (datatype, from_raw(view[offset:offset + size], datatype, shape, what))
            offset += size
        else:
            if tensor.get("data") is None:
                raise InputError(f"{what} has neither data nor binary_data_size")
            out[name] = (datatype, from_json(tensor["data"], datatype, shape, what))
    if offset != len(binary):
        raise InputError(f"{len(binary) - offset} binary bytes came that no input's binary_data_size claims")
    return out


def read_outputs(header: dict) -> tuple[list[str] | None, dict[str, bool]]:
    """(the outputs asked for by name, None: all; name -> whether as binary data). An
    output without its own ``binary_data`` follows the request's ``binary_data_output``
    (the key ``""`` when no output is named)."""
    default = bool(_mapping(header.get("parameters"), "parameters").get("binary_data_output"))
    outputs = header.get("outputs")
    if outputs is None:
        return None, {"": default}
    if not isinstance(outputs, list):
        raise InputError(f"outputs must be a list of the outputs wanted, got {short(outputs)}")
    binary: dict[str, bool] = {}
    for i, output in enumerate(outputs):
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise InputError(f"outputs[{i}] must be a JSON object with a name, got {short(output)}")
        flag = _mapping(output.get("parameters"), f"outputs[{i}].parameters").get("binary_data")
        binary[output["name"]] = default if flag is None else bool(flag)
    return list(binary), binary


def write_outputs(outputs: dict[str, np.ndarray], binary: dict[str, bool]) -> tuple[list[dict], bytes]:
    """The response's ``outputs`` and binary part: each output as JSON ``data`` or, when
    ``binary`` says so (``""``: every output), as ``binary_data_size`` bytes appended."""
    described, raw = [], []
    for name, x in outputs.items():
        output: dict[str, Any] = {"name": name, "datatype": datatype_of(x), "shape": list(x.shape)}
        if binary.get(name, binary.get("", False)):
            data = to_raw(x)
            output["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            output["data"] = to_json(x, name)
        described.append(output)
    return described, b"".join(raw)
