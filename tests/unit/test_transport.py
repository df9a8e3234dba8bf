"""Socket helpers: frames over the limit are refused before they are read; Peers never
blocks, refuses bad endpoints, and evicts the least recently used peer when full; a probe
of an endpoint is refused only where nothing listens."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from keel.common import protocol, transport
from keel.common.protocol import Status


def test_peers_refuse_bad_endpoints_and_evict_the_least_recently_used():
    ctx = zmq.Context()
    closed: list[zmq.Socket] = []
    peers = transport.Peers(ctx, on_drop=lambda s: (closed.append(s), s.close(0)), limit=3)
    try:
        assert not peers.send("garbage", Status())
        assert not peers.send("tcp://no-port", Status())
        for i in range(3):
            assert peers.get(f"tcp://127.0.0.1:{40000 + i}") is not None
        first = peers.sockets["tcp://127.0.0.1:40000"]
        peers.get("tcp://127.0.0.1:40000")  # used again: no longer the least recent
        assert peers.get("tcp://127.0.0.1:40099") is not None  # a fourth peer: 40001 goes
        assert list(peers.sockets) == ["tcp://127.0.0.1:40002", "tcp://127.0.0.1:40000", "tcp://127.0.0.1:40099"]
        assert len(closed) == 1 and closed[0] is not first
    finally:
        for s in peers.sockets.values():
            s.close(0)
        ctx.term()


def test_a_peer_whose_queue_is_full_does_not_block_the_sender():
    ctx = zmq.Context()
    pull = transport.make_socket(ctx, zmq.PULL, bind="tcp://127.0.0.1:*", hwm=1)
    endpoint = transport.endpoint_of(pull)
    peers = transport.Peers(ctx)
    peers.get(endpoint).setsockopt(zmq.SNDHWM, 1)
    try:
        start = time.monotonic()
        results = [peers.send(endpoint, Status()) for _ in range(10_000)]  # nobody reads
        assert time.monotonic() - start < 30  # returned at all (a blocking send would hang)
        assert not all(results)
    finally:
        for s in peers.sockets.values():
            s.close(0)
        pull.close(0)
        ctx.term()


def test_a_frame_over_the_limit_disconnects_its_sender_before_it_is_read():
    ctx = zmq.Context()
    pull = transport.make_socket(ctx, zmq.PULL, bind="tcp://127.0.0.1:*", max_frame_bytes=1024)
    push = transport.make_socket(ctx, zmq.PUSH, connect=transport.endpoint_of(pull))
    try:
        transport.send(push, protocol.Predict(request_id="big", model="m", input=np.zeros(4096, np.float32)))
        assert not pull.poll(500)
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


def test_frames_sent_and_read_whole_in_order_small_and_large_and_again_when_none():
    ctx = zmq.Context()
    router = transport.make_socket(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*")
    dealer = transport.make_socket(ctx, zmq.DEALER, connect=transport.endpoint_of(router), identity="d1")
    big = np.arange(300_000, dtype=np.float32)  # above pyzmq's copy threshold: sent in place
    try:
        with pytest.raises(zmq.Again):
            transport.recv_nowait(router)
        transport.send_frames(dealer, [b"head", big, b""])
        transport.send_frames(dealer, [b"second"])
        assert router.poll(5000)
        time.sleep(0.05)
        first = transport.recv_nowait(router)
        assert [f.bytes for f in first[:2]] == [b"d1", b"head"] and len(first) == 4 and first[3].bytes == b""
        assert np.array_equal(np.frombuffer(first[2].buffer, np.float32), big)
        assert [f.bytes for f in transport.recv_nowait(router)] == [b"d1", b"second"]  # not run into the first
        with pytest.raises(zmq.Again):
            transport.recv_nowait(router)
        assert transport.try_send_frames(router, [b"nobody", b"x"]) == transport.GONE  # ROUTER_MANDATORY still says so
    finally:
        dealer.close(0)
        router.close(0)
        ctx.term()


def _pair(name: str):
    ctx = zmq.Context.instance()
    pull = transport.make_socket(ctx, zmq.PULL, bind=f"inproc://drain-{name}")
    push = transport.make_socket(ctx, zmq.PUSH, connect=f"inproc://drain-{name}")
    return push, pull


def test_drain_reads_every_message_waiting_and_none_that_is_not():
    push, pull = _pair("all")
    try:
        assert list(transport.drain(pull)) == []  # nothing waiting: nothing, no exception
        for i in range(5):
            push.send_multipart([b"h", str(i).encode()])
        assert pull.poll(1000)
        got = [frames[1].bytes for frames in transport.drain(pull)]
        assert got == [b"0", b"1", b"2", b"3", b"4"]
        push.send(b"one")
        assert pull.poll(1000)
        assert [f[0].bytes for f in transport.drain(pull)] == [b"one"]
    finally:
        push.close(0)
        pull.close(0)


def test_drain_stops_at_its_limit_and_when_its_reader_closes_the_socket():
    push, pull = _pair("limit")
    try:
        for i in range(6):
            push.send(str(i).encode())
        assert pull.poll(1000)
        assert [f[0].bytes for f in transport.drain(pull, limit=4)] == [b"0", b"1", b"2", b"3"]
        assert [f[0].bytes for f in transport.drain(pull, limit=0)] == []
        seen = []
        for frames in transport.drain(pull):
            seen.append(frames[0].bytes)
            pull.close(0)  # a handler that closes its socket (a replaced connection)
        assert seen == [b"4"]
    finally:
        push.close(0)
        pull.close(0)


def test_a_probe_is_refused_only_where_nothing_listens():
    ctx = zmq.Context()
    router = transport.make_socket(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*")
    endpoint = transport.endpoint_of(router)
    mute = socket.socket()  # listens but never accepts nor greets: a host that is slow, not dead
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)
    try:
        assert transport.refused(endpoint) is False  # a live ZeroMQ listener greets the probe
        assert transport.refused(f"tcp://127.0.0.1:{mute.getsockname()[1]}") is False  # no greeting: no proof
        router.close(0)  # its I/O thread closes the port a moment later
        deadline = time.monotonic() + 5.0
        while not transport.refused(endpoint) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert transport.refused(endpoint) is True  # its port closed with it
        assert transport.refused("inproc://anything") is False
    finally:
        mute.close()
        ctx.term()


def test_a_probe_of_a_killed_process_is_refused(tmp_path):
    script = ("import sys, time, zmq\n"
              "s = zmq.Context().socket(zmq.ROUTER); s.bind('tcp://127.0.0.1:*')\n"
              "print(s.getsockopt_string(zmq.LAST_ENDPOINT), flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        endpoint = proc.stdout.readline().strip()
        assert transport.refused(endpoint) is False
        proc.kill()
        proc.wait(timeout=10)
        assert transport.refused(endpoint) is True
        ipc = f"ipc://{tmp_path}/gone"
        assert transport.refused(ipc) is True  # no socket file: nothing listens
    finally:
        proc.kill()
        proc.wait()
