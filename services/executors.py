"""The worker's executors: the threads that run its batches through the model, so that a
worker computes up to ``slots`` batches at once (SERF's service parallelism) while its
poll loop keeps every ZeroMQ socket on its own thread.

torch's intra-op thread count is per calling OS thread (OpenMP state, set once per thread
when it first computes), so an executor sets it itself before a batch whenever the
configured figure (``Executors.torch_threads``) changed.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time

from common.protocol import Batch

#: executor threads at most: beyond this many slots, batches wait in the worker for one
MAX_EXECUTORS = 64


class Job:
    """One batch on its way through an executor: what the loop needs to answer it."""

    __slots__ = ("batch", "live", "received", "predictor", "version", "outputs", "error", "service_ms", "running")

    def __init__(self, batch: Batch, live: list[int], received: float, predictor, version: str | None = None):
        self.batch, self.live, self.received, self.predictor = batch, live, received, predictor
        self.version = version  # of ``predictor``: a rollout may swap the worker's model while this computes
        self.outputs, self.error, self.service_ms = None, None, 0.0
        self.running = 1  # batches computing when this one started, itself included


class Executors:
    """Threads that run batches through the model, as many as the worker's slots (grown on
    demand, never shrunk: an idle one costs nothing). ``submit`` queues a job; a finished
    job lands in ``finished`` and a byte on the pipe whose read end (``fd``) the worker's
    loop polls. ``running``/``peak`` count batches computing at once."""

    def __init__(self, run, set_threads):
        self.run, self.set_threads = run, set_threads  # run(job) fills it; set_threads(n) -> applied, or None
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.finished: queue.SimpleQueue = queue.SimpleQueue()
        self.fd, self._wfd = os.pipe()
        os.set_blocking(self.fd, False)
        self.threads: list[threading.Thread] = []
        self.torch_threads = 1  # what each executor sets before its next batch
        self.running = self.peak = 0
        self._lock = threading.Lock()

    def ensure(self, n: int) -> None:
        while len(self.threads) < min(n, MAX_EXECUTORS):
            t = threading.Thread(target=self._loop, name=f"executor-{len(self.threads)}", daemon=True)
            self.threads.append(t)
            t.start()

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def _loop(self) -> None:
        mine = None  # the torch threads this thread last set
        while True:
            job = self.jobs.get()
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
        """The jobs finished since the last call (drains the pipe)."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass
        out = []
        while True:
            try:
                out.append(self.finished.get_nowait())
            except queue.Empty:
                return out

    def close(self, wait_s: float = 2.0) -> None:
        for _ in self.threads:
            self.jobs.put(None)
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
