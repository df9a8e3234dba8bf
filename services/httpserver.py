"""The gateway's HTTP/1.1 server: asyncio's transports and httptools' parser (llhttp, the
parser uvicorn uses), one handler coroutine for every request.

What it does: keep-alive, pipelining (requests of a connection answered in order, one at a
time), ``Expect: 100-continue``, chunked request bodies (httptools decodes them), ``HEAD``
on every ``GET`` route, bounded request head and body (413 and 431 before the body is read
past the limit; the rest of a refused request read and dropped before the close, so the
client reads the answer), TLS (``ssl``), idle connections closed after ``keepalive_s``. What it
does not: HTTP/2, protocol upgrades (a request asking one is answered over HTTP/1.1 and the
connection closes), streaming bodies (a request is read whole, then handled). A connection
that closes while its request is handled cancels the handler's task (``CancelledError`` in
the handler): the gateway's Keel calls are cancelled with it.

Why not aiohttp (the gateway's server before): one one-row infer, one request outstanding,
cost aiohttp's request and response objects, router and middleware 108-130 µs of the
gateway's CPU for a trivial handler, against 18-20 µs here (docs/results/core.md), and the
gateway is on the HTTP caller's path with every request.

``Router`` maps ``(method, path)`` to a handler and the path's ``{name}`` segments
(``match_info``, percent-decoded); no route is ``HTTPError(404)``, a route without the
method ``HTTPError(405)`` with its ``Allow`` header.

Example
-------
>>> r = Router()
>>> r.add("GET", "/v2/models/{model}", "metadata")
>>> r.resolve("GET", "/v2/models/m%20x")
('metadata', {'model': 'm x'})
>>> try:
...     r.resolve("POST", "/v2/models/m")
... except HTTPError as exc:
...     print(exc.status, exc.headers)
405 {'Allow': 'GET, HEAD'}
"""
from __future__ import annotations

import asyncio
import collections
import email.utils
import http
import ssl as ssl_
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import unquote

import httptools

from keel.common.inputs import short

__all__ = ["HTTPError", "HTTPServer", "Request", "Response", "Router", "run"]

#: the request line and headers together may not be longer than this (431 past it)
MAX_HEAD_BYTES = 64 * 1024
#: requests of one connection parsed ahead of the one being handled (reading pauses past it)
MAX_PIPELINED = 16
#: how often idle connections are looked for
SWEEP_S = 5.0
#: after refusing a request whose rest may still be arriving (a body over the limit, a
#: malformed head), how long what the client still sends is read and dropped before the
#: connection closes (``_Connection._linger``)
LINGER_S = 2.0

#: each status's line, made once
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in http.HTTPStatus}


def run(main: Coroutine) -> Any:
    """Run ``main`` (a server's life) to its end on uvloop's event loop where it is installed
    (a dependency on Linux and macOS: its loop turns and socket writes are C, which took a
    one-row infer's gateway CPU from ~320 to ~295 µs, docs/results/core.md), on asyncio's
    own elsewhere."""
    try:
        from uvloop import new_event_loop
    except ImportError:
        new_event_loop = None
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


class HTTPError(Exception):
    """A request refused by the server or its router, before any handler: its status, why,
    and headers the answer must carry (``Allow`` for a 405)."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class Request:
    """One request, read whole. ``headers`` keys are lower case (a repeated header's values
    joined by ", "); ``match_info`` is set by the router."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "match_info")

    def __init__(self, method: str, path: str, query: str, headers: dict, body: bytes, keep_alive: bool):
        self.method, self.path, self.query, self.headers = method, path, query, headers
        self.body, self.keep_alive = body, keep_alive
        self.match_info: dict[str, str] = {}


class Response:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int = 200, body: bytes = b"", content_type: str | None = None,
                 headers: dict | None = None):
        self.status, self.body, self.content_type, self.headers = status, body, content_type, headers


Handler = Callable[[Request], Awaitable[Response]]


