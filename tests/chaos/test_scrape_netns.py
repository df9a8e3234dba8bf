"""Operable across hosts (netns): a two-host spec with metrics ports, each host a network
namespace. A Prometheus-like scrape from a third namespace reads the worker's metrics,
with the ``model`` and ``version`` labels of the batches it ran, and its ``/healthz`` and
``/readyz`` (ready: registered with its dispatcher); the frontend's request metrics
carry them too. A metrics port bound to loopback (the one-machine default) could not be
reached from there. Host a binds every interface while its endpoints advertise its
address (the bind/advertise split): the worker on b and the client reach it there."""
from __future__ import annotations

import numpy as np
import pytest

from keel.chaos.deployment import Deployment
from keel.chaos.netns import in_netns

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

SPEC = {
    "cluster": {"name": "scrape", "metrics_base_port": 9400},
    # addresses replaced by the namespaces'; a binds every interface, advertises its address
    "hosts": {"a": {"address": "127.0.0.1", "bind": "0.0.0.0"}, "b": "127.0.0.1"},
    "frontend": {"host": "a"},
    "dispatcher": {"host": "a"},
    "logs": {"worker": "debug"},
    "models": {"m": {"builtin": "noop", "input_shape": [4], "output_size": 3, "workers": 1, "hosts": ["b"]}},
}


def http_get(cluster, host: str, address: str, port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET ``path`` from inside ``host``'s namespace."""
    sock = cluster.connect(host, address, port, timeout=5.0)
    try:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    finally:
        sock.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


def predict(cluster, endpoint: str, n: int) -> list:
    from keel.common.client import Client

    def run():
        with Client([endpoint], timeout_ms=5000) as client:
            return [client.predict("m", np.ones(4, np.float32)) for _ in range(n)]

    return in_netns(cluster.host("client").ns, run)


def test_a_worker_is_scraped_and_probed_from_another_namespace(clusters):
    cluster = clusters(hosts=("a", "b", "client"), netns=True)
    dep = Deployment(cluster, SPEC, probe_host="client").start(timeout_s=60)
    worker, frontend = dep.spec.service("worker-m-0"), dep.spec.service("frontend")
    b, a = cluster.addresses["b"], cluster.addresses["a"]
    assert worker.metrics_address == b and frontend.metrics_address == "0.0.0.0"  # the host's, not loopback
    assert frontend.bind == "0.0.0.0" and worker.bind is None
    assert dep.frontends[0].startswith(f"tcp://{a}:")  # advertised: the worker on b reached the dispatcher there
    assert worker.config.dispatcher_worker_endpoint.startswith(f"tcp://{a}:")
    assert worker.log_level == "debug" and frontend.log_level is None

    assert http_get(cluster, "client", b, worker.config.metrics_port, "/healthz") == (200, "ok\n")
    assert http_get(cluster, "client", b, worker.config.metrics_port, "/readyz") == (200, "ok\n")
    assert http_get(cluster, "client", a, frontend.config.metrics_port, "/readyz") == (200, "ok\n")

    results = predict(cluster, dep.frontends[0], 5)
    assert all(r.error is None for r in results), results

    status, text = http_get(cluster, "client", b, worker.config.metrics_port, "/metrics")
    assert status == 200
    ok = 'keel_worker_batches_total{model="m",outcome="ok",service="worker-m-0",version="1"}'
    assert ok in text, text
    served = [line for line in text.splitlines() if line.startswith("keel_worker_service_seconds_count{")]
    assert served and 'model="m"' in served[0] and 'version="1"' in served[0], served
    status, text = http_get(cluster, "client", a, frontend.config.metrics_port, "/metrics")
    counted = [line for line in text.splitlines()
               if line.startswith("keel_requests_total{") and 'target="m"' in line and 'version="1"' in line]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in counted) == 5.0, counted  # model and cache answers
