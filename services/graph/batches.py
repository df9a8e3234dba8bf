"""A serving operator's batch (``step``): compute, number with lineage (HAMS Algorithm 1),
send or hold the outputs, update the state and copy it (NSPB, §IV-B..D), per mode
(``common.spec.modes``)::

    compute(batch n)            reads the state only
    outputs -> successors       at once (nspb, s2, bare); after the backup has state n (s1, remus)
    wait: copy of n-1 finished and < W states in flight      (nspb, s1)
    update(batch n)             changes the state
    copy state n                in the background while n+1 computes (nspb, s1); stopped (s2, remus)

A model whose batches take longer than ``DEVICE_ABOVE_MS`` computes on the operator's device
thread (``services.executors``, one thread; torch and a GPU's wait release the GIL), as a
GPU service's batch runs on its device while the host goes on: the loop serves its inbox
meanwhile (inputs, acks, durability notices, heartbeats), and once a batch is computed it
numbers and sends its outputs, updates the state, starts the next batch, and only then, in
the background modes (nspb, s1), ships the state it updated (``pending_ship``, in the same
tick: the copy overlaps the next batch's compute, which reads the state the copy reads).
The stop-to-copy modes (s2, remus) ship before the next batch starts: their model stops
for the copy, as the paper's baselines do. A loop that stopped for each batch (50 ms at HAMS's
scale) added its own per-batch work to every batch: a stateful operator's NSPB work made
its batches 0.5 ms longer than its neighbours', and a 50 ms fan-out's branches then drifted
out of phase (their join waited up to a batch). A short batch computes on the loop, where
a hand-off would cost more than it frees.

An object of its own (``Batches``), wired by ``services.graph.operator.GraphOperator``; it
serves while the role is STATELESS, PRIMARY or DEGRADED.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from keel.common.protocol.messages import GraphRequest
from keel.common.spec.graph import FRONTEND
from keel.services.graph import lineage as lin
from keel.services.executors import Executors, Job, set_torch_threads
from keel.services.graph.models import GraphBatch, split_failing
from keel.services.graph.roles import SERVING, OperatorRole as R


#: a model whose batches take longer than this (a running mean) computes them on the device
#: thread (the module's docstring); a shorter one on the loop: the two hand-offs a batch then
#: makes (to the thread and back, ~0.1-0.7 ms each on a busy 2-core machine) pay where the
#: batch is long against them (HAMS's 50 ms), not at 10 ms a batch, where batch-1 replies
#: measured slower with them (nspb's overhead over bare +10.5% against +8.1%, quick runs)
DEVICE_ABOVE_MS = 20.0
#: a ship waits at most this long for the device thread to begin its batch (``ship_pending``)
DEVICE_START_WAIT_S = 0.05
#: weight of the newest batch in the compute time's running mean
_COMPUTE_EWMA = 0.3

#: an update waits for the window at most this long (a backup that never acks is lost
#: long before: BACKUP_GRACE_S); then it goes on, as Remus would after a timeout
UPDATE_WAIT_MAX_S = 30.0


@dataclass
class _Update:
    """A batch whose outputs left and whose update waits for NSPB's window."""
    model: object
    batch: GraphBatch | None
    outputs: np.ndarray | None
    recorded: list
    rows: list
    first: int
    last: int
    lineages: list
    outs: list
    t: float  # when it began to wait
    replies: list  # (target, output) for the frontend, sent once the state they wait on ships


