"""OpenTelemetry traces of sampled requests, hop by hop (the ``otel`` extra).

Off by default, and then free: every hook on the request path is behind one attribute
check (``tracing.ON``, or a message's ``traceparent`` that is None), and nothing of
OpenTelemetry is imported. On (``[tracing]`` in a spec: ``keel serve --trace-rate R
--trace-endpoint URL``), the frontend samples requests at the rate, or follows the W3C
``traceparent`` a request carries (``Client.predict(..., traceparent=...)``; the HTTP
gateway's ``traceparent`` header, gRPC metadata key): a sampled request opens a span at the
frontend (``keel.request``, until its answer leaves) and rides the same path a
breakdown's stamps do (``Predict.trace``: each process stamps its receipt and send), with
its span's context beside them (``traceparent`` on ``Queries``, ``Batch``,
``Predictions``). Each hop that sends it on adds its span from its receipt to its send:
``keel.dispatcher`` (the queue and the batching) and ``keel.worker`` (the batch's
compute). A reconstruction (ParM): the dispatcher's copy of a sampled batch carries its
context to the encoder, whose ``keel.encoder`` span (from the batch's dispatch to its
coding group's parity batch leaving, ``encoded``) rides in the parity batch's members
(``MemberBatch.traceparent``) through the parity worker to the decoder; rebuilding that
member adds ``keel.decoder`` (from the group's first output there to the reconstruction
leaving), and the answer ends the request span with ``keel.source`` saying so. A graph
(HAMS): the graph route samples a request as it enters the graph (``graph_admit``: its
``keel.request`` span carries ``keel.graph`` and ``keel.origin``), its ``GraphRequest``
carries the context, and each operator adds ``keel.operator`` from its first receipt of
the origin to its first output of it, whose context its outputs carry on. Spans carry
``keel.request_id``, ``keel.qid``, ``keel.model``; they leave over OTLP/HTTP to the
spec's endpoint, batched off the request path. ``span`` is for a hop that has no stamps.

Example
-------
>>> configure(rate=1.0, endpoint=None)                  # doctest: +SKIP
>>> start("frontend", exporter=InMemorySpanExporter())  # doctest: +SKIP
"""
from __future__ import annotations

import random
import re
import time
from dataclasses import replace
from typing import Any

#: whether this process traces; the one check a hop makes when tracing is off
ON = False
#: the W3C trace context's header (and a message's field): version-trace id-span id-flags
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: spans held open between a hop's receipt and its send, at most (a sampled query that
#: expired or was re-queued never sends: the oldest is dropped)
MAX_OPEN = 1024

_settings: dict[str, Any] = {}
_tracer: Any = None
_provider: Any = None
#: (service, qid) -> an open request span (the frontend's) or a receipt's parent context
_open: dict[tuple[str, int], Any] = {}


def valid(traceparent: Any) -> bool:
    """Whether ``traceparent`` is a W3C ``traceparent`` value Keel carries (version 00)."""
    return isinstance(traceparent, str) and TRACEPARENT.match(traceparent) is not None


def configure(rate: float | None, endpoint: str | None) -> None:
    """What ``start`` will set up: the share of requests the frontends sample (0..1) and
    the OTLP/HTTP traces endpoint (``http://collector:4318/v1/traces``). Rate None or 0
    leaves tracing off, even for a request that carries a sampled ``traceparent``."""
    _settings.clear()
    if rate:
        if not 0 < rate <= 1:
            raise ValueError(f"trace rate must be in (0, 1], got {rate}")
        _settings.update(rate=rate, endpoint=endpoint)


def start(service: str, exporter: Any = None, rate: float | None = None) -> bool:
    """Turn tracing on for this process (``service`` names it in every span) when
    ``configure`` (or ``rate``) asked for it; ``exporter``: where spans go instead of
    OTLP (tests: an ``InMemorySpanExporter``, exported as each span ends). Whether on."""
    global ON, _tracer, _provider
    if ON:  # one provider a process (services built in one process share it: tests)
        return True
    if rate is not None:
        _settings["rate"] = rate
    if not _settings.get("rate"):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    _provider = TracerProvider(resource=Resource.create({"service.name": service, "service.namespace": "keel"}))
    if exporter is not None:
        _provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = _settings.get("endpoint")
        _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()))
    _tracer = _provider.get_tracer("keel")
    ON = True
    return True


