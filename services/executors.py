"""The worker's executors: the threads that run its batches through the model, so that a
worker computes up to ``slots`` batches at once (SERF's service parallelism) while its
poll loop keeps every ZeroMQ socket on its own thread. A graph operator uses one as its
device thread for long batches (``services.graph.batches``).

On a GPU each executor is also a CUDA stream (``common.datapath.DataPath``: one stream
per thread), so batches in different slots overlap their copies and kernels.

torch's intra-op thread count is per calling OS thread (OpenMP state, set once per thread
when it first computes), so an executor sets it itself before a batch whenever the
configured figure (``Executors.torch_threads``) changed.

A batch goes to the first idle executor (in the order they were made), not to whichever
waits: each executor has its own OpenMP team, and a team whose threads have gone to sleep
is slow to wake, so with one slot the same executor, with its team still spinning
(``WorkerConfig.omp_spincount``), takes every batch. Measured (ResNet-18 32x32, 2 torch
threads, requests 50 ms apart, two executors made): 17.8-18.0 ms when they alternated,
9.3-9.7 ms with one team.
"""
from __future__ import annotations

import collections
import os
import queue
import sys
import threading
import time

from keel.common.protocol import Batch

#: executor threads at most: beyond this many slots, batches wait in the worker for one
MAX_EXECUTORS = 64


class Job:
    """One batch on its way through an executor: what the loop needs to answer it."""

    __slots__ = ("batch", "live", "received", "predictor", "version", "outputs", "error", "service_ms", "running", "trace",
                 "skipped", "padded")

    def __init__(self, batch: Batch, live: list[int], received: float, predictor, version: str | None = None):
        self.batch, self.live, self.received, self.predictor = batch, live, received, predictor
        self.version = version  # of ``predictor``: a rollout may swap the worker's model while this computes
        self.outputs, self.error, self.service_ms = None, None, 0.0
        self.running = 1  # batches computing when this one started, itself included
        self.trace: list[float] | None = None  # a traced query's stamps (``Batch.trace``), receipt the last
        self.skipped = 0  # rows withdrawn (their requests cancelled) before the batch started: not run
        self.padded = None  # a named model's batch as padded (``common.ragged.Padded``: its waste)


class Executors:
    """Threads that run batches through the model, as many as the worker's slots (grown on
    demand, never shrunk: an idle one costs nothing). ``submit`` queues a job; a finished
    job lands in ``finished`` and a byte on the pipe whose read end (``fd``) the worker's
    loop polls. ``running``/``peak`` count batches computing at once."""

    def __init__(self, run, set_threads):
        self.run, self.set_threads = run, set_threads  # run(job) fills it; set_threads(n) -> applied, or None
        self.inbox: list[queue.SimpleQueue] = []  # per executor: the job handed to it while it was idle
        self.idle: list[bool] = []
        self.pending: collections.deque = collections.deque()  # jobs that came while every executor was busy
        self.finished: queue.SimpleQueue = queue.SimpleQueue()
        self.fd, self._wfd = os.pipe()
        os.set_blocking(self.fd, False)
        self.threads: list[threading.Thread] = []
        self.torch_threads = 1  # what each executor sets before its next batch
        self.running = self.peak = 0
        self._lock = threading.Lock()

    def ensure(self, n: int) -> None:
        while len(self.threads) < min(n, MAX_EXECUTORS):
            i = len(self.threads)
            with self._lock:
                self.inbox.append(queue.SimpleQueue())
                self.idle.append(False)  # until its loop first looks: it takes a pending job then
            t = threading.Thread(target=self._loop, args=(i,), name=f"executor-{i}", daemon=True)
            self.threads.append(t)
            t.start()

    def submit(self, job: Job) -> None:
        """To the first idle executor; with none idle, to the next executor that finishes."""
        with self._lock:
            i = next((k for k, free in enumerate(self.idle) if free), None)
            if i is None:
                self.pending.append(job)
                return
            self.idle[i] = False
        self.inbox[i].put(job)

    def _next(self, i: int) -> Job | None:
        """The next pending job, or (none pending) mark executor ``i`` idle and wait for one."""
        with self._lock:
            if self.pending:
                return self.pending.popleft()
            self.idle[i] = True
        return self.inbox[i].get()

    def _loop(self, i: int) -> None:
        mine = None  # the torch threads this thread last set
        while True:
            job = self._next(i)
            if job is None:
                return
            if self.set_threads is not None and mine != self.torch_threads and self.set_threads(self.torch_threads):
                mine = self.torch_threads
            with self._lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
                job.running = self.running
            try:
                self.run(job)
            finally:
                with self._lock:
                    self.running -= 1
                self.finished.put(job)
                os.write(self._wfd, b"x")

    def done(self) -> list[Job]:
        """The jobs finished since the last call (drains the pipe). No read or get that
        finds nothing: each raised, and an exception is dear in a loop woken cold (a
        pipe with more than 4,096 wake-up bytes stays readable: the loop comes back)."""
        try:
            os.read(self.fd, 4096)
        except BlockingIOError:  # none written since the last call
            pass
        out = []
        finished = self.finished
        while not finished.empty():  # this loop is its only reader
            out.append(finished.get_nowait())
        return out

    def close(self, wait_s: float = 2.0) -> None:
        for box in self.inbox:
            box.put(None)
        deadline = time.monotonic() + wait_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if not any(t.is_alive() for t in self.threads):
            # a thread still computing would write to a closed (or reused) descriptor; the
            # process is ending anyway, so its pipe is left to the exit
            os.close(self._wfd)
            os.close(self.fd)


def set_torch_threads(n: int) -> bool:
    """Set this thread's torch threads; False (nothing to set, try again later) while the
    process has not imported torch. A model that does not use torch (a Python container)
    must not pay torch's import, seconds, on its first batch: that import, done by the
    first executor, once held a new worker's first batches past a 1 s deadline."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    torch.set_num_threads(n)
    return True
