"""A service whose port is taken ends with one line that names the address and the option
that sets it (exit status 2), not a traceback: for a ZeroMQ endpoint of any role, and for
the metrics port."""
from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
import zmq

ANY = "tcp://127.0.0.1:*"


def serve(role: str, cfg: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keel.services.serve", role, "--config", orjson.dumps(cfg).decode()],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("role, option, cfg", [
    ("frontend", "client_endpoint", {"prediction_endpoint": ANY}),
    ("frontend", "prediction_endpoint", {"client_endpoint": ANY}),
    ("dispatcher", "worker_endpoint", {"query_endpoint": ANY}),
])
def test_an_endpoint_in_use_is_one_clear_line(zsock, role, option, cfg):
    taken = zsock(zmq.ROUTER, bind=ANY).getsockopt_string(zmq.LAST_ENDPOINT)
    done = serve(role, {**cfg, option: taken})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert taken in done.stderr and option in done.stderr and "already in use" in done.stderr


def test_a_metrics_port_in_use_is_one_clear_line(zsock):
    taken = zsock(zmq.ROUTER, bind=ANY).getsockopt_string(zmq.LAST_ENDPOINT)
    port = int(taken.rsplit(":", 1)[1])
    done = serve("frontend", {"client_endpoint": ANY, "prediction_endpoint": ANY, "metrics_port": port})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "metrics_port" in done.stderr and str(port) in done.stderr
