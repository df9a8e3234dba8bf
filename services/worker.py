"""Model worker: a Clipper model container behind ``predict_batch``.

A worker connects a DEALER to the dispatcher's ROUTER, registers its slots (credits) and
what schedulers need to know of it (instance type, price, torch threads), and receives a
batch only when it has a free slot. Predictions go straight to each query's frontend (one
PUSH per frontend, ``transport.Peers``), never through the dispatcher; a ``Done`` back to
the dispatcher frees the slot and carries the batch's service time for AIMD. For coded
models it also pushes a copy of each prediction batch to the decoder (ParM §4.1).

Every batch the worker takes is answered with a ``Done``, whatever happens to it: a model
exception, an input the model cannot take, or predictions that cannot be delivered (a
``reply_to`` that is empty, malformed or unconnectable, a frontend whose queue is full)
give ``Done(ok=False, error=...)``; the queries that can be delivered still are. Otherwise
one hostile batch would hold its slot for ever. A ``Withdraw`` from the dispatcher (the
requests were cancelled) names queries of batches the worker holds: those whose batch has
not started when it comes are not run (``skipped_cancelled``); their batch's ``Done``
counts only the queries run.

Deadlines: ``Batch.budgets_ms`` become deadlines on this worker's monotonic clock, counted
from when the dispatcher sent the batch (``sent_at``, ``protocol.transit_s``); queries whose deadline has passed are not run (their frontend has answered
them with the default) and ``Done.batch_size`` counts the queries actually run, so AIMD
sees a service time that matches its batch size. Prediction copies to the decoder carry
what is left of each query's budget.

Concurrency (SERF §IV): a worker runs up to ``slots`` batches at once, each with
``threads`` torch intra-op threads. The poll loop never runs a model: it hands each batch
to an ``Executors`` pool (one Python thread per slot; torch releases the GIL while it
computes) and delivers predictions and ``Done`` itself when an executor signals, through
a pipe the loop polls, that a batch finished (ZeroMQ sockets stay on the loop's thread).
A batch the model is expected to finish within ``inline_below_ms`` runs on the loop's own
thread instead, as a Clipper container runs each batch, when no executor is busy: for a
model that short the hand-off (two thread wake-ups and a pipe, each dear in a process woken
cold) costs more than the model. The expectation is the recent batches' service time, so
a worker's first batch, and every batch of a model that became slow, goes to an executor.
torch's thread count lives in each calling thread's OpenMP state (set once per thread
when it first computes), so an executor calls ``torch.set_num_threads`` itself before a
batch whenever the configured figure changed. Measured here before choosing threads over
one process per slot: two executor threads with 1 torch thread each do run at once (small
ResNet-18, 32x32: ~18 ms alone, ~30 ms each with two at once on 2 loaded cores), and one
copy of the weights serves every slot (the large model's 512 MB are not duplicated, and
its requests share them as SERF's §III-C describes).

``Configure(slots, threads)`` from the dispatcher (SERF) sets the threads and the slots
live: the batches already held finish with what they started with, and the dispatcher
sends no new batch beyond the new number of slots, so nothing is lost on a switch. On SIGTERM the worker sends ``Leave`` so the dispatcher
drops it at once instead of after its heartbeats stop.

Rollout: ``Configure(version=V)`` on the worker's status endpoint (``keel model rollout``)
leaves the dispatcher (which re-queues what it held to the other workers), loads version
V of its store model and checks it with one batch, swaps the model and registers again;
a version that fails to load or check is refused and the old one keeps serving.
Every ``Predictions`` says the version that computed it.

GPUs (``common.datapath``, docs/guide/gpu.md): a worker placed on a GPU makes it its only
visible one (``WorkerConfig.gpu``) before CUDA starts; before it registers it runs one
batch of its largest size (``warmup_batch``), so the first query is not the slow one. A
batch that runs out of device memory is split and retried (``MemoryGuard``); the lowered
ceiling goes to the dispatcher in ``Done.max_batch`` and in later ``Register``s, and a
query that alone does not fit is answered with ``QueryTooLarge``.

Liveness (zguide ppworker): the worker heartbeats every ``heartbeat_interval_s``; when the
dispatcher has been silent for ``heartbeat_liveness`` intervals, the worker closes its
socket and registers again on a fresh one, backing off exponentially. A dispatcher that
restarts is found sooner: the worker's DEALER retries every ``RECONNECT_MS`` and heartbeats
as soon as it connects, which the new dispatcher, not knowing the worker, answers with
``Heartbeat(known=False)``: the worker registers within a round trip of the dispatcher's bind.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback

import numpy as np
import zmq

from keel.common import protocol, tracing, transport
from keel.common.config import WorkerConfig
from keel.common.metrics import MODEL_LABELS
from keel.common.protocol import Batch, Configure, Done, Heartbeat, Leave, Predictions, Register, Source, Withdraw, transit_s
from keel.services.base import Service
from keel.services.executors import Executors, Job, set_torch_threads
from keel.common.containers import build_predictor
from keel.common.named_containers import call_rows
from keel.common.ragged import Waste
from keel.common.datapath import MemoryGuard, warm_up, warmup_rows
from keel.common.devices import see_only

#: withdrawn query ids remembered at most (oldest forgotten first): one whose batch was
#: done before its Withdraw came is never looked up again
MAX_WITHDRAWN = 10_000

#: how long a leaving worker waits for its Leave to reach the dispatcher (ms)
LEAVE_LINGER_MS = 500
#: how soon the worker tries again to reach a dispatcher that is down (ms; ZeroMQ's default
#: is 100): a restarted dispatcher hears from every worker within this of its bind
RECONNECT_MS = 20


class Worker(Service):
    role = "worker"

    def __init__(self, cfg: WorkerConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        if cfg.omp_spincount and "torch" not in sys.modules:  # libgomp reads it once, when torch loads it
            os.environ["GOMP_SPINCOUNT"] = str(cfg.omp_spincount)
        # the loop's thread keeps one torch thread: only executors compute, each with its own
        # OpenMP team; a second team here would put more OpenMP threads than cores in the
        # process, and libgomp then cuts every team's spin to ~1000 iterations (its throttled
        # spin count), so the executors' teams sleep between requests whatever omp_spincount says
        see_only(cfg.gpu)  # its GPU as its only one, before CUDA starts (common.devices)
        self.predictor = build_predictor(dataclasses.replace(cfg, torch_threads=1))
        #: out-of-memory on a batch: split and retried, and the ceiling lowered (common.datapath)
        self.memory = MemoryGuard(cfg.max_batch)
        self.version = getattr(self.predictor, "version", cfg.version or "1")
        self.slots, self.threads = cfg.slots, cfg.torch_threads
        self.held = 0  # batches handed to the executors and not yet answered
        #: the recent batches' service time (ms, a moving average); None before the first
        self.expected_ms: float | None = None
        #: service times of the batches run, by how many were computing when each started
        #: (SERF's i): count, sum and sum of squares (ms). SERF's profiler reads them before
        #: and after a phase (mean and SCV of mu_i); an experiment, during a run
        self.service: dict[str, dict[str, float]] = {}
        # an emulated host (serf_host) takes each executor's threads as torch would
        set_threads = getattr(self.predictor, "set_threads", None) or (None if cfg.builtin is not None else set_torch_threads)
        self.executors = Executors(self._compute, set_threads)
        self.executors.torch_threads = self.threads
        self.executors.ensure(self.slots)
        self.poller.register(self.executors.fd, zmq.POLLIN)
        self.handlers[self.executors.fd] = lambda fd: self._on_finished()
        self.peers = transport.Peers(self.ctx, on_new=self.add_socket, on_drop=self.remove_socket)  # reply_to endpoint -> PUSH
        self.decoder = (
            self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=cfg.decoder_endpoint))
            if cfg.decoder_endpoint
            else None
        )
        self.dealer: zmq.Socket | None = None
        self.liveness = cfg.heartbeat_liveness
        self.backoff = cfg.heartbeat_interval_s
        self.reconnect_at = 0.0
        self.known = False  # the dispatcher has this worker registered: ready (/readyz)
        self.counts = {"batches": 0, "errors": 0, "undeliverable": 0, "expired": 0, "configured": 0, "fenced": 0, "rollouts": 0}
        self.counts["skipped_cancelled"] = 0  # queries withdrawn before their batch started: not run
        self.withdrawn: dict[int, None] = {}  # qids withdrawn (insertion order: oldest first), read by executors
        #: the dispatcher this worker serves: the configured one, or the active one the
        #: manager names (re-registering when that changes)
        self.dispatcher_endpoint, self.dispatcher_name = cfg.dispatcher_worker_endpoint, None
        if self.link_manager(cfg.manager, on_change=self._on_manager_change):
            self.dispatcher_name, _, endpoints = self.manager.holder("dispatcher")
            self.dispatcher_endpoint = endpoints.get("worker", self.dispatcher_endpoint)
        #: a named model's signature (``common.signature``; None: one tensor in, one out)
        manifest = getattr(self.predictor, "manifest", None)
        signature = manifest.signature_of() if getattr(manifest, "signature", None) is not None else None
        self.signature = signature if signature is not None and not signature.is_single else None
        self.waste = Waste()  # padding waste of its batches
        if self.signature is None:
            self._warm_up(self.predictor)  # before it registers: the first query is not the slow one
        self._connect()
        self.every(cfg.heartbeat_interval_s, self._heartbeat)
        self.serve_status(cfg.status_endpoint)
        self.m_batches = self.metrics.counter("worker_batches_total", "batches run", ["outcome", *MODEL_LABELS])
        self.m_service = self.metrics.histogram("worker_service_seconds", "time in predict_batch per batch", MODEL_LABELS)
        self.m_waste = self.metrics.gauge("worker_padding_waste", "padded elements / elements computed, "
                                          "a named model's batches so far (common.ragged)", MODEL_LABELS)
        self.m_batch_size = self.metrics.histogram("worker_batch_size", "queries per batch", MODEL_LABELS,
                                                   buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        from keel.services.gpu import watch_gpu

        watch_gpu(self)  # per-GPU utilisation and memory, when nvidia-ml-py imports and a GPU is there

    # ------------------------------------------------------------------ connection

    def _connect(self) -> None:
        if self.dealer is not None:
            self._close_dealer(0)
        dealer = transport.make_socket(self.ctx, zmq.DEALER, identity=self.name)
        dealer.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        dealer.connect(self.dispatcher_endpoint)
        self.dealer = self.add_socket(dealer, self._on_dispatcher)
        if self.manager is None:  # (with a manager, its watch has the socket's monitor: it names a new dispatcher)
            # each (re)connection heartbeats at once: a dispatcher that restarted and does not
            # know this worker answers Heartbeat(known=False), and the worker registers
            self.connections = self.add_socket(dealer.get_monitor_socket(zmq.EVENT_CONNECTED), self._on_connected)
        if self.manager is not None and self.dispatcher_name:
            self.manager.watch(self.dealer, self.dispatcher_name)  # its death: a suspicion at once
        self._register()
        self.liveness = self.cfg.heartbeat_liveness

    def _close_dealer(self, linger_ms: int) -> None:
        if self.manager is not None:
            self.manager.unwatch(self.dealer)
        else:
            self.dealer.disable_monitor()
            self.remove_socket(self.connections)
        self.remove_socket(self.dealer, linger_ms)
        self.dealer = None

    def _on_connected(self, monitor: zmq.Socket) -> None:
        while monitor.poll(0):
            monitor.recv_multipart()
        transport.try_send(self.dealer, Heartbeat(sender=self.name))

    def _register(self) -> None:
        transport.send(
            self.dealer,
            Register(worker=self.name, model=self.cfg.model, role=self.cfg.role, slots=self.slots,
                     max_batch=self.memory.ceiling, instance=self.cfg.instance, price=self.cfg.price, threads=self.threads),
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

    def _on_manager_change(self, key: str, value: dict | None) -> None:
        """The manager named another active dispatcher: register with it (HAMS recovery)."""
        if key != "group/dispatcher" or self.manager is None:
            return
        holder, epoch, endpoints = self.manager.holder("dispatcher")
        endpoint = endpoints.get("worker")
        if holder and endpoint and (holder, endpoint) != (self.dispatcher_name, self.dispatcher_endpoint):
            self.log.warning("dispatcher changed; registering with it", dispatcher=holder, epoch=epoch)
            self.dispatcher_name, self.dispatcher_endpoint = holder, endpoint
            self._connect()

    def drain(self) -> None:
        """Leaving (SIGTERM): tell the dispatcher now, and give the message time to go."""
        if self.manager is not None:
            self.manager.close()
        self._finish_held()
        self.executors.close()
        if self.dealer is None:
            return
        transport.try_send(self.dealer, Leave(worker=self.name))
        self._close_dealer(LEAVE_LINGER_MS)  # the context's term() waits for it, bounded

    # ------------------------------------------------------------------ control

    def _on_dispatcher(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            self.liveness = self.cfg.heartbeat_liveness
            self.known = not (isinstance(msg, Heartbeat) and not msg.known)
            self.backoff = self.cfg.heartbeat_interval_s
            if isinstance(msg, Batch):
                if not self._refuse_stale(msg):
                    self.run_batch(msg)
            elif isinstance(msg, Configure):
                self.configure(msg)
            elif isinstance(msg, Withdraw):
                self._withdraw(msg)
            elif isinstance(msg, Heartbeat) and not msg.known:
                self._register()  # the dispatcher lost us (it restarted, or dropped us)

    def ready(self) -> bool:
        return self.running and self.known and self.liveness > 0

    def configure(self, msg: Configure) -> None:
        """SERF: new concurrency (slots) and torch threads. The dispatcher that sent it has
        already updated its view; a Register here would make it drop what this worker
        holds. Later Registers (after a reconnect) announce the new values."""
        if msg.threads is not None:
            # each executor sets it before its next batch (builtin models use no torch)
            self.threads = self.executors.torch_threads = msg.threads
        if msg.slots is not None:
            self.slots = msg.slots
            self.executors.ensure(self.slots)
        if msg.version is not None and msg.version != self.version:
            self.rollout(msg.version)
        self.counts["configured"] += 1
        self.log.info("configured", slots=self.slots, threads=self.threads)

    def rollout(self, version: str) -> str | None:
        """Serve ``version`` of the store model from now on; why not, or None when done."""
        from keel.common.containers import check, store_predictor

        if self.cfg.builtin is not None:
            return f"builtin model {self.cfg.builtin} has no versions"
        # Out of the dispatcher's rotation while loading: what it held goes to other workers.
        transport.try_send(self.dealer, Leave(worker=self.name))
        try:
            if self.cfg.store_endpoints:  # across hosts: the version is fetched (and checked) before the switch
                from keel.common.modelfetch import fetch_for_worker

                fetch_for_worker(dataclasses.replace(self.cfg, version=version), self.log.info, deadline_s=60.0)
            predictor = store_predictor(self.cfg.store, self.cfg.store_name or self.cfg.model, version, self.threads,
                                        self.cfg.fixed_ms, self.cfg.per_query_ms, self.cfg.device, self.cfg.autocast,
                                        self.cfg.memory_fraction)
            if list(predictor.input_shape) != list(getattr(self.predictor, "input_shape", predictor.input_shape)) or \
                    predictor.output_size != getattr(self.predictor, "output_size", predictor.output_size):
                raise ValueError(f"version {version} takes {predictor.input_shape} -> {predictor.output_size}, "
                                 f"the served one {self.predictor.input_shape} -> {self.predictor.output_size}")
            check(predictor, list(predictor.input_shape), predictor.manifest.input_dtype)
            self._warm_up(predictor)
        except Exception as exc:  # a bad version must not take the serving one down
            why = f"{type(exc).__name__}: {exc}"
            self.log.error("rollout refused", version=version, error=why)
            self._register()
            return why
        old, self.predictor, self.version = self.version, predictor, predictor.version
        self.counts["rollouts"] += 1
        self.log.info("rolled out", version=self.version, previous=old)
        self._register()
        return None

    def _on_status(self, sock: zmq.Socket) -> None:
        for envelope, msg in self.messages(sock, router=True):
            if isinstance(msg, protocol.Status):
                transport.try_send(sock, protocol.Status(service=self.name, info=self.status()), envelope)
            elif isinstance(msg, Configure) and msg.version is not None:
                why = self.rollout(msg.version) if msg.version != self.version else None
                transport.try_send(sock, protocol.Status(service=self.name, info={**self.status(), "refused": why}), envelope)

    # ------------------------------------------------------------------ work

    def _refuse_stale(self, batch: Batch) -> bool:
        """A batch stamped with an older dispatcher epoch than the manager's newest decision
        this worker knows comes from a stale dispatcher: answer Done with the reason and run
        nothing (the frontends re-sent those queries to the new one). True if refused."""
        if batch.fence is None or self.manager is None:
            return False
        holder, epoch, _ = self.manager.holder("dispatcher")
        if batch.fence >= epoch:
            return False
        self.counts["fenced"] += 1
        self.log.warning("batch from a stale dispatcher refused", batch_id=batch.batch_id, fence=batch.fence, epoch=epoch)
        transport.send(self.dealer, Done(worker=self.name, batch_id=batch.batch_id, batch_size=0, service_ms=0.0, ok=False,
                                         error=f"stale dispatcher: batch at epoch {batch.fence}, {holder} holds epoch {epoch}"))
        return True

    def run_batch(self, batch: Batch) -> None:
        """Hand the live queries of ``batch`` to an executor; ``_on_finished`` delivers their
        predictions and always answers Done (at once when no query is live)."""
        # when the dispatcher sent it, on this clock: budgets count from there, so a batch
        # that waited in a socket buffer past all its deadlines is not computed
        received = time.monotonic() - transit_s(batch.sent_at)
        job = Job(batch, self._live_rows(batch, received), received, self.predictor, self.version)
        if batch.trace is not None:
            job.trace = [*batch.trace, time.time()]  # receipt (decoded)
            if batch.traceparent is not None and tracing.ON:
                tracing.received(self.name, batch.traced, batch.traceparent)
        if not job.live:
            self._answer(job)
            return
        if self._inline():
            job.running = 1
            self._compute(job)
            self._answer(job)
            return
        self.held += 1
        self.executors.submit(job)

    def _withdraw(self, msg: Withdraw) -> None:
        """Queries of batches this worker holds whose requests were cancelled: skipped if
        their batch has not started when they come (``_compute``)."""
        withdrawn = self.withdrawn
        for qid in msg.qids:
            withdrawn[qid] = None
        while len(withdrawn) > MAX_WITHDRAWN:
            del withdrawn[next(iter(withdrawn))]

    def _inline(self) -> bool:
        """Whether the loop runs the next batch itself: a model expected to be shorter than its
        hand-off, no executor busy (nothing to wait behind, nothing computing beside it), and
        the one torch thread the loop's thread keeps (``__init__``) what is configured."""
        return (self.held == 0 and self.expected_ms is not None and self.expected_ms < self.cfg.inline_below_ms
                and (self.threads == 1 or self.executors.set_threads is None))

    def _compute(self, job: Job) -> None:
        """On an executor thread (or the loop's, ``_inline``): run the model; never raises,
        never touches a socket."""
        if self.withdrawn:  # cancelled while the batch waited for its executor: not run
            withdrawn, qids = self.withdrawn, job.batch.qids
            live = [row for row in job.live if qids[row] not in withdrawn]
            job.skipped, job.live = len(job.live) - len(live), live
        batch, live = job.batch, job.live
        if not live:
            return
        start = time.perf_counter()
        try:
            predictor = job.predictor
            if batch.rows is not None:  # a named model's: padded here, cut back per query
                if self.signature is None:
                    raise ValueError("named tensors for a model of one input")
                rows = batch.rows if len(live) == len(batch.qids) else [batch.rows[r] for r in live]
                job.outputs, job.padded = call_rows(predictor, self.signature, rows)
            else:
                job.outputs = self.memory.run(lambda x: self._predict(predictor, x, len(x)),
                                              batch.inputs if len(live) == len(batch.qids) else batch.inputs[live])
        except Exception as exc:  # the model's failure must not take the worker down
            job.error = f"{type(exc).__name__}: {exc}"
            self.log.error("model raised", batch_id=batch.batch_id, error=job.error, trace=traceback.format_exc(limit=3))
        job.service_ms = (time.perf_counter() - start) * 1000.0

    def _on_finished(self) -> None:
        for job in self.executors.done():
            self.held -= 1
            self._answer(job)

    def _finish_held(self, wait_s: float = 10.0) -> None:
        """Leaving: answer what the executors hold (bounded), so nothing taken goes unanswered."""
        deadline = time.monotonic() + wait_s
        while self.held > 0 and time.monotonic() < deadline:
            self._on_finished()
            time.sleep(0.005)

    def _answer(self, job: Job) -> None:
        """Deliver a finished batch's predictions and answer Done."""
        batch, live, error = job.batch, job.live, job.error
        refused = 0
        if live:
            refused = self._deliver(batch, live, job.outputs, job.service_ms, error, job.received, job.version, job.trace)
        if refused:
            self.counts["undeliverable"] += refused
            self.log.warning("predictions undeliverable", batch_id=batch.batch_id, queries=refused)
            error = error or f"{refused} of {len(live)} predictions undeliverable (reply_to refused or its queue full)"
        self.counts["batches"] += 1
        self.counts["errors"] += error is not None
        if job.skipped or self.withdrawn:
            if job.skipped:
                self.counts["skipped_cancelled"] += job.skipped
                self.log.info("withdrawn queries skipped", batch_id=batch.batch_id, queries=job.skipped)
            for qid in batch.qids:
                self.withdrawn.pop(qid, None)
        served = {"model": self.cfg.model, "version": str(job.version)}  # a rollout shows as a new version
        self.m_batches.labels(outcome="ok" if error is None else "error", **served).inc()
        self.m_service.labels(**served).observe(job.service_ms / 1000.0)
        if error is None and live:
            self.expected_ms = job.service_ms if self.expected_ms is None else 0.8 * self.expected_ms + 0.2 * job.service_ms
            acc = self.service.setdefault(str(job.running), {"n": 0, "sum_ms": 0.0, "sumsq_ms": 0.0})
            acc["n"] += 1
            acc["sum_ms"] += job.service_ms
            acc["sumsq_ms"] += job.service_ms ** 2
        self.m_batch_size.labels(**served).observe(len(live))
        if job.padded is not None:  # the price of padding (common.ragged): a metric and Status
            self.waste.add(job.padded)
            self.m_waste.labels(**served).set(self.waste.ratio)
        transport.send(
            self.dealer,
            Done(worker=self.name, batch_id=batch.batch_id, batch_size=len(live), service_ms=job.service_ms,
                 ok=error is None, error=error, max_batch=self.memory.lowered(self.cfg.max_batch)),
        )

    def _live_rows(self, batch: Batch, now: float) -> list[int]:
        """Rows whose deadline (budget from ``now``, when the batch was sent, on this clock)
        has not passed."""
        if batch.budgets_ms is None:
            return list(range(len(batch.qids)))
        deadlines = [now + budget / 1000.0 for budget in batch.budgets_ms]
        start = time.monotonic()
        live = [row for row, deadline in enumerate(deadlines) if deadline > start]
        self.counts["expired"] += len(batch.qids) - len(live)
        return live

    @staticmethod
    def _predict(predictor, inputs: np.ndarray, rows: int) -> np.ndarray:
        want = tuple(getattr(predictor, "input_shape", inputs.shape[1:]))
        if tuple(inputs.shape[1:]) != want:
            raise ValueError(f"input shape {list(inputs.shape[1:])} is not the model's {list(want)}")
        if inputs.dtype.kind not in "fiub":
            raise ValueError(f"input dtype {inputs.dtype} is not numeric")
        outputs = np.ascontiguousarray(predictor.predict_batch(inputs), np.float32)
        if outputs.ndim != 2 or outputs.shape[0] != rows:
            raise RuntimeError(f"model returned outputs of shape {list(outputs.shape)} for {rows} queries")
        return outputs

    def _deliver(self, batch: Batch, live: list[int], outputs: np.ndarray | None, service_ms: float,
                 error: str | None, received: float, version: str, trace: list[float] | None = None) -> int:
        """Send the live rows' predictions, marked with the version that computed them (and
        a traced query's stamps with their send, on its message); the number of queries
        that could not be sent."""
        every = len(live) == len(batch.qids)
        qids = batch.qids if every else [batch.qids[r] for r in live]
        budgets = None
        if batch.budgets_ms is not None:  # what is left of each budget, for the decoder
            spent = (time.monotonic() - received) * 1000.0
            budgets = [batch.budgets_ms[r] - spent for r in live]
        common = dict(
            batch_id=batch.batch_id, model=batch.model, worker=self.name, role=batch.role,
            source=Source.MODEL, group=batch.group, service_ms=service_ms, error=error, version=version,
        )
        if batch.role == protocol.ModelRole.PARITY:
            # A parity output answers no client: it goes to the decoder only (rows by qid:
            # the encoder numbers parity queries by their row).
            if self.decoder is not None:
                transport.try_send(self.decoder, Predictions(qids=qids, outputs=outputs, members=batch.members,
                                                             budgets_ms=budgets, **common))
            return 0
        reply_to = batch.reply_to if every else [batch.reply_to[r] for r in live]
        refused = 0
        named = type(outputs) is list  # a named model's: a dict of outputs a query
        for dest, rows in transport.split_rows(reply_to).items():
            part = len(rows) == len(qids)
            if named:
                msg = Predictions(qids=qids if part else [qids[r] for r in rows], outputs=None,
                                  rows=outputs if part else [outputs[r] for r in rows], **common)
            else:
                msg = Predictions(qids=qids if part else [qids[r] for r in rows],
                                  outputs=outputs if outputs is None or part else outputs[rows], **common)
            if trace is not None and batch.traced in msg.qids:
                msg.traced, msg.trace = batch.traced, [*trace, time.time()]
                if tracing.ON:
                    tracing.sent(self.name, "worker", msg)
            if not self.peers.send(dest, msg):
                refused += len(rows)
        if self.decoder is not None and batch.group is not None:
            transport.try_send(self.decoder, Predictions(qids=qids, outputs=outputs, reply_to=reply_to,
                                                         budgets_ms=budgets, **common))
        return refused

    def status(self) -> dict:
        return {**super().status(), "model": self.cfg.model, "model_role": self.cfg.role, "version": self.version, "slots": self.slots,
                "threads": self.threads, **self.counts, "peers": len(self.peers.sockets),
                "held": self.held, "padding_waste": round(self.waste.ratio, 4), "padded_batches": self.waste.batches,
                "peak_concurrency": self.executors.peak, "service_times": {i: dict(acc) for i, acc in self.service.items()},
                **self._device_status()}

    def _warm_up(self, predictor) -> None:
        """One batch of the largest size through ``predictor`` (GPU default: ``warmup_rows``),
        within the memory guard, which lowers the ceiling the worker registers with if it does not fit."""
        rows = warmup_rows(self.cfg.warmup_batch, self.cfg.device, self.cfg.max_batch)
        if rows and self.cfg.builtin is None:
            took = warm_up(predictor, self.memory, rows, self.slots)
            self.log.info("warmed up", rows=rows, seconds=round(took, 3), max_batch=self.memory.ceiling)

    def _device_status(self) -> dict:
        """Where the model runs, the batch ceiling memory allows, and the data path's figures."""
        path = getattr(self.predictor, "path", None)
        return {"device": self.cfg.device, "gpu": self.cfg.gpu, "max_batch": self.memory.ceiling,
                "oom_splits": self.memory.splits, "too_large": self.memory.too_large,
                **({"datapath": path.stats()} if path is not None else {})}

