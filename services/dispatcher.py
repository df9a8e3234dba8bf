"""Dispatcher: one queue per model; workers pull query batches by credits (ParM §4.1, §6.1).

Frontends PUSH ``Queries``; each query's deadline becomes ``time.monotonic() +
budget_ms/1000`` at receipt less the message's transit (``protocol.transit_s``: a query's
budget counts from the frontend's admission, so queries that waited in this process's
socket buffer while it was frozen come out with what is left of it), and a batch
carries, per query, the ms left when it is sent (``Batch.budgets_ms``, ``sent_at``). A
query whose deadline has passed is never dispatched (the frontend has answered it with
the default): it is dropped and counted ``expired``, at receipt or when its turn comes. Workers register over ROUTER/DEALER with a
number of slots and what they are (instance kind, price, threads, max batch); a worker
receives a batch only when it has a free slot, and its ``Done`` frees the slot and feeds
its measured service-time profile.

Scheduling is three plug-ins (``services.scheduling``): the distribution policy decides
which worker gets which chunk of the queue (single queue, round robin; Kairos §5.1 next),
the batching plug-in how big a worker's batch is (Clipper §4.3.1 AIMD, §4.3.2 delayed
batching, fixed), and ``CodingGroups`` forms ParM's coding groups (§4.1): for a model with
``k > 0`` the k batches dispatched consecutively form a group; each batch is tagged and a
copy goes to the encoder *after* it is sent to its worker, so encoding never delays
dispatch. Parity batches from the encoder wait in the parity model's queue and are served
whole to ``parity`` workers. ``configure(worker, slots=, threads=)`` is SERF's lever: it
sends ``Configure`` to the worker and fills the new number of slots at once. An operator's
``Configure(model=M, slots=, threads=)`` on the ROUTER (``keel serf set``, SERF's
profiler) applies it to every worker of M. With ``serf = {M = PROFILE}`` the dispatcher
runs SERF's configurator (``services.serf.configurator``) every ``serf_interval_s``: M's
arrival rate (counted since its last step), the reference table, hysteresis and a hold time, then
``configure``; the profile is checked against the service times of each ``Done``; its state is in
``status()["serf"]`` and the ``serf_*`` metrics. ``Configure(model=M, version=V)`` on the
ROUTER (``keel model rollout``) makes SERF follow V's profile, or hold M where V has none;
``serf_cores`` keeps each host's workers within its cores.

A worker that sends ``Leave`` is dropped at once; one silent for ``heartbeat_liveness``
heartbeat intervals is dropped too. Either way the queries of its in-flight batches go
back to the head of their queue, except those a frontend has reported ``Answered`` (a
ParM reconstruction answered them) or withdrawn. A ``Withdraw`` (the requests were
cancelled) removes queries not yet dispatched, and is passed on to the worker holding the
others, which skips those whose batch has not started. Batch and coding-group ids come from an ``IdSpace``
made at start, so a restarted dispatcher's ids never collide with the previous
incarnation's; a ``Done`` for another incarnation's batch is counted ``stale`` and ignored.

A batch takes only queries of one input shape and dtype (those of its first query); a
query of another shape waits for the next batch, so one bad row never costs good ones.
"""
from __future__ import annotations

import itertools
import time
from collections import OrderedDict

import zmq

from keel.common import tracing, transport
from keel.common.config import DispatcherConfig
from keel.common.ids import IdSpace
from keel.common.protocol import (
    MAX_SLOTS, MAX_THREADS, Answered, Batch, Configure, Done, Heartbeat, Leave, Queries, Register, ModelRole, Status,
    Withdraw, transit_s,
)
from keel.services.base import Service
from keel.services.requests import carry_trace, stack_rows
from keel.services.scheduling import CodingGroups, Inflight, ModelQueue, Query, WorkerState, batching_for
from keel.services.scheduling.distribution import distribution_policy
from keel.services.scheduling.ragged import SCAN as RAGGED_SCAN, kind_of as ragged_kind
from keel.services.scheduling.view import pool_summary

#: traced queries (``Predict.trace``) held between their Queries and their Batch at most
MAX_TRACES = 64


