"""The dispatcher's plug-ins: what it knows of queues and workers, and the policies it runs.

Where each mechanism of the papers lives::

    view.py          what schedulers read: ``Query``, ``ModelQueue`` (queue + arrival rate),
                     ``WorkerState`` (what a worker declared in ``Register``: instance kind,
                     price, threads, slots, max_batch; and what the dispatcher measured:
                     ``ServiceProfile``, per-batch-size EWMA of ``Done.service_ms``, one per
                     (slots, threads) configuration), ``Inflight``
    batching.py      Clipper §4.3: ``AIMD`` (§4.3.1 dynamic batch size), delayed batching
                     (§4.3.2, ``Batching.hold_until``), ``FixedBatch``; ``BATCHING``
    distribution.py  which query batch goes to which worker: ``SingleQueue`` (Clipper/ParM
                     single queue, the default), ``RoundRobin``; ``POLICIES`` (name -> class
                     or "module:Class", imported only when a dispatcher runs it)
    kairos.py        Kairos §5.1 and its baselines (§6); imports scipy.optimize, so only a
                     dispatcher whose policy is one of them loads it
    coding.py        ParM §4.1: ``CodingGroups`` (k consecutively dispatched batches form a
                     coding group)

The dispatcher calls, per model queue with entries, after every burst of messages::

    plan = policy.assign(queue, workers, now)        # distribution: -> [Assignment]
    for a in plan:                                   # FIFO chunks from the queue's head
        want = a.count or queue.batching.size(a.worker)   # batching: rows for this worker
        hold = queue.batching.hold_until(queue, want, now)  # delayed batching
        ... send the chunk to a.worker (a free slot needed), tag it (coding) ...
    # on Done:  queue.batching.observe(worker, size, service_ms, ok); worker.profile.observe(...)

SERF (a configurator, next): reads ``ModelQueue.rate`` (arrivals/s, EWMA) and each
worker's ``profiles[(slots, threads)]``, and calls ``Dispatcher.configure(worker_name,
slots=, threads=)``, which sends the protocol's ``Configure`` to the worker and changes
the slots the dispatcher fills at once. A configurator is
``plan(queues: dict[str, ModelQueue], workers: Sequence[WorkerState], now) ->
list[tuple[str, int | None, int | None]]`` run from a chore.
"""
from keel.services.scheduling.batching import AIMD, BATCHING, Batching, FixedBatch, batching_for
from keel.services.scheduling.coding import CodingGroups
from keel.services.scheduling.distribution import POLICIES, Assignment, DistributionPolicy, RoundRobin, SingleQueue
from keel.services.scheduling.view import Inflight, ModelQueue, Query, ServiceProfile, WorkerState

__all__ = [
    "AIMD", "BATCHING", "Batching", "FixedBatch", "batching_for", "CodingGroups", "POLICIES", "Assignment",
    "DistributionPolicy", "RoundRobin", "SingleQueue", "Inflight", "ModelQueue", "Query", "ServiceProfile", "WorkerState",
]