def stop() -> None:
    """Export what is pending and turn tracing off (a stopping service; tests)."""
    global ON, _tracer, _provider
    ON, _tracer = False, None
    _open.clear()
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def _context(traceparent: str | None):
    """The OpenTelemetry context whose parent is ``traceparent`` (none: a new trace)."""
    if traceparent is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def _traceparent(span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _ns(wall_s: float) -> int:
    return int(wall_s * 1e9)


def _hold(key: tuple[str, int], value: Any) -> None:
    _open[key] = value
    if len(_open) > MAX_OPEN:
        old = _open.pop(next(iter(_open)))
        if hasattr(old, "end"):  # a request span that never got its answer: end it, said so
            old.set_attribute("keel.unanswered", True)
            old.end()


def admit(service: str, qid: int, msg: Any, traces: dict[int, list[float]], received: float) -> None:
    """At a frontend's admission of ``msg`` (a ``Predict`` of a model) as query ``qid``:
    sample it (its ``traceparent``'s sampled flag when it has one, else the rate); a
    sampled one opens its ``keel.request`` span and rides the stamps' path (``traces``,
    as a breakdown's request does) with its context."""
    span = _request_span(msg, received, {"keel.model": msg.model, "keel.qid": qid})
    if span is None:
        return
    _hold((service, qid), span)
    if msg.trace is None:  # a breakdown's stamps are the frontend's own; else start them here
        traces[qid] = [received]


def _request_span(msg: Any, received: float, attributes: dict[str, Any]) -> Any:
    """A sampled ``msg``'s ``keel.request`` span (its ``traceparent``'s sampled flag when
    it has one, else the rate); None when it is not sampled."""
    parent = getattr(msg, "traceparent", None)
    if parent is not None:
        if not valid(parent) or parent.endswith("-00"):  # the caller did not sample it
            return None
    elif random.random() >= _settings.get("rate", 0.0):
        return None
    return _tracer.start_span("keel.request", context=_context(parent), start_time=_ns(received),
                              attributes={"keel.request_id": msg.request_id, **attributes})


def context_of(service: str, qid: int) -> str | None:
    """The ``traceparent`` a frontend sends with sampled query ``qid`` (its request span's)."""
    span = _open.get((service, qid))
    return _traceparent(span) if span is not None and hasattr(span, "end") else None


def answered(service: str, qid: int, source: str, version: str | None) -> None:
    """A frontend's answer to ``qid`` left: its request span ends (if it was sampled)."""
    span = _open.pop((service, qid), None)
    if span is not None and hasattr(span, "end"):
        span.set_attribute("keel.source", str(source))
        if version is not None:
            span.set_attribute("keel.version", str(version))
        span.end()


# HAMS service graphs: a request is a graph's origin (the frontend's seq) at every operator
# it passes; an operator's span runs from its first receipt of the origin to its first
# output of it (a join's inputs, a batch's rows and a fan-out's sends share it).

def graph_admit(route: str, origin: int, msg: Any) -> str | None:
    """At a frontend's graph route ``route``: sample ``msg`` (a ``Predict``) entering the
    graph as ``origin``; a sampled one opens its ``keel.request`` span. The context its
    ``GraphRequest`` carries, or None."""
    span = _request_span(msg, time.time(), {"keel.graph": route, "keel.origin": origin})
    if span is None:
        return None
    _hold(("graph", route, origin), span)
    return _traceparent(span)


def graph_answered(route: str, origin: int, source: str) -> None:
    """A graph route answered ``origin``: its request span ends (if it was sampled)."""
    span = _open.pop(("graph", route, origin), None)
    if span is not None and hasattr(span, "end"):
        span.set_attribute("keel.source", str(source))
        span.end()


def operator_received(operator: str, msg: Any) -> None:
    """An operator received ``msg`` (a ``GraphRequest`` with a context): the first receipt
    of its origin opens the operator's span."""
    key = ("graph", operator, msg.origin)
    if key not in _open:
        _hold(key, (msg.traceparent, time.time()))


def operator_sent(operator: str, msg: Any) -> None:
    """An operator sends ``msg``, an output of a sampled origin: its ``keel.operator`` span
    ends at the first, and every output carries that span's context."""
    key = ("graph", operator, msg.origin)
    held = _open.get(key)
    if held is None:
        return
    if isinstance(held, tuple):
        parent, start = held
        held = _open[key] = span(operator, "operator", parent, start, origin=msg.origin, operator=operator)
    msg.traceparent = held


def received(service: str, qid: int, traceparent: str) -> None:
    """A hop received sampled query ``qid`` with its parent's context."""
    _hold((service, qid), traceparent)


def sent(service: str, hop: str, msg: Any) -> None:
    """A hop sends ``msg`` (whose ``traced`` query it received with a context, and whose
    ``trace`` stamps end with that receipt and this send): its span, from the one to the
    other, and the span's context on ``msg`` for the next hop."""
    parent = _open.pop((service, msg.traced), None)
    if parent is None or msg.trace is None or len(msg.trace) < 2:
        return
    span = _tracer.start_span(f"keel.{hop}", context=_context(parent), start_time=_ns(msg.trace[-2]),
                              attributes={"keel.qid": msg.traced, "keel.model": msg.model, "keel.service": service})
    span.end(end_time=_ns(msg.trace[-1]))
    msg.traceparent = _traceparent(span)


def span(service: str, hop: str, traceparent: str, start_s: float, end_s: float | None = None, **attributes: Any) -> str:
    """A span of ``hop`` under ``traceparent`` from ``start_s`` to ``end_s`` (wall clock,
    now when None) that no stamps describe (a decoder's reconstruction); its context."""
    span_ = _tracer.start_span(f"keel.{hop}", context=_context(traceparent), start_time=_ns(start_s),
                               attributes={"keel.service": service, **{f"keel.{k}": v for k, v in attributes.items()}})
    span_.end(end_time=_ns(time.time() if end_s is None else end_s))
    return _traceparent(span_)


def encoded(service: str, members: list[Any], parity: Any) -> None:
    """An encoder sends ``parity``, the parity batch of the coding group whose query
    batches are ``members`` (None: absent): each sampled member (its dispatcher's copy
    carries a context) gets a ``keel.encoder`` span from its dispatch to now, and its
    entry in ``parity.members`` that span's context for the decoder."""
    batches, now = parity.members.batches, time.time()
    for i, b in enumerate(members):
        if b is not None and b.traceparent is not None:
            start = b.trace[-1] if b.trace else (b.sent_at or now)
            ctx = span(service, "encoder", b.traceparent, start, now, qid=b.traced, model=b.model,
                       group=parity.group.group, index=i)
            batches[i] = replace(batches[i], traced=b.traced, traceparent=ctx)
