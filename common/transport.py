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

import socket
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from keel.common import curve, protocol

#: messages queued per peer before a socket drops (PUB) or blocks (PUSH, DEALER)
HWM = 100_000
#: largest frame any Keel socket reads; a bigger one disconnects its sender before it is
#: read into memory (ZMQ_MAXMSGSIZE). Sockets facing clients set their own, lower bound.
MAX_FRAME_BYTES = protocol.MAX_PAYLOAD_BYTES + protocol.MAX_HEADER_BYTES
#: distinct peers a ``Peers`` table connects to at most (endpoints come from the wire)
MAX_PEERS = 1024
#: the address this process's TCP endpoints bind when it is not the one they advertise
#: (``keel serve --bind``: NAT, containers, pods; ``common.spec.operations``); None = theirs
BIND_ADDRESS: str | None = None


#: what a socket bound (its LAST_ENDPOINT) -> the endpoint it advertises, where they differ
_ADVERTISED: dict[str, str] = {}


def bind_endpoint(endpoint: str) -> str:
    """What a socket binds for the advertised ``endpoint``: its port on ``BIND_ADDRESS``."""
    if BIND_ADDRESS is None or not endpoint.startswith("tcp://"):
        return endpoint
    return f"tcp://{BIND_ADDRESS}:{endpoint.rsplit(':', 1)[1]}"


