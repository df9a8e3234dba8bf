"""Dispatcher: one queue per model; workers pull batches by credits (single-queue, ParM §6.1).

Frontends PUSH ``Queries``; the dispatcher appends them to the model's queue. Workers
register over ROUTER/DEALER with a number of slots; a worker receives a batch only when
it has a free slot, and its ``Done`` frees the slot. Per worker, the batch size adapts by
AIMD (Clipper §4.3.1): +``aimd_step`` while the batch's service time stays within the
model's ``batch_budget_ms``, x``aimd_backoff`` when it does not; delayed batching
(§4.3.2) holds a partial batch up to ``batch_delay_ms`` for more queries. A query whose
deadline has passed is never dispatched (the frontend has answered it with the default).

A worker silent for ``heartbeat_liveness`` heartbeat intervals is dropped and the queries
of its in-flight batches go back to the head of their queue.

ParM: for a model with ``k > 0``, the k batches dispatched consecutively form a coding
group; each is tagged (group, index, k) and a copy goes to the encoder *after* it is sent
to its worker, so encoding never delays dispatch. Parity batches from the encoder wait in
the parity model's queue and are served to ``parity`` workers exactly like queries.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import zmq

from common import transport
from common.config import BatchPolicy, DispatcherConfig
from common.protocol import Batch, CodingTag, Done, Heartbeat, Queries, Register, Role, Status
from services.base import Service
from services.policies import POLICIES, WorkerState


@dataclass(slots=True)
class Query:
    qid: int
    deadline: float
    reply_to: str
    input: np.ndarray
    enqueued: float


@dataclass
class ModelQueue:
    policy: BatchPolicy
    queries: deque = field(default_factory=deque)  # of Query; parity queues hold Batch
    next_group: int = 0
    group_index: int = 0


class Dispatcher(Service):
    role = "dispatcher"

    def __init__(self, cfg: DispatcherConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.queues: dict[str, ModelQueue] = {m: ModelQueue(p) for m, p in cfg.models.items()}
        self.parity_of = {p.parity_model: m for m, p in cfg.models.items() if p.k and p.parity_model}
        for parity, model in self.parity_of.items():
            self.queues[parity] = ModelQueue(cfg.models[model])
        self.workers: dict[bytes, WorkerState] = {}
        self.policy = POLICIES[cfg.policy]()
        self.next_batch = 1
        self.pull = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=cfg.query_endpoint), self._on_queries)
        self.router = self.add_socket(transport.make_socket(self.ctx, zmq.ROUTER, bind=cfg.worker_endpoint), self._on_worker)
        self.encoder = (
            self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=cfg.encoder_endpoint)) if cfg.encoder_endpoint else None
        )
        self.every(cfg.heartbeat_interval_s, self._heartbeat)
        self.wake_at: float | None = None  # delayed batching: when to look again
        self.expired = 0
        self.requeued = 0
        self.m_dispatched = self.metrics.counter("dispatched_queries_total", "queries sent to workers", ["model"])
        self.m_expired = self.metrics.counter("expired_queries_total", "queries dropped because their deadline passed", ["model"])
        self.m_queue_time = self.metrics.histogram("queue_seconds", "time a query waited in the dispatcher queue")
        self.m_batch = self.metrics.histogram("dispatched_batch_size", "batch sizes", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))

    # ------------------------------------------------------------------ inputs

    def _on_queries(self, sock: zmq.Socket) -> None:
        now = time.time()
        for _, msg in self.messages(sock):
            if isinstance(msg, Queries):
                queue = self.queues.get(msg.model)
                if queue is None:
                    self.log.error("queries for a model with no queue", model=msg.model)
                    continue
                for i, qid in enumerate(msg.qids):
                    queue.queries.append(Query(qid, now + msg.budgets_ms[i] / 1000.0, msg.reply_to, msg.inputs[i], now))
            elif isinstance(msg, Batch) and msg.role == Role.PARITY:
                queue = self.queues.get(msg.model)
                if queue is not None:
                    queue.queries.append(msg)
        self.dispatch()

    def _on_worker(self, sock: zmq.Socket) -> None:
        for envelope, msg in self.messages(sock, router=True):
            identity = envelope[0].bytes
            worker = self.workers.get(identity)
            if worker is not None:
                worker.last_seen = time.monotonic()
            if isinstance(msg, Done) and worker is not None:
                self._on_done(worker, msg)
            elif isinstance(msg, Register):
                self._on_register(identity, msg)
            elif isinstance(msg, Heartbeat):
                self._send(identity, Heartbeat(sender=self.name, known=worker is not None))
            elif isinstance(msg, Status):
                self._send(envelope, Status(service=self.name, info=self.status()))
        self.dispatch()

    def _on_register(self, identity: bytes, msg: Register) -> None:
        old = self.workers.pop(identity, None)
        if old is not None:
            self._requeue(old)  # a worker that registers again has lost what it held
        if msg.model not in self.queues:
            self.log.error("worker registered for a model the dispatcher does not serve", worker=msg.worker, model=msg.model)
            return
        policy = self.queues[msg.model].policy
        max_batch = min(msg.max_batch, policy.max_batch)
        start = policy.fixed_batch or 1
        self.workers[identity] = WorkerState(
            identity=identity, name=msg.worker, model=msg.model, role=msg.role, slots=msg.slots,
            max_batch=max_batch, batch_size=min(start, max_batch), last_seen=time.monotonic(),
        )
        self.log.info("worker registered", worker=msg.worker, model=msg.model, role=msg.role, slots=msg.slots)

    def _on_done(self, worker: WorkerState, msg: Done) -> None:
        batch = worker.inflight.pop(msg.batch_id, None)
        if batch is None:
            return
        worker.batches += 1
        worker.last_service_ms = msg.service_ms
        policy = self.queues[worker.model].policy
        if policy.fixed_batch is None and msg.ok:
            # AIMD (Clipper §4.3.1): only a full batch says anything about a larger one.
            if msg.service_ms > policy.batch_budget_ms:
                worker.batch_size = max(1, int(worker.batch_size * policy.aimd_backoff))
            elif msg.batch_size >= worker.batch_size:
                worker.batch_size = min(worker.max_batch, worker.batch_size + policy.aimd_step)

    # ------------------------------------------------------------------ dispatch

    def dispatch(self) -> None:
        now_wall, now = time.time(), time.monotonic()
        self.wake_at = None
        for model, queue in self.queues.items():
            # Rounds of one batch per free worker, until the queue or the free slots run out:
            # a worker with several free slots gets several batches, spread like the rest.
            sent = True
            while sent and queue.queries:
                sent = False
                free = [w for w in self.workers.values() if w.model == model and w.free_slots > 0]
                for worker in self.policy.assign(len(queue.queries), free, now):
                    if not queue.queries:
                        break
                    if isinstance(queue.queries[0], Batch):
                        self._send_batch(worker, queue.queries.popleft(), [])
                    elif not self._take_batch(model, queue, worker, now_wall, now):
                        break
                    sent = True

    def _take_batch(self, model: str, queue: ModelQueue, worker: WorkerState, now_wall: float, now: float) -> bool:
        policy = queue.policy
        want = worker.batch_size
        # Delayed batching: a partial batch waits (bounded) for more queries.
        if policy.batch_delay_ms > 0 and len(queue.queries) < want:
            ready_at = queue.queries[0].enqueued + policy.batch_delay_ms / 1000.0
            if ready_at > now_wall:
                self.wake_at = min(self.wake_at or float("inf"), now + (ready_at - now_wall))
                return False
        taken: list[Query] = []
        while queue.queries and len(taken) < want:
            query = queue.queries.popleft()
            if query.deadline <= now_wall:
                self.expired += 1
                self.m_expired.labels(model=model).inc()
                continue
            taken.append(query)
        if not taken:
            return False
        group = None
        if policy.k:
            group = CodingTag(queue.next_group, queue.group_index, policy.k)
            queue.group_index += 1
            if queue.group_index == policy.k:
                queue.group_index, queue.next_group = 0, queue.next_group + 1
        batch = Batch(
            batch_id=0, model=model, qids=[q.qid for q in taken], reply_to=[q.reply_to for q in taken],
            inputs=np.stack([q.input for q in taken]), group=group,
            budgets_ms=[(q.deadline - now_wall) * 1000.0 for q in taken],
        )
        self._send_batch(worker, batch, taken)
        for q in taken:
            self.m_queue_time.observe(now_wall - q.enqueued)
        self.m_dispatched.labels(model=model).inc(len(taken))
        self.m_batch.observe(len(taken))
        if group is not None and self.encoder is not None:
            transport.send(self.encoder, batch)  # after the worker has it: encoding never delays dispatch
        return True

    def _send_batch(self, worker: WorkerState, batch: Batch, queries: list[Query]) -> None:
        batch.batch_id = self.next_batch
        self.next_batch += 1
        worker.inflight[batch.batch_id] = queries or batch
        self._send(worker.identity, batch)

    def _send(self, envelope: bytes | list, msg) -> None:
        try:
            transport.send(self.router, msg, envelope=[envelope] if isinstance(envelope, bytes) else envelope)
        except zmq.ZMQError as exc:  # peer gone (ROUTER_MANDATORY): heartbeats will drop it
            self.log.warning("send to a vanished peer", error=str(exc))

    # ------------------------------------------------------------------ liveness

    def _heartbeat(self, now: float) -> None:
        limit = self.cfg.heartbeat_interval_s * self.cfg.heartbeat_liveness
        for identity, worker in list(self.workers.items()):
            if now - worker.last_seen > limit:
                del self.workers[identity]
                self.log.warning("worker missed heartbeats; dropped", worker=worker.name, inflight=len(worker.inflight))
                self._requeue(worker)
            else:
                self._send(identity, Heartbeat(sender=self.name))
        self.dispatch()

    def _requeue(self, worker: WorkerState) -> None:
        queue = self.queues.get(worker.model)
        if queue is None:
            return
        for held in reversed(list(worker.inflight.values())):
            if isinstance(held, Batch):
                queue.queries.appendleft(held)
            else:
                queue.queries.extendleft(reversed(held))
                self.requeued += len(held)
        worker.inflight.clear()

    def next_timeout(self) -> float:
        timeout = super().next_timeout()
        if self.wake_at is not None:
            timeout = min(timeout, max(0.0, self.wake_at - time.monotonic()))
        return timeout

    def tick(self, timeout: float | None = None) -> None:
        super().tick(timeout)
        if self.wake_at is not None and time.monotonic() >= self.wake_at:
            self.dispatch()

    def status(self) -> dict:
        return {
            "service": self.name,
            "role": self.role,
            "queues": {m: len(q.queries) for m, q in self.queues.items()},
            "workers": {
                w.name: {"model": w.model, "role": w.role, "batch_size": w.batch_size, "inflight": len(w.inflight),
                         "batches": w.batches, "last_service_ms": round(w.last_service_ms, 3)}
                for w in self.workers.values()
            },
            "expired": self.expired,
            "requeued": self.requeued,
        }