class Router:
    """Routes by path segments: a pattern's ``{name}`` matches one non-empty segment. The
    last ``CACHED`` paths resolved are kept (a client asks the same few paths again and
    again; the cache is emptied when full, so odd paths cannot grow it)."""

    CACHED = 1024

    def __init__(self):
        self.routes: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self.cache: dict[tuple[str, str], tuple[Any, dict[str, str]]] = {}

    def add(self, method: str, pattern: str, handler: Any) -> None:
        segments = tuple(pattern.split("/"))
        for known, methods in self.routes:
            if known == segments:
                methods[method] = handler
                break
        else:
            self.routes.append((segments, {method: handler}))
        self.cache.clear()

    def resolve(self, method: str, path: str) -> tuple[Any, dict[str, str]]:
        """(handler, match_info); ``HTTPError`` 404 or 405. The match_info is shared by the
        requests of one path: read it, do not change it."""
        found = self.cache.get((method, path))
        if found is None:
            if len(self.cache) >= self.CACHED:
                self.cache.clear()
            found = self.cache[method, path] = self._resolve(method, path)
        return found

    def _resolve(self, method: str, path: str) -> tuple[Any, dict[str, str]]:
        parts = path.split("/")
        for segments, methods in self.routes:
            if len(segments) != len(parts):
                continue
            match: dict[str, str] = {}
            for want, got in zip(segments, parts):
                if want.startswith("{"):
                    if not got:
                        break
                    match[want[1:-1]] = unquote(got, errors="replace")
                elif want != got:
                    break
            else:
                handler = methods.get("GET" if method == "HEAD" else method)
                if handler is None:
                    allowed = sorted(methods) + (["HEAD"] if "GET" in methods else [])
                    raise HTTPError(405, f"{method} is not allowed on {short(path)}", {"Allow": ", ".join(allowed)})
                return handler, match
        raise HTTPError(404, f"no such path: {method} {short(path)}")