class Batches:
    """A serving operator's batches, wired by ``GraphOperator``: given its operator's spec
    and mode, the role record, ``serving`` and ``tables`` (``services.graph.tables``), the
    send functions (``links``), ``notify`` (a degraded primary's Algorithm 2), ``leased()``
    (may I number and send) and ``inbox_waiting()``."""

    def __init__(self, op: str, spec, mode, stateful: bool, preds: list[str], succs: list[str], roles, serving,
                 tables, links, events, log, stash, notify, leased, inbox_waiting):
        self.op, self.spec, self.mode, self.stateful, self.preds, self.succs = op, spec, mode, stateful, preds, succs
        self.roles, self.serving, self.tables, self.links = roles, serving, tables, links
        self.events, self.log, self.stash = events, log, stash
        self.notify, self.leased, self.inbox_waiting = notify, leased, inbox_waiting
        self.pending_update: _Update | None = None
        #: the batch on the device thread: (its job, whose ``live`` holds its rows; the rows computed)
        self.computing: tuple[Job, list] | None = None
        self.computed_job: Job | None = None  # its job once finished, for ``after_poll`` to take on
        #: the ship of the state just updated (and the replies that wait for it to start), made
        #: once the next batch has started (``after_poll``: one update a tick, one ship)
        self.pending_ship = None
        self.compute_ms = 0.0  # running mean of a batch's compute
        self.device: Executors | None = None  # the device thread (``open_device``)
        self.device_started = threading.Event()  # the device thread began the batch just submitted
        self.batches = self.rows = self.errors = 0
        self.duplicates = 0  # rows answered from the table of applied requests, not applied again
        self.lineage_s = self.output_loop_s = 0.0  # Algorithm 1's bookkeeping; it and each row's output message
        # the last batches' lineage times: their median beside the mean, which on a shared
        # machine also counts the batches the OS preempted mid-loop
        self.lineage_recent: deque[float] = deque(maxlen=1000)
        self.update_wait_s = self.update_s = 0.0  # NSPB's wait before an update; the updates themselves

    def open_device(self) -> int:
        """Start the device thread; its fd (readable when a batch finished: ``on_device_done``)."""
        self.device = Executors(self.run_on_device, set_torch_threads)
        self.device.ensure(1)
        return self.device.fd

    def close(self) -> None:
        if self.device is not None:
            self.device.close()

    def idle(self) -> bool:
        """No batch computing or waiting for its update: the next may start."""
        return self.pending_update is None and self.computing is None

    def after_poll(self, guarded, can_step) -> None:
        """The batch chores of a tick, in this order, with no message handled in between: a
        batch the device computed is numbered, sent and updated, the next one starts (when
        ``can_step()``), then its state ships (nspb, s1). ``guarded(name, fn, arg)`` runs each
        (``Service._guarded``)."""
        if self.computed_job is not None:
            guarded("computed", lambda _: self.take_computed(), None)
        if self.pending_update is not None:
            guarded("update", lambda _: self._try_update(later=True), None)
        if can_step():
            guarded("step", self.step, None)
        if self.pending_ship is not None:
            guarded("ship", lambda _: self.ship_pending(), None)

    def status(self) -> dict:
        n = max(1, self.batches)
        return dict(batches=self.batches, rows=self.rows, errors=self.errors, duplicates=self.duplicates,
                    lineage_ms_per_batch=1000 * self.lineage_s / n,
                    lineage_ms_p50=1000 * float(np.median(self.lineage_recent)) if self.lineage_recent else 0.0,
                    output_loop_ms_per_batch=1000 * self.output_loop_s / n,
                    update_wait_ms_per_batch=1000 * self.update_wait_s / n, update_ms_per_batch=1000 * self.update_s / n,
                    compute_ms=self.compute_ms, computing=self.computing is not None)

    def step(self, _=None) -> None:
        """The next batch: computed here, or started on the device thread (the module's
        docstring), where ``tick`` takes it on once ``on_device_done`` has it."""
        rows = self._next_batch()
        # exactly once: a request my state applied already is not applied again (its saved
        # output goes on, numbered like any output); only the others are computed and applied
        fresh = [r for r in rows if self.tables.applied is None or self.tables.applied.get(self._key(r)) is None]
        batch = GraphBatch(np.stack([r.input for r in fresh]), [r.stream for r in fresh]) if fresh else None
        job = Job(batch, rows, time.monotonic(), self.serving.model)
        if fresh and self.compute_ms > DEVICE_ABOVE_MS:
            self.computing = (job, fresh)
            self.device_started.clear()
            self.device.submit(job)
            return
        # computed here: a ship waiting for a batch to start goes first (the last state ships
        # before this batch's update changes it)
        self.ship_pending()
        if fresh:
            self.run_on_device(job)  # here, on the loop
            self._timed(job)
        self._computed(rows, fresh, batch, job.outputs, job.error)

    def run_on_device(self, job: Job) -> None:
        """A batch's compute (on the device thread, or on the loop for a short one)."""
        self.device_started.set()
        t0 = time.perf_counter()
        try:
            job.outputs = job.predictor.compute(job.batch)
        except Exception as exc:  # the model's own error: answered per row (``_computed``)
            job.error = exc
        job.service_ms = (time.perf_counter() - t0) * 1000

    def _timed(self, job: Job) -> None:
        first = self.batches == 0
        self.compute_ms = job.service_ms if first else (1 - _COMPUTE_EWMA) * self.compute_ms + _COMPUTE_EWMA * job.service_ms

    def on_device_done(self, _fd=None) -> None:
        """The device thread finished a batch: kept for ``tick``, unless a roll-back, a
        fencing or a step-down dropped it meanwhile (``computing`` cleared or another model):
        then its inputs come again by lineage, as an abandoned update's do."""
        for job in self.device.done():
            if self.computing is not None and self.computing[0] is job:
                self.computed_job = job

    def take_computed(self) -> None:
        """Go on with the batch the device thread computed (``tick``)."""
        job, self.computed_job = self.computed_job, None
        fresh = self.computing[1]
        self.computing = None
        self._timed(job)
        if job.predictor is not self.serving.model or self.roles.role not in SERVING:
            return  # rolled back, fenced or stepped down while it computed
        self._computed(job.live, fresh, job.batch, job.outputs, job.error, later=True)

    def drop_computing(self) -> None:
        """A roll-back or a step-down: the batch computing is void."""
        self.computing = self.computed_job = None

    def ship_pending(self) -> None:
        """The ship that waited for the next batch to start (``tick``). When the device
        thread has it, the ship waits until the thread has begun it: the ship's copy holds
        the GIL for as long as it runs, and a batch that could not begin until then began
        that much later, every batch (nspb's stateful branch of a 50 ms fan-out ran 0.2 ms
        a batch behind its stateless twin: their join then waited up to a batch)."""
        ship, self.pending_ship = self.pending_ship, None
        if ship is not None:
            if self.computing is not None:
                self.device_started.wait(DEVICE_START_WAIT_S)
            ship()

    def _computed(self, rows: list, fresh: list, batch: GraphBatch | None, outputs, error: Exception | None,
                  later: bool = False) -> None:
        """A computed batch: numbered with its lineage, its outputs sent or held, its update
        started (or waiting for NSPB's window). ``later``: in the background modes the
        ship waits in ``pending_ship`` for the next batch to start."""
        computed = {}
        if batch is not None:
            if error is not None:  # the model's own error: the rows it fails on are answered now, the rest go on
                failed = {id(r) for r in fresh}
                fresh, batch, outputs = self._without_failing_rows(fresh)
                failed -= {id(r) for r in fresh}
                rows = [r for r in rows if id(r) not in failed]
                if not rows:
                    return
            computed = {id(r): out for r, out in zip(fresh, outputs if fresh else [])}
        if not self.leased():  # frozen (or starved) past the lease while computing: number and send nothing yet
            self.serving.queue.extendleft(reversed(rows))  # compute only read the state: it runs again once confirmed
            return
        first = self.serving.next_seq
        # what is the same for every row, decided once per batch (only what differs per row
        # is done per row)
        logging_events, op, succs, epoch = bool(self.events), self.op, self.succs, self.roles.epoch
        combining = len(self.preds) > 1 and self.spec.join != "interleave"  # inputs numbered in step (_on_request)
        # Algorithm 1, the lineage bookkeeping (HAMS §VI's logging cost per batch, timed alone):
        # each row's lineage after this operator numbers it, what my state holds of each source
        t1 = time.perf_counter()
        row_lineages, lineages, took = lin.number(rows, first, op, combining, self.stateful)
        took_s = time.perf_counter() - t1
        # the outputs: one message per row (bare builds them too)
        degraded_here = True if self.roles.role is R.DEGRADED else None
        recording = self.tables.applied is not None
        sends, outs, recorded = [], [], []  # recorded: (request, seq, origin, output) newly applied
        end = first + len(rows) - 1
        for seq, r, lineage in zip(range(first, first + len(rows)), rows, row_lineages):
            fresh_row = id(r) in computed
            out = computed[id(r)] if fresh_row else self.tables.applied.get(self._key(r)).output
            if fresh_row and recording and r.request is not None:
                recorded.append((self._key(r), seq, r.origin, out))
            outs.append(out)
            msg = GraphRequest(op, seq, r.origin, r.stream, lineage, out,
                               degraded=degraded_here or (True if r.degraded else None),  # the client is told
                               request=r.request, reply_to=r.reply_to, more=True if seq < end else None)
            if logging_events:
                self.events.write("output", operator=op, seq=seq, epoch=epoch, origin=r.origin, output=out,
                                 request=r.request, duplicate=None if fresh_row else True)
            for target in succs:
                sends.append((target, msg))
            if self.stateful:
                self.serving.outputs[seq] = msg
        self.serving.next_seq = first + len(rows)
        for source, seq in took.items():
            self.tables.consumed[source] = max(self.tables.consumed.get(source, -1), seq)  # what my state holds
        last = self.serving.next_seq - 1
        self.lineage_s += took_s
        self.lineage_recent.append(took_s)
        self.output_loop_s += time.perf_counter() - t1
        self.batches += 1
        self.rows += len(rows)
        self.duplicates += len(rows) - len(computed)
        replies = []
        if self.stateful and self.mode.hold_outputs:
            self.serving.held[last] = sends
        else:
            if self.events and not self.mode.ships_state:  # strawman, ls: no backup saw them; the checker's
                self.events.flush()  # record of what left must be on disk before they leave (a kill loses the buffer)
            if self.serving.model.stateful and self.mode.ships_state and self.roles.role is R.PRIMARY:
                # the frontend holds these replies until this batch's state is durable, which
                # takes the update and the ship: they leave once the ship has started, so
                # their sends are not on the way to it (outputs to operators leave at once)
                replies = [(t, m) for t, m in sends if t == FRONTEND]
                sends = [(t, m) for t, m in sends if t != FRONTEND]
            self._send_all(sends)
        if not self.serving.model.stateful:
            return
        self.pending_update = _Update(self.serving.model, batch, outputs if batch is not None else None, recorded, rows, first, last,
                                      lineages, outs, time.perf_counter(), replies)
        if self.stateful and self.roles.role is R.PRIMARY and self.mode.ships_state:
            self.serving.statemgr.wait_copy()  # NSPB: the update of batch n starts once the copy of state n-1 has finished
        self._try_update(later)

    def _try_update(self, later: bool = False) -> None:
        """NSPB: the update of the pending batch starts once fewer than W states are in
        flight (``StateManager.ready_for_update``). ``later``: the state's ship, and the
        replies that wait for it to start, wait in ``pending_ship`` for the next batch to
        start. Until then the loop goes on serving
        everything but a new batch (its inbox, its heartbeats: a wait longer than the
        manager's silence window must not read as a death, the backup's disconnect,
        status); a predecessor's takeover or my backup's death may roll me back meanwhile:
        then the batch is abandoned, its inputs come again by lineage."""
        u = self.pending_update
        if self.serving.model is not u.model or self.roles.role not in (R.PRIMARY, R.DEGRADED, R.STATELESS) \
                or (u.model is not None and self.roles.role is R.PRIMARY and self.serving.statemgr is None):
            self.pending_update = None  # rolled back or stepped down: re-run from its resent inputs
            return  # (its replies are dropped: their state never ships, the re-run answers)
        if self.stateful and self.roles.role is R.PRIMARY and self.mode.ships_state \
                and not self.serving.statemgr.ready_for_update() and time.perf_counter() - u.t < UPDATE_WAIT_MAX_S:
            return  # an ack moves the window: tick tries again
        self.pending_update = None
        t3 = time.perf_counter()
        if u.batch is not None:
            if self.events and self.mode.ships_state:  # the update starts: the experiment's hold beside its floor
                self.events.write("update", operator=self.op, first_seq=u.first, last_seq=u.last)
            self.serving.model.update(u.batch, u.outputs)
        # the table changes with the state it describes (a batch abandoned above recorded nothing)
        now = time.time()
        for request, seq, origin, out in u.recorded:
            self.tables.applied.record(request, seq, origin, out, now)
        applied = [[request, seq] for request, seq, _, _ in u.recorded]
        self.update_wait_s += t3 - u.t
        self.update_s += time.perf_counter() - t3
        rows, first, last, lineages = u.rows, u.first, u.last, u.lineages
        if self.roles.role is R.DEGRADED:  # no backup: its own state counts once Algorithm 2 allows (replies do not stall)
            self.notify(self.serving.own.receive(lin.ShippedState(self.op, self.roles.epoch, first, last, [lineages],
                                                           {"applied": applied})))
        elif self.stateful and self.mode.ships_state:
            meta = {"origins": [r.origin for r in rows], "streams": [r.stream for r in rows],
                    "requests": [r.request for r in rows], "reply_to": [r.reply_to for r in rows],
                    "applied": applied, "t": now}  # the backup records the same requests at the same t
            touched = getattr(self.serving.model, "touched", None)  # a model of one's own need not subclass StatefulOperator
            touched = touched() if touched and u.batch is not None else None
            statemgr, model = self.serving.statemgr, self.serving.model

            def ship():
                if self.events:  # the state's ship starts (its serialize, send, apply follow): the experiment's floor
                    self.events.write("ship", operator=self.op, first_seq=first, last_seq=last)
                # idle: copying in place stops no batch (the device computes the next one, or none waits)
                idle = self.computing is not None or (not self.serving.queue and not self.inbox_waiting())
                statemgr.start(model.state_arrays, dict(zip(range(first, last + 1), u.outs)), first, last, lineages,
                               idle=idle, meta=meta, touched=touched,
                               waited_on=self.mode.hold_outputs or FRONTEND in self.succs)
                self._send_all(u.replies)
        else:
            ship = None
        if self.stateful and self.stash is not None:
            self.stash.after_update(last, lineages, applied)
        if ship is None:
            self._send_all(u.replies)
        elif later and self.mode.copy_in_background:
            self.pending_ship = ship
        else:
            ship()

    def _send_all(self, sends: list) -> None:
        for target, msg in sends:
            if target not in self.serving.awaiting:  # else the resend on its ack carries it (saved in outputs)
                self.links.send_on(target, msg)

    def _next_batch(self) -> list[GraphRequest]:
        """The next batch's rows. A second row of one request (a retry queued beside the
        first) waits for the next batch: by then the first is applied, and it is answered
        from the table."""
        rows, keys, later = [], set(), []
        while self.serving.queue and len(rows) < self.spec.max_batch:
            r = self.serving.queue.popleft()
            if self.tables.applied is not None and r.request is not None and self._key(r) in keys:
                later.append(r)
            else:
                keys.add(self._key(r))
                rows.append(r)
        self.serving.queue.extendleft(reversed(later))
        return rows

    def _key(self, r: GraphRequest) -> str | None:
        """The name of an input in my table: its request's key; behind an interleaving join a
        request has an input from each predecessor, each applied once: key@predecessor."""
        if r.request is None or len(self.preds) == 1 or self.spec.join != "interleave":
            return r.request
        return f"{r.request}@{r.sender}"

    def _without_failing_rows(self, rows: list[GraphRequest]):
        """The model raised on a batch: answer the rows it fails on alone with the error
        (straight to the frontend; no seq is used, 0 on the wire; the state is untouched);
        the rest are computed again as one batch (``models.split_failing``)."""
        good, batch, outputs, errors = split_failing(self.serving.model, rows)
        for r in rows:
            if id(r) in errors:
                exc = errors[id(r)]
                why = f"operator {self.op} ({self.spec.kind}) failed: {type(exc).__name__}: {exc}"[:500]
                self.log.error("model error; the request is answered with it", operator=self.op, error=why)
                self.errors += 1
                self.links.send_on(FRONTEND, GraphRequest(self.op, 0, r.origin, r.stream, [], np.zeros(0, np.float32),
                                                          error=why, request=r.request, reply_to=r.reply_to))
        return good, batch, outputs

    def release_held(self, seq: int) -> None:
        """Held sends (s1, remus) of batches up to ``seq``: their state is at the backup."""
        for last in [s for s in self.serving.held if s <= seq]:
            for target, msg in self.serving.held.pop(last):
                self.links.send_on(target, msg)
