"""OIP v2 over HTTP: a request's JSON header and binary part <-> named tensors, pure.

The HTTP gateway (``services.gateway``) splits a body into its JSON header and the binary
part after it (the binary-data extension: ``Inference-Header-Content-Length``); this
module reads every input of the header -- JSON ``data``, or ``binary_data_size`` bytes of
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

from typing import Any

import numpy as np

from keel.common.inputs import InputError, short
from keel.services.oip.tensors import check_header, datatype_of, from_json, from_raw, to_json, to_raw


def _object(value: Any, what: str) -> dict:
    """``value`` when a JSON object, {} when absent; anything else refused naming ``what``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{what} must be a JSON object, got {short(value)}")
    return value


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
        size = _object(tensor.get("parameters"), f"{what} parameters").get("binary_data_size")
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
    default = bool(_object(header.get("parameters"), "parameters").get("binary_data_output"))
    outputs = header.get("outputs")
    if outputs is None:
        return None, {"": default}
    if not isinstance(outputs, list):
        raise InputError(f"outputs must be a list of the outputs wanted, got {short(outputs)}")
    binary: dict[str, bool] = {}
    for i, output in enumerate(outputs):
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise InputError(f"outputs[{i}] must be a JSON object with a name, got {short(output)}")
        flag = _object(output.get("parameters"), f"outputs[{i}].parameters").get("binary_data")
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