class _Date:
    """The ``Date`` header, formatted once a second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.value = second, email.utils.formatdate(second, usegmt=True).encode()
        return cls.value


class HTTPServer:
    """Serves ``handle`` on ``host:port``. ``handle`` answers every request (a failure
    included); ``refuse(status, message, headers)`` makes the answer to a request the server
    itself turns away (malformed, too large, an upgrade asked)."""

    def __init__(self, handle: Handler, refuse: Callable[[int, str, dict], Response], *, max_body_bytes: int,
                 keepalive_s: float = 75.0, server_name: str = "keel"):
        self.handle, self.refuse = handle, refuse
        self.max_body_bytes, self.keepalive_s = max_body_bytes, keepalive_s
        self.too_large = f"the body is too large: over this server's max_body_bytes ({max_body_bytes})"
        self.server_line = f"Server: {server_name}\r\n".encode()
        self.connections: set[_Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, ssl: ssl_.SSLContext | None = None) -> int:
        """Listen; returns the bound port (``port`` 0: any)."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Connection(self), host, port, ssl=ssl, reuse_address=True)
        self.sweeper = loop.call_later(SWEEP_S, self._sweep)
        return self.server.sockets[0].getsockname()[1]

    def _sweep(self) -> None:
        """Close connections idle (nothing being read or answered) past ``keepalive_s``."""
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.idle() and now - conn.last > self.keepalive_s:
                conn.close()
        self.sweeper = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop listening, let the requests being answered finish (``grace_s`` at most), close
        every connection."""
        if self.sweeper is not None:
            self.sweeper.cancel()
        if self.server is not None:
            self.server.close()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for conn in list(self.connections):
            conn.close()
        if self.server is not None:
            await self.server.wait_closed()


class _TooLarge(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


class _Connection(asyncio.Protocol):
    """One client connection: parses requests into ``queue`` and answers them in order."""

    def __init__(self, server: HTTPServer):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque = collections.deque()  # Requests, then maybe one refusal (a Response)
        self.task: asyncio.Task | None = None
        self.closed = False
        self.stopped = False  # parsing ended: a refusal or an upgrade; the connection closes once answered
        self.reading = True
        self.writable: asyncio.Event | None = None  # set while the transport takes writes
        self.last = time.monotonic()
        self._begin()

    # ---------------------------------------------------------------- transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.queue.clear()
        if self.writable is not None:
            self.writable.set()
        if self.task is not None:  # the client hung up mid-request: nobody reads its answer, so stop it
            self.task.cancel()     # (the gateway's calls then cancel their Keel requests)

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = asyncio.Event()
        self.writable.clear()

    def resume_writing(self) -> None:
        if self.writable is not None:
            self.writable.set()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True

    def _linger(self) -> None:
        """Close after a refusal without resetting the connection: the answer is written,
        then the writing side closed (FIN, where the transport can: not over TLS), and what
        the client still sends is read and dropped (``stopped``) until it closes, or for
        ``LINGER_S``. Closed at once with bytes unread, the connection is reset, and a
        client still writing its body gets a broken pipe and never reads the answer."""
        if self.closed or self.transport is None:
            return
        self.closed = True  # nothing more is served or written
        if not self.reading:
            self.reading = True
            self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.close)

    def idle(self) -> bool:
        return self.task is None and not self.queue

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.stopped:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, _TooLarge):
                raise
            self._stop(self.server.refuse(cause.status, cause.message, {}))
        except httptools.HttpParserUpgrade:
            self._stop(None)  # what was asked before the upgrade is answered, then the connection closes
        except httptools.HttpParserError as exc:
            self._stop(self.server.refuse(400, f"malformed HTTP request: {exc}", {}))

    def _stop(self, refusal: Response | None) -> None:
        """Parse nothing more; answer what is queued, then ``refusal`` if any, then close."""
        self.stopped = True
        if refusal is not None:
            self.queue.append(refusal)
        self._serve_soon()

    # ---------------------------------------------------------------- parser callbacks

    def _begin(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.head_bytes = self.body_bytes = 0

    def on_message_begin(self) -> None:
        self._begin()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _TooLarge(431, f"the request's line and headers are longer than {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body_bytes:
            raise _TooLarge(413, self.server.too_large)
        if self.headers.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.server.max_body_bytes:
            raise _TooLarge(413, self.server.too_large)
        self.body.append(body)

    def on_message_complete(self) -> None:
        target = self.url.decode("latin-1")
        path, _, query = target.partition("?")
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.queue.append(Request(self.parser.get_method().decode("latin-1"), path, query, self.headers, body,
                                  self.parser.should_keep_alive()))
        if len(self.queue) > MAX_PIPELINED and self.reading:
            self.reading = False
            self.transport.pause_reading()
        self._serve_soon()

    # ---------------------------------------------------------------- answers

    def _serve_soon(self) -> None:
        if self.task is None and self.queue and not self.closed:
            self.task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        try:
            while self.queue and not self.closed:
                item = self.queue.popleft()
                if not self.reading and len(self.queue) <= MAX_PIPELINED // 2:
                    self.reading = True
                    self.transport.resume_reading()
                if isinstance(item, Response):  # the server's refusal: the last answer
                    self._write(item, head_only=False, keep_alive=False)
                    self._linger()
                    return
                try:
                    response = await self.server.handle(item)
                except Exception as exc:  # the handler answers its own failures; this is the last net
                    response = self.server.refuse(500, f"the server failed on this request: {type(exc).__name__}", {})
                keep = item.keep_alive and not (self.stopped and not self.queue)
                self._write(response, item.method == "HEAD", keep)
                if not keep:
                    self.close()
                    return
                if self.writable is not None and not self.writable.is_set():
                    await self.writable.wait()
            if self.stopped:
                self.close()
        finally:
            self.task = None
            self.last = time.monotonic()

    def _write(self, response: Response, head_only: bool, keep_alive: bool) -> None:
        if self.closed:
            return
        body = response.body
        head = [_STATUS_LINES.get(response.status) or b"HTTP/1.1 %d Unknown\r\n" % response.status,
                b"Date: ", _Date.now(), b"\r\n", self.server.server_line,
                b"Content-Length: %d\r\n" % len(body)]
        if response.content_type is not None:
            head.append(f"Content-Type: {response.content_type}\r\n".encode())
        if response.headers:
            head.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in response.headers.items())
        if not keep_alive:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        if not head_only:
            head.append(body)
        self.transport.write(b"".join(head))
