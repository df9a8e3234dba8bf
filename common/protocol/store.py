"""The store service's wire format: model versions by content (``services.store``).

A request is a multipart list sent from a DEALER to the store's ROUTER::

    frame 0      MAGIC (b"KEELSTORE1")
    frame 1      request id (bytes chosen by the client; the reply repeats it)
    frame 2      op: LIST | READ | PUT | COMMIT
    frame 3..    the op's arguments, each an ASCII/UTF-8 frame:

    LIST    name, version ("latest" allowed)
            -> OK, manifest.json's bytes, listing (orjson: {"version", "files": {file: {"size", "sha256"}}})
    READ    name, version, file, offset, length
            -> OK, the bytes (fewer than ``length`` only at the end of the file)
    PUT     name, version, file, offset, bytes            (publish: one chunk of a file)
            -> OK
    COMMIT  name, version, manifest.json's bytes, listing (publish: every file put)
            -> OK; the version exists once its manifest is written

A reply is ``[request id, OK | ERROR, ...]``; ``ERROR`` carries one frame, the reason.
The listing names every file of the version, ``manifest.json`` included, with its sha256:
a reader checks the manifest's bytes against it and each file against both it and the
manifest's own digests, so a flipped byte anywhere is caught before a file is used. Not
through ``common.protocol``'s header-and-tensors codec: a file is a byte string, and
carrying it as a uint8 tensor would only add a copy.

Example
-------
>>> frames = request(b"r1", LIST, "digits-mlp", "latest")
>>> parse_request(frames)
(b'r1', b'LIST', ['digits-mlp', 'latest'])
"""
from __future__ import annotations

MAGIC = b"KEELSTORE1"
LIST, READ, PUT, COMMIT = b"LIST", b"READ", b"PUT", b"COMMIT"
OPS = (LIST, READ, PUT, COMMIT)
OK, ERROR = b"OK", b"ERROR"
MANIFEST = "manifest.json"
#: frames of each op after the op itself; the last one of READ/PUT/COMMIT may be binary
ARGS = {LIST: 2, READ: 5, PUT: 5, COMMIT: 4}
#: op -> index of its binary argument (not decoded as text)
BINARY = {PUT: 4, COMMIT: 2}


class StoreWireError(ValueError):
    """A malformed store request or reply: answered with ERROR (service) or retried (client)."""


def _frame(value: str | bytes | int) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def request(request_id: bytes, op: bytes, *args: str | bytes | int) -> list[bytes]:
    """The frames of one request."""
    return [MAGIC, request_id, op, *(_frame(a) for a in args)]


def parse_request(frames: list[bytes]) -> tuple[bytes, bytes, list]:
    """(request id, op, arguments): text frames decoded, the binary one kept as bytes."""
    if len(frames) < 3 or frames[0] != MAGIC:
        raise StoreWireError("not a store request (expected MAGIC, request id, op, ...)")
    request_id, op, raw = frames[1], frames[2], frames[3:]
    if op not in OPS:
        raise StoreWireError(f"unknown op {op[:16]!r}; ops: {[o.decode() for o in OPS]}")
    if len(raw) != ARGS[op]:
        raise StoreWireError(f"{op.decode()} takes {ARGS[op]} arguments, got {len(raw)}")
    try:
        args = [a if BINARY.get(op) == i else a.decode() for i, a in enumerate(raw)]
    except UnicodeDecodeError:
        raise StoreWireError(f"{op.decode()}: a text argument is not UTF-8") from None
    return request_id, op, args


def ok(request_id: bytes, *payload: bytes) -> list[bytes]:
    return [request_id, OK, *payload]


def error(request_id: bytes, reason: str) -> list[bytes]:
    return [request_id, ERROR, reason.encode()]
