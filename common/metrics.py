"""Prometheus metrics: one registry per process, served on the service's metrics port.

Metric names are ``keel_<what>``; every metric carries the ``service`` label.

Example
-------
>>> m = Metrics("frontend")
>>> m.counter("requests_total", "requests answered", ["source"]).labels(source="model").inc()
"""
from __future__ import annotations

import prometheus_client as prom

#: latency buckets (seconds) from 100 us to 10 s
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Metrics:
    def __init__(self, service: str):
        self.service = service
        self.registry = prom.CollectorRegistry()

    def counter(self, name: str, doc: str, labels: list[str] | None = None):
        metric = prom.Counter(f"keel_{name}", doc, ["service", *(labels or [])], registry=self.registry)
        return _Partial(metric, self.service) if labels else metric.labels(service=self.service)

    def gauge(self, name: str, doc: str, labels: list[str] | None = None):
        metric = prom.Gauge(f"keel_{name}", doc, ["service", *(labels or [])], registry=self.registry)
        return _Partial(metric, self.service) if labels else metric.labels(service=self.service)

    def histogram(self, name: str, doc: str, labels: list[str] | None = None, buckets=LATENCY_BUCKETS):
        metric = prom.Histogram(f"keel_{name}", doc, ["service", *(labels or [])], registry=self.registry, buckets=buckets)
        return _Partial(metric, self.service) if labels else metric.labels(service=self.service)

    def serve(self, port: int | None, addr: str = "127.0.0.1") -> None:
        if port is not None:
            prom.start_http_server(port, addr=addr, registry=self.registry)


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
