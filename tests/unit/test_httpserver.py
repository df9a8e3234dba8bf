"""The gateway's HTTP/1.1 server (services/httpserver.py) over real loopback sockets:
keep-alive, pipelining in order, Expect: 100-continue, limits, malformed requests, HEAD,
HTTP/1.0, a failing handler, and a close that lets the answers being made finish."""
from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from keel.services.httpserver import MAX_HEAD_BYTES, MAX_PIPELINED, HTTPError, HTTPServer, Request, Response, Router

LIMIT = 1000


def refuse(status: int, message: str, headers: dict) -> Response:
    return Response(status, orjson.dumps({"error": message}), "application/json", headers)


class App:
    """Echoes what it was asked; ``/slow`` answers after 50 ms, ``/fail`` raises."""

    def __init__(self):
        self.seen: list[Request] = []

    async def handle(self, request: Request) -> Response:
        self.seen.append(request)
        if request.path == "/slow":
            await asyncio.sleep(0.05)
        if request.path == "/fail":
            raise RuntimeError("boom")
        return Response(200, f"{request.method} {request.path} {len(request.body)}".encode(), "text/plain",
                        {"X-Query": request.query})


def serve(test, app: App | None = None):
    """Run ``test(port, app)`` against a server on a free port, then close it; an error the
    loop caught (an exception out of a protocol callback or a task) fails the test."""
    app = app or App()
    errors: list[dict] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        server = HTTPServer(app.handle, refuse, max_body_bytes=LIMIT)
        port = await server.start("127.0.0.1", 0)
        try:
            return await asyncio.wait_for(test(port, app), 10)
        finally:
            await server.close(grace_s=1.0)

    result = asyncio.run(main())
    assert not errors, errors
    return result


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    """(status, headers with lower-case names, body) of one answer."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in head[1:] if line)
    headers = {k.lower(): v for k, v in headers.items()}
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return int(head[0].split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 2) == b""


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_keep_alive_answers_each_request_with_what_it_asked():
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/a?x=1", b"hello", "X-Thing: 1\r\nx-thing: 2\r\n"))
        status, headers, body = await read_answer(reader)
        assert (status, body, headers["x-query"]) == (200, b"POST /a 5", "x=1")
        assert headers["content-type"] == "text/plain" and "date" in headers and "connection" not in headers
        writer.write(post("/b", b""))
        status, headers, body = await read_answer(reader)
        assert (status, body, headers["x-query"]) == (200, b"POST /b 0", "")
        assert app.seen[0].headers["x-thing"] == "1, 2" and app.seen[0].body == b"hello"
        assert [r.path for r in app.seen] == ["/a", "/b"]
        writer.close()

    serve(test)


def test_pipelined_requests_are_answered_in_order():
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/slow", b"1") + post("/fast", b"22") + post("/slow", b"333"))
        bodies = [(await read_answer(reader))[2] for _ in range(3)]
        assert bodies == [b"POST /slow 1", b"POST /fast 2", b"POST /slow 3"]
        writer.close()

    serve(test)


def test_expect_100_continue_is_answered_before_the_body_is_sent():
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abc")
        assert (await read_answer(reader))[2] == b"POST /e 3"
        writer.close()

    serve(test)


@pytest.mark.parametrize("request_bytes", [
    post("/big", b"x" * (LIMIT + 1)),  # told by Content-Length: refused before the body is read
    b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"  # chunked: refused once past the limit
    + b"".join(b"%x\r\n%s\r\n" % (300, b"y" * 300) for _ in range(4)) + b"0\r\n\r\n",
], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_a_413_and_the_connection_closes(request_bytes):
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/ok", b"first") + request_bytes)
        assert (await read_answer(reader))[2] == b"POST /ok 5"  # what came before is answered first
        status, headers, body = await read_answer(reader)
        assert status == 413 and headers["connection"] == "close" and "too large" in orjson.loads(body)["error"]
        assert await closed(reader)
        assert [r.path for r in app.seen] == ["/ok"]

    serve(test)


def test_a_413_reaches_a_client_that_sends_its_whole_body_before_reading():
    """The server answers 413 from the head and closes; a client still writing a large body
    must read that answer, not a reset (the server reads and drops the rest first)."""
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        size = 4 << 20
        writer.write(f"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
        await writer.drain()
        await asyncio.sleep(0.2)  # refused and answered by now
        for _ in range(size // 65536):
            writer.write(b"z" * 65536)
            await writer.drain()
        status, headers, body = await read_answer(reader)
        assert status == 413 and headers["connection"] == "close" and "too large" in orjson.loads(body)["error"]
        assert await closed(reader) and app.seen == []
        writer.close()

    serve(test)


def test_a_chunked_body_within_the_limit_is_read_whole():
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        assert (await read_answer(reader))[2] == b"POST /c 5"
        assert app.seen[0].body == b"abcde"
        writer.close()

    serve(test)


@pytest.mark.parametrize("request_bytes, status", [
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nX-Long: " + b"a" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n", 431),
], ids=["garbage", "bad-length", "head-too-long"])
def test_a_malformed_request_is_refused_and_the_server_goes_on(request_bytes, status):
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        got, headers, body = await read_answer(reader)
        assert got == status and orjson.loads(body)["error"] and headers["connection"] == "close"
        assert await closed(reader)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # a new connection is served
        writer.write(post("/after", b""))
        assert (await read_answer(reader))[0] == 200
        writer.close()
        assert [r.path for r in app.seen] == ["/after"]

    serve(test)


def test_head_has_the_length_but_no_body_and_http_1_0_closes():
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n" + post("/next", b""))
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"Content-Length: 9\r\n" in head  # the length GET's body would have ("HEAD /h 0")
        assert (await read_answer(reader))[2] == b"POST /next 0"  # no body came between
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /old HTTP/1.0\r\n\r\n")
        status, headers, _ = await read_answer(reader)
        assert status == 200 and headers["connection"] == "close" and await closed(reader)

    serve(test)


def test_a_failing_handler_is_a_500_and_the_connection_goes_on():
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/fail", b"") + post("/ok", b""))
        status, _, body = await read_answer(reader)
        assert status == 500 and "RuntimeError" in orjson.loads(body)["error"]
        assert (await read_answer(reader))[0] == 200
        writer.close()

    serve(test)


def test_close_lets_the_answers_being_made_finish():
    app = App()

    async def main():
        server = HTTPServer(app.handle, refuse, max_body_bytes=LIMIT)
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/slow", b""))
        while not app.seen:
            await asyncio.sleep(0.001)
        await server.close(grace_s=2.0)
        status, headers, body = await read_answer(reader)
        assert status == 200 and body == b"POST /slow 0"
        assert await closed(reader)
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)

    asyncio.run(main())


def test_router_matches_segments_and_says_which_methods_a_path_takes():
    r = Router()
    r.add("GET", "/v2/models/{model}", "meta")
    r.add("POST", "/v2/models/{model}/versions/{version}/infer", "infer")
    assert r.resolve("GET", "/v2/models/a%2Fb") == ("meta", {"model": "a/b"})
    assert r.resolve("HEAD", "/v2/models/m") == ("meta", {"model": "m"})
    assert r.resolve("POST", "/v2/models/m/versions/2/infer") == ("infer", {"model": "m", "version": "2"})
    for path in ("/v2/models/m/versions//infer", "/v2/models/", "/v2/models/m/", "/other"):
        with pytest.raises(HTTPError) as exc:
            r.resolve("GET", path)
        assert exc.value.status == 404, path
    with pytest.raises(HTTPError) as exc:
        r.resolve("GET", "/v2/models/m/versions/2/infer")
    assert exc.value.status == 405 and exc.value.headers == {"Allow": "POST"}


def test_more_pipelined_requests_than_it_reads_ahead_are_all_answered_in_order():
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n = 3 * MAX_PIPELINED
        writer.write(b"".join(post(f"/p{i}", b"x" * i) for i in range(n)))  # reading pauses past MAX_PIPELINED
        bodies = [(await read_answer(reader))[2] for _ in range(n)]
        assert bodies == [f"POST /p{i} {i}".encode() for i in range(n)]
        writer.close()

    serve(test)


@pytest.mark.parametrize("request_bytes", [
    # both lengths: a request smuggled past a proxy that reads the other one
    b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n",
    b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
    b"GET /s HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
], ids=["length-and-chunked", "two-lengths", "space-in-name"])
def test_ambiguous_requests_are_refused(request_bytes):
    async def test(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        status, _, _ = await read_answer(reader)
        assert status == 400 and await closed(reader)
        assert app.seen == []

    serve(test)


def test_random_bytes_never_stop_the_server():
    rng = random.Random(7)
    good = post("/ok", b"body", "X-A: 1\r\n")

    async def test(port, app):
        for i in range(200):
            data = bytearray(good * 2)
            for _ in range(rng.randint(1, 6)):  # flip, drop or insert bytes anywhere
                at = rng.randrange(len(data))
                op = rng.choice("fdi")
                if op == "f":
                    data[at] = rng.randrange(256)
                elif op == "d":
                    del data[at]
                else:
                    data.insert(at, rng.randrange(256))
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(bytes(data))
            writer.write_eof()
            answers = await asyncio.wait_for(reader.read(), 5)  # whatever came, the server ended its side
            assert answers == b"" or answers.startswith(b"HTTP/1.1 "), answers[:80]
            writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(good)
        assert (await read_answer(reader))[0] == 200
        writer.close()

    serve(test)