def make_socket(
    ctx: zmq.Context,
    kind: int,
    bind: str | None = None,
    connect: str | list[str] | None = None,
    identity: str | None = None,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    hwm: int = HWM,
    curve_keys: Any = None,
) -> zmq.Socket:
    """A Keel socket; a CURVE one (``common.curve``) when ``curve_keys`` are given or this
    process uses CURVE."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    if kind == zmq.ROUTER:
        # A reply to a peer that is gone is an error we want to see, not a silent drop.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A peer that reconnects under its old identity (a restarted worker) takes it over
        # instead of being ignored while the old connection lingers.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    keys = curve_keys if curve_keys is not None else curve.active()
    if keys is not None:
        curve.apply(ctx, sock, server=bind is not None, keys=keys)
    if bind is not None:
        sock.bind(bind_endpoint(bind))
        if BIND_ADDRESS is not None and bind.startswith("tcp://"):  # endpoint_of answers what others reach
            _ADVERTISED[sock.getsockopt_string(zmq.LAST_ENDPOINT)] = bind
    for endpoint in [connect] if isinstance(connect, str) else connect or []:
        sock.connect(endpoint)
    return sock


def endpoint_of(sock: zmq.Socket) -> str:
    """The endpoint a socket actually bound (resolves ``:*`` wildcard ports): the one it
    advertises when it bound another address (``BIND_ADDRESS``), as a ``reply_to`` needs."""
    bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    return _ADVERTISED.get(bound, bound)


_MORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)


def send_frames(sock: zmq.Socket, frames: list, flags: int = 0) -> None:
    """``sock.send_multipart(frames, flags, copy=False)`` without its per-frame Python work
    (flag enums, type checks): a three-frame message cost ~12 µs that way here, ~5 µs this
    way, and every message of the request path goes through here. As zero-copy as before
    (pyzmq copies a frame below its copy threshold, and sends a larger one in place), and
    as atomic: once ZeroMQ took the first frame it takes the rest. A blocking-API socket
    only: an asyncio socket's ``send`` returns a future instead of raising, so a refused
    first frame would not stop the rest."""
    send, last = sock.send, len(frames) - 1
    more = int(flags) | _MORE
    for i in range(last):
        send(frames[i], more, copy=False)
    send(frames[last], int(flags), copy=False)


def recv_nowait(sock: zmq.Socket) -> list:
    """The frames (``zmq.Frame`` objects) of one message waiting on ``sock``; ``zmq.Again`` if none:
    ``recv_multipart(NOBLOCK, copy=False)`` less its option read per frame (each frame
    says whether more follow): ~6 µs -> ~2 µs a three-frame message here."""
    recv = sock.recv
    frame = recv(_NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:  # the rest of a message arrives with its first frame
        frame = recv(_NOBLOCK, copy=False)
        frames.append(frame)
    return frames


_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


def readable(sock: zmq.Socket) -> bool:
    """Whether a message waits on ``sock`` (``ZMQ_EVENTS``, asked with plain ints: pyzmq's
    ``getsockopt`` returns a ``PollEvent`` flag, whose ``&`` runs in Python's enum module)."""
    return bool(sock.get(_EVENTS) & _POLLIN)


def drain(sock: zmq.Socket, limit: int = 1000) -> Iterator[list]:
    """The frames of each message waiting on ``sock`` (at most ``limit``), without blocking.

    One message (the common case below saturation) costs one read and one question
    (``ZMQ_EVENTS``): reading until ``zmq.Again`` would raise, and pyzmq builds that
    exception in Python -- in a process woken cold, as each is with one request at a time,
    ~50 µs against ~22 µs for the question, on every wake-up of every loop. Past the first,
    it reads until ``zmq.Again``: under load one exception ends a run of many messages,
    where a question after each would cost more."""
    if limit <= 0:
        return
    try:
        frames = recv_nowait(sock)
    except zmq.Again:  # the poll's news was stale (another reader of this loop took it)
        return
    yield frames
    if limit <= 1 or sock.closed or not readable(sock):  # its handler may have closed it
        return
    for _ in range(limit - 1):
        try:
            frames = recv_nowait(sock)
        except zmq.Again:
            return
        yield frames
        if sock.closed:
            return


def send(sock: zmq.Socket, msg: Any, envelope: list | None = None, flags: int = 0) -> None:
    frames = protocol.encode(msg)
    send_frames(sock, envelope + frames if envelope else frames, flags)


#: why ``try_send_frames`` did not send
FULL, GONE = "full", "gone"


def try_send_frames(sock: zmq.Socket, frames: list) -> str | None:
    """Send encoded frames without ever blocking: None when sent, ``FULL`` when the peer's
    queue is full, ``GONE`` when a ROUTER's peer has left. For peers outside Keel's control
    (clients), whose slowness must cost only themselves."""
    try:
        send_frames(sock, frames, _NOBLOCK)
        return None
    except zmq.Again:
        return FULL
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EHOSTUNREACH:
            return GONE
        raise


def try_send(sock: zmq.Socket, msg: Any, envelope: list | None = None) -> bool:
    """``msg`` sent without ever blocking; False if the peer is full or gone."""
    frames = protocol.encode(msg)
    return try_send_frames(sock, envelope + frames if envelope else frames) is None


def split_rows(dests: list[str]) -> dict[str, list[int]]:
    """Row indices per destination, in first-seen order (one message per peer per batch)."""
    out: dict[str, list[int]] = {}
    for row, dest in enumerate(dests):
        out.setdefault(dest, []).append(row)
    return out


class Peers:
    """One PUSH socket per peer endpoint, made on first use: how workers and the decoder
    reach the frontend named in each query's ``reply_to``.

    Endpoints arrive on the wire, so a malformed or unconnectable one is refused, a full
    peer queue never blocks the sender (``send`` returns False and the caller counts those
    queries), and the table is bounded: past ``limit`` peers the least recently used one
    is closed, so garbage endpoints cannot lock out a real frontend."""

    def __init__(self, ctx: zmq.Context, on_new: Callable[[zmq.Socket], Any] | None = None,
                 on_drop: Callable[[zmq.Socket], Any] | None = None, limit: int = MAX_PEERS):
        self.ctx, self.on_new, self.on_drop, self.limit = ctx, on_new, on_drop, limit
        self.sockets: OrderedDict[str, zmq.Socket] = OrderedDict()  # least recently used first

    def get(self, endpoint: str) -> zmq.Socket | None:
        sock = self.sockets.get(endpoint)
        if sock is not None:
            self.sockets.move_to_end(endpoint)
            return sock
        if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            return None
        try:
            sock = make_socket(self.ctx, zmq.PUSH, connect=endpoint)
        except zmq.ZMQError:
            return None
        if len(self.sockets) >= self.limit:
            _, old = self.sockets.popitem(last=False)
            if self.on_drop is not None:
                self.on_drop(old)
            else:
                old.close(0)
        self.sockets[endpoint] = sock
        if self.on_new is not None:
            self.on_new(sock)
        return sock

    def send(self, endpoint: str, msg: Any) -> bool:
        """Queue ``msg`` for ``endpoint`` without blocking; False if the endpoint is refused
        or its queue is full."""
        sock = self.get(endpoint)
        return sock is not None and try_send(sock, msg)


def recv_frames(sock: zmq.Socket) -> list:
    return sock.recv_multipart(copy=False)


def request_status(endpoint: str, timeout_s: float = 2.0, ctx: zmq.Context | None = None) -> dict | None:
    """Ask the service whose ROUTER is at ``endpoint`` for its status; None on timeout."""
    return ask(endpoint, protocol.Status(service="?"), timeout_s, ctx)


def ask(endpoint: str, msg: Any, timeout_s: float = 2.0, ctx: zmq.Context | None = None) -> dict | None:
    """Send ``msg`` to the ROUTER at ``endpoint`` and return the ``info`` of the Status it
    answers with; None on timeout or a malformed answer. ``ctx``: the ZeroMQ context (default
    the process's; one made inside a network namespace connects from there)."""
    ctx = ctx or zmq.Context.instance()
    sock = make_socket(ctx, zmq.DEALER, connect=endpoint, identity=f"ask-{uuid.uuid4().hex[:8]}")
    try:
        send(sock, msg)
        if not sock.poll(int(timeout_s * 1000)):
            return None
        msg = protocol.decode(recv_frames(sock))
        return msg.info if isinstance(msg, protocol.Status) else None
    except (zmq.ZMQError, protocol.ProtocolError):
        return None
    finally:
        sock.close(0)


#: how long a probe of a disconnected peer's endpoint waits to be refused or let in (a host
#: that answers nothing, dead or cut off, is left to the heartbeats)
PROBE_TIMEOUT_S = 0.01


def refused(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S, attempts: int = 3) -> bool:
    """True if nothing listens at ``endpoint`` now: its host refused a connection, or took
    it into a closing listener's backlog and reset it before a greeting. A killed process's
    ports close with it (some a moment after the others: taken in but not greeted, the probe
    tries again, up to ``attempts`` times); a live ZeroMQ listener greets a connection at once
    (ZMTP: its I/O thread, whatever its Python is doing); an unreachable host times out.
    Only the first is proof: the others are False."""
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        family, address = socket.AF_INET6 if host.startswith("[") else socket.AF_INET, (host.strip("[]"), int(port))
    elif endpoint.startswith("ipc://"):
        family, address = socket.AF_UNIX, endpoint[len("ipc://"):]
    else:
        return False  # inproc: the peer is this process
    for _ in range(attempts):
        probe = socket.socket(family, socket.SOCK_STREAM)
        probe.settimeout(timeout_s)
        try:
            probe.connect(address)
        except (ConnectionRefusedError, FileNotFoundError):
            return True
        except OSError:  # a timeout, an unreachable host or network: no evidence either way
            return False
        else:
            try:
                return probe.recv(1) == b""  # closed unread: the listener went
            except ConnectionResetError:
                return True
            except OSError:
                continue  # not greeted yet: a closing listener, or a slow host; ask again
        finally:
            probe.close()
    return False


def disconnect_seen(monitor: zmq.Socket) -> bool:
    """Read every event waiting on a socket monitor (``get_monitor_socket``); True if one
    was a disconnect."""
    from zmq.utils.monitor import recv_monitor_message

    seen = False
    while monitor.poll(0):
        seen |= recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    return seen
