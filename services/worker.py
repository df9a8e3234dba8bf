"""Model worker: a Clipper model container behind ``predict_batch``.

A worker connects a DEALER to the dispatcher's ROUTER, registers its slots (credits), and
receives a batch only when it has a free slot. Predictions go straight to each query's
frontend (PUSH), never through the dispatcher; a ``Done`` back to the dispatcher frees the
slot and carries the batch's service time for AIMD. For coded models it also pushes a
copy of each prediction batch to the decoder (ParM). A model exception answers that batch
with an error and the worker keeps serving.

Liveness (zguide ppworker): the worker heartbeats every ``heartbeat_interval_s``; when the
dispatcher has been silent for ``heartbeat_liveness`` intervals, the worker closes its
socket and registers again on a fresh one, backing off exponentially.
"""
from __future__ import annotations

import time
import traceback

import numpy as np
import zmq

from common import protocol, transport
from common.config import WorkerConfig
from common.protocol import Batch, Done, Heartbeat, Predictions, Register, Source
from services.base import Service
from common.containers import build_predictor


class Worker(Service):
    role = "worker"

    def __init__(self, cfg: WorkerConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.predictor = build_predictor(cfg)
        self.version = getattr(self.predictor, "version", cfg.version or "1")
        self.outputs: dict[str, zmq.Socket] = {}  # reply_to endpoint -> PUSH
        self.decoder = (
            self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=cfg.decoder_endpoint))
            if cfg.decoder_endpoint
            else None
        )
        self.dealer: zmq.Socket | None = None
        self.liveness = cfg.heartbeat_liveness
        self.backoff = cfg.heartbeat_interval_s
        self.reconnect_at = 0.0
        self._connect()
        self.every(cfg.heartbeat_interval_s, self._heartbeat)
        self.m_batches = self.metrics.counter("worker_batches_total", "batches run", ["outcome"])
        self.m_service = self.metrics.histogram("worker_service_seconds", "time in predict_batch per batch")
        self.m_batch_size = self.metrics.histogram("worker_batch_size", "queries per batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))

    # ------------------------------------------------------------------ connection

    def _connect(self) -> None:
        if self.dealer is not None:
            self.poller.unregister(self.dealer)
            self.sockets.remove(self.dealer)
            self.handlers.pop(self.dealer, None)
            self.dealer.close(0)
        self.dealer = self.add_socket(
            transport.make_socket(self.ctx, zmq.DEALER, connect=self.cfg.dispatcher_endpoint, identity=self.name),
            self._on_dispatcher,
        )
        self._register()
        self.liveness = self.cfg.heartbeat_liveness

    def _register(self) -> None:
        transport.send(
            self.dealer,
            Register(worker=self.name, model=self.cfg.model, role=self.cfg.role, slots=self.cfg.slots, max_batch=self.cfg.max_batch),
        )

    def _heartbeat(self, now: float) -> None:
        self.liveness -= 1
        if self.liveness <= 0:
            if now < self.reconnect_at:
                return
            self.log.warning("dispatcher silent; registering again", backoff_s=self.backoff)
            self._connect()
            self.reconnect_at = now + self.backoff
            self.backoff = min(self.backoff * 2, 8.0)
            return
        transport.send(self.dealer, Heartbeat(sender=self.name))

    # ------------------------------------------------------------------ work

    def _on_dispatcher(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            self.liveness = self.cfg.heartbeat_liveness
            self.backoff = self.cfg.heartbeat_interval_s
            if isinstance(msg, Batch):
                self.run_batch(msg)
            elif isinstance(msg, Heartbeat) and not msg.known:
                self._register()  # the dispatcher lost us (it restarted, or dropped us)

    def run_batch(self, batch: Batch) -> None:
        start = time.perf_counter()
        error = None
        try:
            outputs = np.ascontiguousarray(self.predictor.predict_batch(batch.inputs), np.float32)
            if outputs.shape[0] != len(batch.qids):
                raise RuntimeError(f"model returned {outputs.shape[0]} outputs for {len(batch.qids)} queries")
        except Exception as exc:  # the model's failure must not take the worker down
            outputs = None
            error = f"{type(exc).__name__}: {exc}"
            self.log.error("model raised", batch_id=batch.batch_id, error=error, trace=traceback.format_exc(limit=3))
        service_ms = (time.perf_counter() - start) * 1000.0
        self.m_batches.labels(outcome="ok" if error is None else "error").inc()
        self.m_service.observe(service_ms / 1000.0)
        self.m_batch_size.observe(len(batch.qids))
        self._deliver(batch, outputs, service_ms, error)
        transport.send(
            self.dealer,
            Done(worker=self.name, batch_id=batch.batch_id, batch_size=len(batch.qids), service_ms=service_ms, ok=error is None),
        )

    def _deliver(self, batch: Batch, outputs: np.ndarray | None, service_ms: float, error: str | None) -> None:
        common = dict(
            batch_id=batch.batch_id, model=batch.model, worker=self.name, role=batch.role,
            source=Source.MODEL, group=batch.group, service_ms=service_ms, error=error,
        )
        if batch.role == protocol.Role.PARITY:
            # A parity output answers no client: it goes to the decoder only.
            if self.decoder is not None:
                transport.send(self.decoder, Predictions(qids=batch.qids, outputs=outputs, members=batch.members, **common))
            return
        # Split by destination frontend; one message per frontend per batch.
        by_dest: dict[str, list[int]] = {}
        for row, dest in enumerate(batch.reply_to):
            by_dest.setdefault(dest, []).append(row)
        for dest, rows in by_dest.items():
            all_rows = len(rows) == len(batch.qids)
            qids = batch.qids if all_rows else [batch.qids[r] for r in rows]
            out = outputs if outputs is None or all_rows else outputs[rows]
            transport.send(self._output(dest), Predictions(qids=qids, outputs=out, **common))
        if self.decoder is not None and batch.group is not None:
            transport.send(self.decoder, Predictions(qids=batch.qids, outputs=outputs, reply_to=batch.reply_to, **common))

    def _output(self, endpoint: str) -> zmq.Socket:
        sock = self.outputs.get(endpoint)
        if sock is None:
            sock = self.outputs[endpoint] = self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=endpoint))
        return sock
