"""The frontend's configured limits bound its real memory, measured as the resident set
(VmRSS) of a live frontend process, never the table's own count:

- a large ``predict_batch`` grows it by at most ``dedup_max_bytes`` (plus a margin for the
  interpreter's and ZeroMQ's working memory), and what the de-duplication table held goes
  back to the system once its entries expire;
- clients that connect, send one request and never read pin at most ``max_clients``
  connections' worth, and what they held goes back when they close.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from keel.common import transport
from keel.common.client import Client
from keel.common.protocol import Predict
from keel.common.spec import load_spec
from keel.common.transport import request_status
from keel.common.waiting import wait_until
from keel.deploy.local import free_port_block

pytestmark = pytest.mark.slow

MIB = 1 << 20
#: what the process may grow by beyond the configured limits: the interpreter's free lists
#: and arenas, ZeroMQ's buffers for the load, allocator slack
MARGIN = 24 * MIB


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def start(launcher, tmp_path, name: str, frontend: dict):
    spec = load_spec({
        "cluster": {"name": name, "base_port": free_port_block(), "run_dir": str(tmp_path / name)},
        "frontend": {"cache_size": 0, "log_requests": False, **frontend},
        "models": {"noop": {"builtin": "noop", "input_shape": [4], "output_size": 2}},
    })
    run = launcher(name)
    run.start_spec(spec)
    endpoint = spec.client_endpoints[0]
    with Client(endpoint, timeout_ms=30_000, retries=0) as c:  # warm: what any load allocates once
        c.predict_batch("noop", np.zeros((2000, 4), np.float32))
    return run.procs["frontend"].pid, endpoint


def test_a_large_batch_grows_the_frontend_by_its_dedup_limit_and_expiry_gives_it_back(tmp_path, launcher):
    limit = 4 * MIB
    pid, endpoint = start(launcher, tmp_path, "dedup", {"dedup_max_bytes": limit, "dedup_ttl_s": 3.0})
    time.sleep(4.0)  # the warm-up's entries expire
    before = rss(pid)
    xs = np.random.default_rng(5).random((30_000, 4), dtype=np.float32)
    with Client(endpoint, timeout_ms=60_000, retries=0) as c:
        assert len(c.predict_batch("noop", xs)) == len(xs)
    full = rss(pid)
    info = request_status(endpoint, 5.0)["dedup"]
    assert 0 < info["bytes"] <= limit
    assert full - before <= limit + MARGIN, f"grew {(full - before) / MIB:.1f} MiB for a {limit / MIB:.0f} MiB table"
    released = request_status(endpoint, 5.0)["memory_released"]
    assert wait_until(lambda: request_status(endpoint, 5.0)["dedup"]["entries"] == 0, 20.0, 0.5)
    # the table emptied: the frontend hands what it freed back to the system (a table
    # smaller than the trim step counts too)
    assert wait_until(lambda: request_status(endpoint, 5.0)["memory_released"] > released, 5.0, 0.2)
    after = rss(pid)
    assert after - before <= MARGIN // 2, f"kept {(after - before) / MIB:.1f} MiB with every entry expired"


def test_clients_that_never_read_pin_at_most_max_clients_connections(tmp_path, launcher):
    cap, conns = 150, 1500
    pid, endpoint = start(launcher, tmp_path, "idle", {"max_clients": cap})
    before = rss(pid)
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, conns + 64)
    socks = []
    try:
        for i in range(conns):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RECONNECT_IVL, 1000)
            s.connect(endpoint)
            transport.send(s, Predict(request_id=f"idle{i}", model="noop", input=np.zeros(4, np.float32)))
            socks.append(s)
        time.sleep(3.0)
        info = request_status(endpoint, 5.0)
        assert info is not None and info["clients"] <= cap, info
        assert info["answered"].get("clients_hung_up", 0) > 0
        held = rss(pid)
        # ZeroMQ's per-connection buffers: ~30-50 KB; 64 KB is generous
        assert held - before <= cap * 64 * 1024 + MARGIN, f"grew {(held - before) / MIB:.1f} MiB"
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    time.sleep(2.5)  # disconnects seen, freed memory handed back by the next chore
    after = rss(pid)
    assert after - before <= MARGIN // 2, f"kept {(after - before) / MIB:.1f} MiB with every client gone"
