"""Socket helpers: every Keel socket is made here, with ``linger=0`` and sane limits.

Example
-------
>>> ctx = zmq.Context.instance()
>>> pull = make_socket(ctx, zmq.PULL, bind="tcp://127.0.0.1:*")
>>> endpoint_of(pull).startswith("tcp://127.0.0.1:")
True
>>> pull.close()
"""
from __future__ import annotations

import uuid
from typing import Any

import zmq

from common import protocol

#: messages queued per peer before a socket drops (PUB) or blocks (PUSH, DEALER)
HWM = 100_000


def make_socket(
    ctx: zmq.Context,
    kind: int,
    bind: str | None = None,
    connect: str | list[str] | None = None,
    identity: str | None = None,
) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    if kind == zmq.ROUTER:
        # A reply to a peer that is gone is an error we want to see, not a silent drop.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A peer that reconnects under its old identity (a restarted worker) takes it over
        # instead of being ignored while the old connection lingers.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    if bind is not None:
        sock.bind(bind)
    for endpoint in [connect] if isinstance(connect, str) else connect or []:
        sock.connect(endpoint)
    return sock


def endpoint_of(sock: zmq.Socket) -> str:
    """The endpoint a socket actually bound (resolves ``:*`` wildcard ports)."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def send(sock: zmq.Socket, msg: Any, envelope: list | None = None, flags: int = 0) -> None:
    frames = protocol.encode(msg)
    sock.send_multipart(envelope + frames if envelope else frames, flags=flags, copy=False)


def recv_frames(sock: zmq.Socket) -> list:
    return sock.recv_multipart(copy=False)


def request_status(endpoint: str, timeout_s: float = 2.0, ctx: zmq.Context | None = None) -> dict | None:
    """Ask the service whose ROUTER is at ``endpoint`` for its status; None on timeout."""
    ctx = ctx or zmq.Context.instance()
    sock = make_socket(ctx, zmq.DEALER, connect=endpoint, identity=f"status-{uuid.uuid4().hex[:8]}")
    try:
        send(sock, protocol.Status(service="?"))
        if not sock.poll(int(timeout_s * 1000)):
            return None
        msg = protocol.decode(recv_frames(sock))
        return msg.info if isinstance(msg, protocol.Status) else None
    except (zmq.ZMQError, protocol.ProtocolError):
        return None
    finally:
        sock.close(0)