class Dispatcher(Service):
    role = "dispatcher"

    def __init__(self, cfg: DispatcherConfig):
        super().__init__(cfg.name, cfg.metrics_port)
        self.cfg = cfg
        self.policy = distribution_policy(cfg)
        #: Kairos §5.1's learning from Done: None for policies without it (no cost per Done)
        self._observe = getattr(self.policy, "observe", None)
        self.ids = IdSpace()  # batch ids of this incarnation
        self.group_ids = IdSpace(self.ids.epoch)  # coding-group ids
        self.queues: dict[str, ModelQueue] = {
            m: ModelQueue(m, p, batching_for(p), CodingGroups(p.k, self.group_ids) if p.k else None)
            for m, p in cfg.models.items()
        }
        for m, p in cfg.models.items():
            if p.k and p.parity_model:
                self.queues[p.parity_model] = ModelQueue(p.parity_model, p, batching_for(p), parity=True)
        self.workers: dict[bytes, WorkerState] = {}
        self.by_model: dict[str, list[WorkerState]] = {m: [] for m in self.queues}  # registration order
        self.names: dict[str, bytes] = {}
        self.strangers: set[bytes] = set()  # peers that heartbeated unregistered in this burst (``_ask_strangers``)
        self.answered: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.traces: dict[int, list[float]] = {}  # qid -> stamps of a traced query (a breakdown's), until batched
        self.pull = self.add_socket(transport.make_socket(self.ctx, zmq.PULL, bind=cfg.query_endpoint), self._on_queries)
        self.router = self.add_socket(transport.make_socket(self.ctx, zmq.ROUTER, bind=cfg.worker_endpoint), self._on_worker)
        self.encoder = (
            self.add_socket(transport.make_socket(self.ctx, zmq.PUSH, connect=cfg.encoder_endpoint)) if cfg.encoder_endpoint else None
        )
        self.every(cfg.heartbeat_interval_s, self._heartbeat)
        self.wake = self.timer(lambda now: self.dispatch())  # delayed batching: when to look again
        self.expired = self.requeued = self.stale = self.late_done = self.answered_skipped = 0
        self.shape_splits = self.refused_queries = self.refused_registers = self.unexpected = self.encoder_dropped = 0
        self.withdrawn = self.withdrawn_in_flight = 0  # cancelled queries removed from a queue / a worker told to skip
        m_dispatched = self.metrics.counter("dispatched_queries_total", "queries sent to workers", ["model"])
        m_expired = self.metrics.counter("expired_queries_total", "queries dropped because their deadline passed", ["model"])
        self.m_dispatched = {m: m_dispatched.labels(model=m) for m in self.queues}
        self.m_expired = {m: m_expired.labels(model=m) for m in self.queues}
        self.m_queue_time = self.metrics.histogram("queue_seconds", "time a query waited in the dispatcher queue")
        self.m_batch = self.metrics.histogram("dispatched_batch_size", "batch sizes", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        #: SERF §IV-D: the configurator of the models with a profile (None: none)
        self.serf = None
        if cfg.serf:
            from keel.services.serf import profile as serf_profile
            from keel.services.serf.configurator import Configurator

            profiles = {m: serf_profile.load(path) for m, path in cfg.serf.items() if m in self.queues}
            for m in set(cfg.serf) - set(self.queues):
                self.log.error("SERF: no queue for this model", model=m)
            # a model without a profile is held (served as configured, not switched) until a
            # rollout brings a version that has one: a missing profile must not stop the service
            self.serf = Configurator({m: p for m, p in profiles.items() if p is not None}, cfg.serf_hysteresis,
                                     cfg.serf_hold_s, confirm_s=cfg.serf_confirm_s) if profiles else None
            for m in [m for m, p in profiles.items() if p is None]:
                why = self.serf.hold(m, f"no profile for {m} at {cfg.serf[m]}: keel serf profile SPEC --model {m}")
                self.log.error("SERF: no profile for this model; its configuration stays as it is", model=m, why=why)
        if self.serf is not None:
            self.every(cfg.serf_interval_s, self._serf)
            gauge = self.metrics.gauge
            self.m_serf = {k: gauge(f"serf_{k}", doc, ["model"]) for k, doc in (
                ("arrival_rate", "arrival rate per worker SERF reads (req/s)"),
                ("slots", "requests at once of the model's workers"), ("threads", "torch threads per request"),
                ("predicted_seconds", "Eq. 13 mean latency of the current configuration at the current rate"),
                ("observed_seconds", "mean latency in the dispatcher (queue + service), EWMA"),
                ("service_ratio", "service time measured serving / profiled, running configuration, median of the last 20"))}
            self.m_serf_switches = self.metrics.counter("serf_switches_total", "configuration switches", ["model"])
            self.m_serf_corrections = self.metrics.counter(
                "serf_profile_corrections_total", "profile entries rescaled to the service times measured serving", ["model"])
        #: with a manager: active only while the manager's log names this dispatcher the
        #: holder of group "dispatcher" at an epoch >= every epoch it has seen (fencing)
        self.active, self.fence_epoch, self.manager = True, 0, None
        self.paused, self.pauses = False, 0  # paused: a newer epoch was seen (``_fenced``)
        if cfg.manager is not None:
            self.active = False
            me = {"name": self.name, "group": "dispatcher", "host": cfg.host,
                  "endpoints": {"query": cfg.query_endpoint, "worker": cfg.worker_endpoint}}
            started = time.monotonic()

            def may_register() -> bool:  # a standby lets the spec's dispatcher take the role first
                return (not cfg.standby or time.monotonic() - started > cfg.standby_wait_s
                        or self.manager.holder("dispatcher")[0] is not None)

            self.link_manager(cfg.manager, on_change=self._on_manager_change, me=me, on_role=self._on_role,
                              may_register=may_register)

    @property
    def wake_at(self) -> float | None:
        return self.wake.due

    # ------------------------------------------------------------------ frontends and encoder

    def _on_queries(self, sock: zmq.Socket) -> None:
        for _, msg in self.messages(sock):
            kind = type(msg)
            if kind is Queries:
                self._fenced(msg.fence)
                self._enqueue(msg, time.monotonic())
            elif kind is Batch and msg.role == ModelRole.PARITY:
                queue = self.queues.get(msg.model)
                if queue is not None and queue.parity:
                    queue.entries.append(msg)
                else:
                    self.refused_queries += len(msg.qids)
                    self.log.error("parity batch for a model with no parity queue", model=msg.model)
            elif kind is Answered:
                self._on_answered(msg)
            elif kind is Withdraw:
                self._on_withdraw(msg)
            else:
                self.unexpected += 1
        self.dispatch()

    def _enqueue(self, msg: Queries, now: float) -> None:
        queue = self.queues.get(msg.model)
        if queue is None or queue.parity:
            self.refused_queries += len(msg.qids)
            self.log.error("queries for a model with no query queue", model=msg.model)
            return
        inputs, reply_to, append = msg.inputs, msg.reply_to, queue.entries.append
        start = now - transit_s(msg.sent_at)  # when the frontend sent them, on this clock
        expired = 0
        if inputs is None:  # a named model's: a dict a query, its kind by the model's ragged policy
            policy, width = queue.policy.ragged, queue.policy.bucket_width
            rows = msg.rows
            kinds = [ragged_kind(policy, width, row) for row in rows]
        else:  # one object for the message's rows
            rows, kinds = inputs, itertools.repeat((inputs.shape[1:], inputs.dtype))
        for qid, budget_ms, row, kind in zip(msg.qids, msg.budgets_ms, rows, kinds):
            deadline = start + budget_ms / 1000.0
            if deadline <= now:
                expired += 1
                continue
            append(Query(qid, deadline, reply_to, row, now, kind))
        if expired:
            self.expired += expired
            self.m_expired[msg.model].inc(expired)
        queue.arrive(len(msg.qids), now)
        if msg.trace is not None and msg.traced is not None:
            self.traces[msg.traced] = [*msg.trace, time.time()]  # receipt (decoded)
            if msg.traceparent is not None and tracing.ON:
                tracing.received(self.name, msg.traced, msg.traceparent)
            if len(self.traces) > MAX_TRACES:  # a traced query that expired or was re-queued
                del self.traces[next(iter(self.traces))]

    def _on_answered(self, msg: Answered) -> None:
        limit = self.cfg.answered_limit
        if not limit:
            return
        answered = self.answered
        for qid in msg.qids:
            answered[(msg.model, qid)] = None
        while len(answered) > limit:
            answered.popitem(last=False)

    def _on_withdraw(self, msg: Withdraw) -> None:
        """Queries whose requests were cancelled: those still queued are removed (never
        dispatched, counted ``withdrawn``); the worker holding any of the others is told to
        skip them if its batch has not started (``withdrawn_in_flight``), and they count as
        answered, so a requeue after that worker dies does not run them. Others (already
        done, expired, unknown) are nothing to do."""
        queue = self.queues.get(msg.model)
        if queue is None or queue.parity:
            self.unexpected += 1
            return
        wanted = set(msg.qids)
        entries = queue.entries
        kept = [q for q in entries if q.qid not in wanted]
        removed = len(entries) - len(kept)
        if removed:
            wanted.difference_update(q.qid for q in entries)
            entries.clear()
            entries.extend(kept)  # in place: whoever holds the queue holds this deque
            self.withdrawn += removed
        forwarded = 0
        for worker in self.by_model.get(msg.model, ()) if wanted else ():
            held = [q.qid for f in worker.inflight.values() if isinstance(f.held, list) for q in f.held if q.qid in wanted]
            if held and self._send([worker.identity], Withdraw(model=msg.model, qids=held)):
                forwarded += len(held)
                self._on_answered(Answered(model=msg.model, qids=held))
        self.withdrawn_in_flight += forwarded
        self.log.info("withdrawn", model=msg.model, queued=removed, in_flight=forwarded, asked=len(msg.qids))

    # ------------------------------------------------------------------ workers

    def _on_worker(self, sock: zmq.Socket) -> None:
        for envelope, msg in self.messages(sock, router=True):
            identity = envelope[0].bytes
            worker = self.workers.get(identity)
            if worker is not None:
                worker.last_seen = time.monotonic()
            kind = type(msg)
            if kind is Done:
                self._on_done(worker, msg)
            elif kind is Register:
                self._on_register(identity, msg)
            elif kind is Heartbeat:
                if worker is None:
                    self.strangers.add(identity)
                else:
                    self._send([identity], Heartbeat(sender=self.name, known=True))
            elif kind is Leave:
                self._on_leave(worker, msg)
            elif kind is Status:
                self._send(envelope, Status(service=self.name, info=self.status()))
            elif kind is Configure and worker is None:
                self._on_configure(envelope, msg)
            else:
                self.unexpected += 1
        self._ask_strangers()
        self.dispatch()

    def _ask_strangers(self) -> None:
        """Tell each peer that heartbeated unknown, and did not register in the same burst,
        that this dispatcher does not know it: it registers. One answer per burst, however
        many of its heartbeats had queued while this dispatcher was down (a restart), so the
        worker registers once, not once per heartbeat (each Register after the first dropped
        the worker and re-queued the batches it had just been given)."""
        for identity in self.strangers:
            if identity not in self.workers:
                self._send([identity], Heartbeat(sender=self.name, known=False))
        self.strangers.clear()

    def _on_configure(self, envelope: list, msg: Configure) -> None:
        """An operator's (or an experiment's) ``Configure(model=M, slots=, threads=)``: every
        worker of M takes it live; answered with Status (``configured``: the workers, or an
        ``error``)."""
        error, done = None, []
        if msg.version is not None and self.serf is not None and msg.model in self.cfg.serf and msg.model in self.queues:
            # a rollout moved the model's workers to this version: SERF follows it
            self._send(envelope, Status(service=self.name, info={"serf": self._serf_follow(msg.model, msg.version)}))
            return
        if msg.model not in self.by_model or msg.version is not None:
            error = f"no model {msg.model!r} here" if msg.version is None else "versions roll out on the workers"
        else:
            try:
                done = [w.name for w in list(self.by_model[msg.model]) if self.configure(w.name, msg.slots, msg.threads)]
            except ValueError as exc:
                error = str(exc)
        self._send(envelope, Status(service=self.name, info={"configured": done, "error": error}))

    def _refusal(self, msg: Register) -> str | None:
        queue = self.queues.get(msg.model)
        if queue is None:
            return "the dispatcher does not serve this model"
        if msg.role not in (ModelRole.DEPLOYED, ModelRole.PARITY) or (msg.role == ModelRole.PARITY) != queue.parity:
            return "role does not match the model: a parity model's workers have role parity, and only they"
        return None  # slots, max_batch, threads, instance and price are bounded at the wire

    def _on_register(self, identity: bytes, msg: Register) -> None:
        old = self.workers.get(identity)
        if old is not None:
            self._drop(old, "worker registered again")  # it has lost what it held
        other = self.names.get(msg.worker)
        if other is not None and other in self.workers:
            self._drop(self.workers[other], "worker's name registered from a new connection")
        problem = self._refusal(msg)
        if problem is not None:
            self.refused_registers += 1
            self.log.error("registration refused", worker=msg.worker, model=msg.model, role=msg.role, reason=problem)
            return
        queue = self.queues[msg.model]
        max_batch = min(msg.max_batch, queue.policy.max_batch)
        worker = WorkerState(
            identity=identity, name=msg.worker, model=msg.model, role=msg.role, slots=msg.slots, max_batch=max_batch,
            batch_size=queue.batching.start_size(max_batch), last_seen=time.monotonic(),
            instance=msg.instance, price=msg.price, threads=msg.threads,
        )
        self.workers[identity] = worker
        self.by_model[msg.model] = [*self.by_model[msg.model], worker]
        self.names[msg.worker] = identity
        self.log.info("worker registered", worker=msg.worker, model=msg.model, role=msg.role, slots=msg.slots,
                      instance=msg.instance, threads=msg.threads)

    def _on_leave(self, worker: WorkerState | None, msg: Leave) -> None:
        if worker is None:
            return
        if msg.worker != worker.name:
            self.unexpected += 1
            self.log.warning("Leave names another worker than its sender; ignored", sender=worker.name, named=msg.worker)
            return
        self._drop(worker, "worker left")

    def _on_done(self, worker: WorkerState | None, msg: Done) -> None:
        held = worker.inflight.pop(msg.batch_id, None) if worker is not None else None
        if held is None:
            if not self.ids.owns(msg.batch_id):
                self.stale += 1  # a batch of another incarnation of this dispatcher
            else:
                self.late_done += 1  # re-queued when its worker was dropped
            return
        worker.batches += 1
        worker.last_service_ms = msg.service_ms
        if msg.max_batch is not None and msg.max_batch < worker.max_batch:  # its device memory holds no more
            worker.max_batch = msg.max_batch
            worker.batch_size = min(worker.batch_size, msg.max_batch)
            self.log.warning("worker batch ceiling lowered (out of device memory)", worker=worker.name, max_batch=msg.max_batch)
        if self.serf is not None and msg.ok and isinstance(held.held, list) and held.held:
            now = time.monotonic()
            for q in held.held:
                self.serf.observe(worker.model, (now - q.enqueued) * 1000.0)
            # the profile check: batches it still holds, this one included
            self.serf.observe_service(worker.model, (worker.slots, worker.threads), len(worker.inflight) + 1,
                                      msg.service_ms, held.sent_at, now)
        if msg.ok:
            worker.profile.observe(held.size, msg.service_ms)
        self.queues[worker.model].batching.observe(worker, held.size, msg.service_ms, msg.ok)
        if self._observe is not None and msg.ok and isinstance(held.held, list):
            # one Kairos query per batch (the plans' count 1): its size is the items summed
            size_of = self.policy.size_of
            self._observe(worker, sum(size_of(q) for q in held.held), msg.service_ms)

    def configure(self, worker_name: str, slots: int | None = None, threads: int | None = None) -> bool:
        """Change a worker's concurrency (``slots``) and/or torch ``threads`` (SERF): send it
        ``Configure`` and fill the new slots from now on. False if the worker is unknown or
        unreachable."""
        if slots is not None and not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots must be in 1..{MAX_SLOTS}")
        if threads is not None and not 1 <= threads <= MAX_THREADS:
            raise ValueError(f"threads must be in 1..{MAX_THREADS}")
        worker = self.workers.get(self.names.get(worker_name, b""))
        if worker is None or not self._send([worker.identity], Configure(slots=slots, threads=threads)):
            return False
        worker.slots = slots or worker.slots
        worker.threads = threads or worker.threads
        self.log.info("worker configured", worker=worker_name, slots=worker.slots, threads=worker.threads)
        self.dispatch()
        return True

    def _current(self, model: str) -> tuple[int, int] | None:
        workers = self.by_model.get(model)
        return (workers[0].slots, workers[0].threads) if workers else None

    def _serf_follow(self, model: str, version: str) -> dict:
        """SERF takes the profile of the ``version`` ``model``'s workers now serve (beside
        its manifest in the store, else in the run folder), or holds the model; its status."""
        from keel.services.serf import profile as serf_profile

        cfg = self.cfg
        path = serf_profile.where(cfg.serf_names.get(model, model), version, cfg.serf_store or None,
                                  cfg.serf_run_dir or None)
        why = self.serf.follow(model, version, serf_profile.load(path, version), str(path))
        if why:
            self.log.error("SERF holds this model's configuration", model=model, version=version, why=why)
        else:
            self.log.info("SERF follows the version served", model=model, version=version, profile=str(path))
        return self.serf.status({model: self._current(model)})[model]

    def _serf(self, now: float) -> None:
        """SERF's scheduler: the best configuration for each profiled model's load, live,
        within the cores each host has left (``serf_cores``)."""
        from keel.services.serf.configurator import cores_left

        for model in list(self.serf.models):
            current = self._current(model)
            if current is None:
                continue
            workers = self.by_model[model]
            corrected = self.serf.check(model, current, now)
            if corrected is not None:
                self.log.warning("serf profile corrected from serving", model=model, **corrected)
                self.m_serf_corrections.labels(model=model).inc()
            estimate = self.queues[model].arrival_rate(now)
            if estimate is None:  # no arrivals yet, or too recent to count
                continue
            rate, window_s = estimate
            cores = cores_left(self.cfg.serf_cores, self.cfg.serf_hosts, self.workers.values(), model) \
                if self.cfg.serf_cores else None
            choice = self.serf.decide(model, rate, current, len(workers), now, spread=self.serf.spread(rate, window_s),
                                      cores=cores, step_at=self.queues[model].step_at)
            if choice is not None:
                self.log.info("serf switch", model=model, rate=round(rate, 2), to=list(choice), previous=list(current))
                for w in list(workers):
                    self.configure(w.name, slots=choice[0], threads=choice[1])
                self.m_serf_switches.labels(model=model).inc()
            plan, (slots, threads) = self.serf.models[model], self._current(model) or current
            m = self.m_serf
            m["arrival_rate"].labels(model=model).set(plan.rate)
            m["slots"].labels(model=model).set(slots)
            m["threads"].labels(model=model).set(threads)
            if plan.predicted_ms is not None:
                m["predicted_seconds"].labels(model=model).set(plan.predicted_ms / 1000.0)
            if plan.observed_ms is not None:
                m["observed_seconds"].labels(model=model).set(plan.observed_ms / 1000.0)
            ratio = plan.service_ratio(now)
            if ratio is not None:
                m["service_ratio"].labels(model=model).set(ratio)

    # ------------------------------------------------------------------ dispatch

    def dispatch(self) -> None:
        self.wake.clear()
        if not self.active:  # a standby (or a stale dispatcher) keeps its queue, sends nothing
            return
        now = time.monotonic()
        for queue in self.queues.values():
            if queue.entries and self.by_model[queue.model]:
                self._dispatch_queue(queue, now)

    def _dispatch_queue(self, queue: ModelQueue, now: float) -> None:
        # Rounds of the policy's plan until the queue or the free slots run out: a worker
        # with several free slots gets several batches, spread like the rest.
        entries = queue.entries
        sent = True
        while sent and entries:
            sent = False
            workers = self.by_model[queue.model]  # anew each round: a failed send drops its worker
            kept: list = []  # chunks the plan keeps queued this round
            for a in self.policy.assign(queue, workers, now):
                if not entries:
                    break
                worker = a.worker
                if worker is None:
                    for _ in range(min(a.count or 1, len(entries))):
                        kept.append(entries.popleft())
                    continue
                if not worker.alive or worker.free_slots <= 0:
                    continue
                if queue.parity:
                    self._send_batch(worker, entries.popleft(), None, now)
                elif not self._take_batch(queue, worker, a.count, now):
                    break
                sent = True
            if kept:
                entries.extendleft(reversed(kept))

    def _take_batch(self, queue: ModelQueue, worker: WorkerState, count: int | None, now: float) -> bool:
        want = max(1, min(count or queue.batching.size(worker), worker.max_batch))
        hold = queue.batching.hold_until(queue, want, now)
        if hold is not None:
            self.wake.at_latest(hold)
            return False
        entries, answered, model = queue.entries, self.answered, queue.model
        taken: list[Query] = []
        kind = None
        expired = skipped = 0
        passed: list[Query] | None = None  # a named model's queries of another kind, looked past
        while entries and len(taken) < want:
            query = entries.popleft()
            if query.deadline <= now:
                expired += 1
                continue
            if query.requeued and (model, query.qid) in answered:
                skipped += 1
                continue
            if query.kind is not kind:
                if kind is None:
                    kind = query.kind
                elif query.kind != kind:  # another shape or dtype: it heads the next batch
                    if type(query.input) is dict:  # a named model's: look further for the head's kind
                        if passed is None:
                            passed = []
                        passed.append(query)
                        if len(passed) < RAGGED_SCAN:
                            continue
                    else:
                        entries.appendleft(query)
                    self.shape_splits += 1
                    break
            taken.append(query)
        if passed:
            entries.extendleft(reversed(passed))  # in their order, at the head again
        if expired:
            self.expired += expired
            self.m_expired[model].inc(expired)
        self.answered_skipped += skipped
        if not taken:
            return False
        named = type(taken[0].input) is dict  # a named model's: each query's dict, padded by the worker
        batch = Batch(
            batch_id=0, model=model, qids=[q.qid for q in taken], reply_to=[q.reply_to for q in taken],
            inputs=None if named else stack_rows([q.input for q in taken]), rows=[q.input for q in taken] if named else None,
            group=queue.coding.tag() if queue.coding else None,
            budgets_ms=[(q.deadline - now) * 1000.0 for q in taken],
            fence=self.fence_epoch or None,  # 0: no manager named this dispatcher
            sent_at=time.time(),
        )
        if self.traces:
            carry_trace(self.traces, batch)
            if tracing.ON and batch.traced is not None:
                tracing.sent(self.name, "dispatcher", batch)
        if not self._send_batch(worker, batch, taken, now):
            return True  # its worker is dropped and the queries are back in the queue
        for q in taken:
            self.m_queue_time.observe(now - q.enqueued)
        self.m_dispatched[model].inc(len(taken))
        self.m_batch.observe(len(taken))
        if batch.group is not None and self.encoder is not None:
            # after the worker has it: encoding never delays dispatch
            if not transport.try_send(self.encoder, batch):
                self.encoder_dropped += 1
        return True

    def _send_batch(self, worker: WorkerState, batch: Batch, queries: list[Query] | None, now: float) -> bool:
        batch.batch_id = self.ids.next()
        worker.inflight[batch.batch_id] = Inflight(batch if queries is None else queries, len(batch.qids), now)
        if self._send([worker.identity], batch):
            return True
        self._drop(worker, "worker unreachable; dropped")
        return False

    def _send(self, envelope: list, msg) -> bool:
        try:
            return transport.try_send(self.router, msg, envelope)
        except zmq.ZMQError as exc:
            self.log.warning("send failed", kind=type(msg).__name__, error=str(exc))
            return False

    # ------------------------------------------------------------------ liveness

    def _heartbeat(self, now: float) -> None:
        limit = self.cfg.heartbeat_interval_s * self.cfg.heartbeat_liveness
        for identity, worker in list(self.workers.items()):
            if now - worker.last_seen > limit:
                self._drop(worker, "worker missed heartbeats; dropped")
            else:
                self._send([identity], Heartbeat(sender=self.name))
        for queue in self.queues.values():
            queue.update_rate(now)
        self.dispatch()

    def _drop(self, worker: WorkerState, reason: str) -> None:
        """Forget ``worker`` and put what it held back at the head of its queue."""
        if self.workers.get(worker.identity) is worker:
            del self.workers[worker.identity]
        if worker in self.by_model.get(worker.model, ()):
            self.by_model[worker.model] = [w for w in self.by_model[worker.model] if w is not worker]
        if self.names.get(worker.name) == worker.identity:
            del self.names[worker.name]
        worker.alive = False
        self.log.warning(reason, worker=worker.name, inflight=len(worker.inflight))
        self._requeue(worker)

    def _requeue(self, worker: WorkerState) -> None:
        queue = self.queues.get(worker.model)
        if queue is None:
            return
        answered, model = self.answered, worker.model
        for flight in reversed(list(worker.inflight.values())):
            held = flight.held
            if isinstance(held, Batch):
                queue.entries.appendleft(held)
                continue
            # ParM: a reconstruction may already have answered some of these queries
            keep = [q for q in held if (model, q.qid) not in answered] if answered else held
            self.answered_skipped += len(held) - len(keep)
            for q in keep:
                q.requeued = True
            queue.entries.extendleft(reversed(keep))
            self.requeued += len(keep)
        worker.inflight.clear()

    # ------------------------------------------------------------------ the manager's decisions

    def _on_manager_change(self, key: str, value: dict | None) -> None:
        if key == "group/dispatcher" and value is not None:
            self._on_role(value.get("holder"), value.get("epoch", 0))

    def _on_role(self, holder: str | None, epoch: int) -> None:
        """The manager's applied decision, from a heartbeat answer or the change feed: hold
        the active role only at the newest epoch seen; an older epoch is stale."""
        if epoch < self.fence_epoch:
            return  # an answer from a replica that lags behind what we already saw
        self.fence_epoch = epoch
        paused, self.paused = self.paused, False
        if holder == self.name and not self.active:
            self.active = True
            self.log.warning("resumed: active dispatcher" if paused else "promoted: active dispatcher", epoch=epoch)
            self.dispatch()
        elif holder != self.name and (self.active or paused):
            self.step_down(holder, epoch)

    def _fenced(self, fence: int | None) -> None:
        """A frontend stamped its queries with a newer epoch than any this dispatcher has
        seen: the manager decided something that has not reached it yet (it was frozen or
        cut off). Stop dispatching, keeping the queue, until that decision arrives: then it
        resumes if it is still the holder, else steps down (``_on_role``). A dispatcher no
        manager ever named (epoch 0: no manager) ignores fences."""
        if fence is not None and fence > self.fence_epoch > 0 and self.active:
            self.active, self.paused = False, True
            self.pauses += 1
            self.log.warning("newer epoch seen: paused until the manager's decision", epoch=fence, own=self.fence_epoch)

    def step_down(self, holder: str | None, epoch: int) -> None:
        """Another dispatcher holds the role at a newer epoch: stop dispatching, forget the
        queues (the frontends re-send every unanswered query to the new one) and workers."""
        self.active = False
        dropped = sum(len(q.entries) for q in self.queues.values())
        for queue in self.queues.values():
            queue.entries.clear()
        for worker in list(self.workers.values()):
            worker.inflight.clear()
            self._drop(worker, "stepping down: worker forgotten")
        self.log.warning("stale: stepped down", holder=holder, epoch=epoch, dropped_queries=dropped)

    def drain(self) -> None:
        if self.manager is not None:
            self.manager.close()

    def status(self) -> dict:
        return {
            "service": self.name,
            "role": self.role,
            "active": self.active,
            "fence_epoch": self.fence_epoch,
            "pauses": self.pauses,
            "epoch": self.ids.epoch,
            "policy": self.cfg.policy,
            "queues": {m: len(q.entries) for m, q in self.queues.items()},
            "arrival_rate": {m: round(q.rate, 3) for m, q in self.queues.items()},
            "workers": {w.name: w.status() for w in self.workers.values()},
            **pool_summary(self.workers.values()),
            "expired": self.expired,
            "requeued": self.requeued,
            "stale": self.stale,
            "late_done": self.late_done,
            "answered_skipped": self.answered_skipped,
            "answered_known": len(self.answered),
            "shape_splits": self.shape_splits,
            "refused_queries": self.refused_queries,
            "refused_registers": self.refused_registers,
            "unexpected": self.unexpected,
            "encoder_dropped": self.encoder_dropped,
            "withdrawn": self.withdrawn,
            "withdrawn_in_flight": self.withdrawn_in_flight,
            **({"serf": self.serf.status({m: self._current(m) for m in self.cfg.serf})} if self.serf else {}),
        }
