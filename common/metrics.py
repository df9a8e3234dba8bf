"""Prometheus metrics: one registry per process, served on the service's metrics port,
beside the health endpoints an orchestrator's probes ask.

Metric names are ``keel_<what>``; every metric carries the ``service`` label; request
metrics of the frontend and the workers carry ``model`` and ``version`` too, so a
rollout can be watched version by version (``model_labels``).

The metrics port answers three paths: ``/metrics`` (the registry), ``/healthz`` (200
while the process runs: a liveness probe) and ``/readyz`` (200 once the service is
registered and serving, else 503: a readiness probe; ``Service.ready``). It binds
``ADDRESS``: loopback by default, the host's address in a multi-host spec (``keel serve
--metrics-address``), so a Prometheus on another host can scrape it.

Example
-------
>>> m = Metrics("frontend")
>>> m.counter("requests_total", "requests answered", ["source"]).labels(source="model").inc()
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from wsgiref.simple_server import make_server

import prometheus_client as prom
from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

#: latency buckets (seconds) from 100 us to 10 s
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

#: the address metrics ports bind unless a service is told another (``serve``'s ``addr``)
ADDRESS = "127.0.0.1"

#: the labels that say which model version a request metric counts
MODEL_LABELS = ["model", "version"]


def model_labels(models: dict, target: str) -> dict[str, str]:
    """``model`` and ``version`` label values of a request to ``target`` at a frontend
    whose models are ``models`` (name -> ModelInfo): empty for a target that is not one
    model (an application, a graph, an unknown name), so label sets stay bounded."""
    info = models.get(target)
    return {"model": target, "version": str(info.version)} if info is not None else {"model": "", "version": ""}


class Metrics:
    def __init__(self, service: str):
        self.service = service
        self.registry = prom.CollectorRegistry()
        self.server: ThreadingWSGIServer | None = None

    def counter(self, name: str, doc: str, labels: list[str] | None = None):
        metric = prom.Counter(f"keel_{name}", doc, ["service", *(labels or [])], registry=self.registry)
        return _Partial(metric, self.service) if labels else metric.labels(service=self.service)

    def gauge(self, name: str, doc: str, labels: list[str] | None = None):
        metric = prom.Gauge(f"keel_{name}", doc, ["service", *(labels or [])], registry=self.registry)
        return _Partial(metric, self.service) if labels else metric.labels(service=self.service)

    def histogram(self, name: str, doc: str, labels: list[str] | None = None, buckets=LATENCY_BUCKETS):
        metric = prom.Histogram(f"keel_{name}", doc, ["service", *(labels or [])], registry=self.registry, buckets=buckets)
        return _Partial(metric, self.service) if labels else metric.labels(service=self.service)

    def serve(self, port: int | None, addr: str | None = None, ready: Callable[[], bool] | None = None) -> None:
        """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``addr:port`` (``ADDRESS``
        when not given) from a daemon thread; nothing when ``port`` is None. ``ready``:
        whether the service is ready (always, when not given). OSError when it is taken."""
        if port is None:
            return
        addr = ADDRESS if addr is None else addr

        class Server(ThreadingWSGIServer):  # its own class: the address family is set per server
            pass

        Server.address_family, addr = _get_best_family(addr, port)
        self.server = make_server(addr, port, health_app(prom.make_wsgi_app(self.registry), ready), Server,
                                  handler_class=_SilentHandler)
        threading.Thread(target=self.server.serve_forever, name=f"metrics-{port}", daemon=True).start()

    def close(self) -> None:
        """Stop serving; the port is free within the server's poll interval (0.5 s),
        which a stopping service does not wait for. Idempotent."""
        server, self.server = self.server, None
        if server is not None:
            def stop() -> None:
                server.shutdown()
                server.server_close()

            threading.Thread(target=stop, name="metrics-close", daemon=True).start()


def health_app(metrics_app: Callable, ready: Callable[[], bool] | None) -> Callable:
    """A WSGI app: ``/healthz`` and ``/readyz`` answered here, every other path by
    ``metrics_app``. A probe's answer is one word, so a person reading it sees why."""

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            ok = True
        elif path == "/readyz":
            try:
                ok = ready is None or bool(ready())
            except Exception:  # a probe must answer; a failing check is "not ready"
                ok = False
        else:
            return metrics_app(environ, start_response)
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"ok\n" if ok else b"not ready\n"]

    return app


class _Partial:
    """A labelled metric with the service label already filled in.

    Children are cached per label values: prometheus-client's own ``labels()`` costs
    ~3 us a call, and the frontend calls it twice per request."""

    def __init__(self, metric, service: str):
        self._metric, self._service = metric, service
        self._children: dict[tuple, object] = {}

    def labels(self, **labels):
        key = tuple(labels.values())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._metric.labels(service=self._service, **labels)
        return child
