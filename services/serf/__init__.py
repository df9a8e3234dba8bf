"""SERF (../shared/papers/001_313fc55731948098.txt): choose each model's parallelism for
the current load from a queueing model, and switch it live.

Design on Keel (a 2-core machine here; SERF's 8-core testbed host is emulated by the
``serf_host`` builtin, ``common.serf_host``, where its choice matters):

- A *configuration* is (c, t): up to c requests run at once on a worker, each with t torch
  intra-op threads, c x t <= the cores the model is given ((1,1), (1,2), (2,1) on two
  cores). The worker is the serving unit of §IV-C: it runs c executor threads
  (``services.worker.Executors``) over one copy of the weights, and each executor sets its
  own torch threads, because torch keeps that figure per calling thread. Threads in one
  process rather than c pre-started processes: measured here, executor threads do run
  concurrently (torch drops the GIL while computing), a 512 MB model is not held c times,
  and a switch is one ``Configure`` to one process: the batches it holds finish with what
  they started with and the dispatcher sends no more than the new number of slots, so
  nothing is lost (tests/integration/test_serf_concurrency.py).
- ``profiler``: §IV-B through Keel's real path: for each parallelism degree tuple (i, t)
  with i x t <= cores, the dispatcher sets the model's workers to (i, t), a closed loop of
  exactly i requests in flight runs a warm-up and a few tens of samples, and the worker's
  own service-time counters give the mean (and SCV) of that phase: mu_i for t threads. The
  profile (``Profile``: mu table, profiling time, path overhead) is kept beside the model
  version in the store (``serf_profile.json``) or in a run folder. When a rollout moves
  the workers to another version, the configurator takes that version's profile or holds
  the model (``configurator.Configurator.follow``); ``keel model rollout`` profiles a
  version that has none right after the switch (``deploy.rollout.serf_follow``).
- ``common.queueing``: Eq. 2-13 (Eq. 12 with p0 restored) and the reference table.
- ``configurator``: §IV-D inside the dispatcher: the model's arrival rate (the queue's
  EWMA) per worker, a table lookup, hysteresis and a minimum hold time, then
  ``Dispatcher.configure`` for each worker of the model, never past the cores its host
  has left beside the other workers there (``[dispatcher] serf_cores``,
  ``configurator.cores_left``).
"""
