"""SERF's lightweight profiler (§IV-B), through Keel's real path.

For each parallelism degree tuple (i, t) with i x t <= cores: the dispatcher sets every
worker of the model to i slots and t threads (``Configure(model=...)`` on its ROUTER, the
live switch), then (after a warm-up) ``samples`` requests, and the workers' own
service-time counters (``service_times`` in their status, by how many batches were
computing when each started, read before and after the samples) give the mean service
time and its SCV with i running:

- i >= 2: a closed loop keeps exactly i requests per worker in flight (the requests of a
  tuple with several running meet when the queue is busy: back to back);
- i = 1: one request at a time with a pause of ``gap_s`` before each (``spaced``; at
  least ``MIN_SAMPLES``, then until the mean's standard error is ``REL_SE`` of it), as
  open-loop arrivals find a worker at the light loads where one request runs alone. Back
  to back is not how they find it: torch's second thread has gone to sleep by the next
  arrival, and waking it costs most of what it gains (resnet18 on 3x32x32, measured here:
  two threads 1.62x faster than one back to back, 1.47x with 50 ms pauses, 1.12x with
  100 ms, none with 150 ms); a profile taken back to back put 1x2 ahead of 2x1 at light
  load, and the adaptive run lost to fixed 2x1 in every phase for it.

The hand-off (``handoff_ms``): with a queue at the dispatcher, a slot stays idle between
one request's end and the next one's start (Done to the dispatcher, the next Batch to the
worker): for each number of slots c, a closed loop keeps 2c requests per worker in
flight (a request queued behind every slot: with only c + 1, eight slots that finish
together wait for the client's next requests, and that round trip read as a 7 ms
hand-off on the emulated 8-core host), and the time per request per slot beyond the service time is the hand-off
(measured here on the sleep builtin: 2.2 ms a request with one slot, 1.5 ms with two, a
tenth of a 20 ms service: the queue turns over that much slower than the service time
alone says). Keel's path overhead (a reply's latency minus the worker's service time)
comes from the same spaced requests of (1, cores): every process has gone idle between them, as it has
between open-loop arrivals. Requests are never batched here (SERF does not batch): the
model's ``max_batch`` should be 1.

Example
-------
>>> profile = profile_model(spec, "resnet18", cores=2)     # doctest: +SKIP
>>> profile.service_ms[(1, 2)], profile.profiling_s          # doctest: +SKIP
(11.8, 2.4)
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from keel.common import transport
from keel.common.client import Client
from keel.common.protocol import Configure
from keel.services.serf.profile import Profile, stamp, tuples


#: the pause before each request of a tuple with one running (s): the idle time between
#: open-loop arrivals at the light loads where one request runs alone (15-30% of
#: capacity: 40-70 ms for resnet18 here)
GAP_S = 0.05
#: spaced tuples stop once sqrt(SCV / n) <= REL_SE, after at least MIN_SAMPLES requests.
#: 3%: the same model profiled again 15 s later moves by 6-17% (CV over eight profiles,
#: ``keel experiment serf-drift``), so a tighter mean buys nothing; at 1.5% widemlp's
#: one-thread tuple ran to its 20-request cap and profiling took 5.0-6.2 s
REL_SE = 0.03
MIN_SAMPLES = 8


class ProfileError(RuntimeError):
    """Profiling could not run: no worker took the configuration, or answers went missing."""


def set_configuration(dispatcher: str, model: str, slots: int, threads: int, timeout_s: float = 5.0) -> list[str]:
    """Switch every worker of ``model`` to (``slots``, ``threads``) live; the workers named."""
    info = transport.ask(dispatcher, Configure(model=model, slots=slots, threads=threads), timeout_s)
    if info is None:
        raise ProfileError(f"the dispatcher at {dispatcher} did not answer")
    if info.get("error") or not info.get("configured"):
        raise ProfileError(f"configuration ({slots}, {threads}) of {model} refused: {info.get('error') or 'no workers'}")
    return info["configured"]


def closed_loop(client: Client, model: str, inputs: np.ndarray, outstanding: int, count: int,
                timeout_s: float = 30.0) -> list[float]:
    """Keep ``outstanding`` requests in flight until ``count`` are answered; their latencies
    (ms, as the client saw them). Raises ``ProfileError`` on an error answer or a stall."""
    sent = answered = 0
    latencies: list[float] = []
    deadline = time.monotonic() + timeout_s
    while answered < count:
        while sent < count and sent - answered < outstanding:
            client.submit(model, inputs[sent % len(inputs)])
            sent += 1
        for result in client.collect(50.0):
            if not result.ok:
                raise ProfileError(f"a profiling request failed: {result.error_code}: {result.error}")
            answered += 1
            latencies.append(result.latency_ms)
        if time.monotonic() > deadline:
            raise ProfileError(f"{count - answered} profiling requests unanswered after {timeout_s:g} s")
    return latencies


def service_counters(endpoints: list[str]) -> dict[int, tuple[int, float, float]]:
    """The workers' service-time counters summed: i -> (count, sum ms, sum of squares)."""
    out: dict[int, tuple[int, float, float]] = {}
    for ep in endpoints:
        info = transport.request_status(ep, 5.0)
        if info is None:
            raise ProfileError(f"worker status endpoint {ep} did not answer")
        for i, acc in info["service_times"].items():
            n, s, ss = out.get(int(i), (0, 0.0, 0.0))
            out[int(i)] = (n + int(acc["n"]), s + acc["sum_ms"], ss + acc["sumsq_ms"])
    return out


def service_between(before: dict, after: dict, i: int) -> tuple[int, float, float]:
    """(count, mean ms, SCV) of the batches started with ``i`` computing, between two reads."""
    n0, s0, ss0 = before.get(i, (0, 0.0, 0.0))
    n1, s1, ss1 = after.get(i, (0, 0.0, 0.0))
    k = n1 - n0
    if k <= 0:
        return 0, 0.0, 0.0
    mean = (s1 - s0) / k
    var = max(0.0, (ss1 - ss0) / k - mean ** 2)
    return k, mean, var / mean ** 2 if mean > 0 else 0.0


def spaced(client: Client, model: str, inputs: np.ndarray, count: int, gap_s: float,
           enough: Callable[[int], bool] = lambda n: False) -> list[float]:
    """Up to ``count`` requests one at a time, each after a pause of ``gap_s``, until
    ``enough(requests so far)``: their latencies (ms)."""
    lat: list[float] = []
    while len(lat) < count and not enough(len(lat)):
        time.sleep(gap_s)
        lat += closed_loop(client, model, inputs, 1, 1)
    return lat


def measure(client: Client, dispatcher: str, workers: list[str], model: str, inputs: np.ndarray, i: int, t: int,
            warmup: int, samples: int, gap_s: float = 0.0) -> tuple[float, float, float, int]:
    """(mean service ms, SCV, mean client latency ms, service times counted) of tuple
    (i, t): i requests per worker in flight, or (``gap_s`` > 0, one worker) one at a time
    with pauses, stopping after ``MIN_SAMPLES`` once the mean's standard error is within
    ``REL_SE`` of it (the spaced requests are most of profiling's time)."""
    set_configuration(dispatcher, model, i, t)
    n = len(workers) * i
    closed_loop(client, model, inputs, n, max(warmup, n))
    # the last warm-up Done may still be on its way to the counters: let it land
    time.sleep(0.02)
    before = service_counters(workers)

    def enough(done: int) -> bool:  # the mean's standard error is within REL_SE of it
        if done < MIN_SAMPLES:
            return False
        k, _, scv = service_between(before, service_counters(workers), i)
        # (the last reply can reach the client before its service time reaches the counters)
        return k >= done - 1 and math.sqrt(scv / k) <= REL_SE

    lat = spaced(client, model, inputs, samples, gap_s, enough) if gap_s > 0 and n == 1 \
        else closed_loop(client, model, inputs, n, samples)
    time.sleep(0.02)
    k, mean, scv = service_between(before, service_counters(workers), i)
    if k <= 0:
        raise ProfileError(f"no service times counted with {i} running for tuple ({i}, {t})")
    return mean, scv, float(np.mean(lat)), k


def handoff_ms(client: Client, workers: list[str], model: str, inputs: np.ndarray, slots: int, count: int) -> float:
    """The idle time (ms) of a slot between requests while a queue waits: 2 x ``slots``
    requests per worker in flight, the time per request per slot minus the service time."""
    n = len(workers) * 2 * slots
    # whole rounds of every slot, at least three: fewer requests than slots (8 slots, 5
    # requests) timed one service and read it as a hand-off of most of a service time
    count = len(workers) * slots * max(3, math.ceil(count / (len(workers) * slots)))
    closed_loop(client, model, inputs, n, n)
    time.sleep(0.02)
    before, start = service_counters(workers), time.perf_counter()
    closed_loop(client, model, inputs, n, count)
    elapsed = time.perf_counter() - start
    time.sleep(0.02)
    after = service_counters(workers)
    done = [service_between(before, after, i) for i in range(1, slots + 1)]
    k = sum(d[0] for d in done)
    if k <= 0:
        raise ProfileError(f"no service times counted with {slots} slots")
    service = sum(d[0] * d[1] for d in done) / k
    return max(0.0, elapsed * 1000.0 * slots * len(workers) / count - service)


def profile_model(spec, model: str, cores: int, inputs: np.ndarray | None = None, warmup: int = 5,
                  samples: int = 20, version: str | None = None, log: Callable[[str], None] = lambda s: None,
                  gap_s: float | None = None) -> Profile:
    """Profile ``model`` on the running cluster ``spec`` (a ``ClusterSpec``): every tuple
    (i, t) with i x t <= ``cores``, those with i = 1 spaced by ``gap_s`` (default
    ``GAP_S``; none on an emulated SERF host, which has no thread team to fall asleep
    between requests, except (1, cores), whose latency gives the path); the workers are left at one request and all cores."""
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    workers = [s.config.status_endpoint for s in spec.services if s.role == "worker"
               and s.config.model == model and s.config.role == "deployed"]
    if not workers:
        raise ProfileError(f"the spec has no workers of {model!r}")
    first = next(s.config for s in spec.services if s.role == "worker" and s.config.model == model)
    if gap_s is None:
        gap_s = 0.0 if first.builtin == "serf_host" else GAP_S
    if inputs is None:
        shape = first.builtin_input_shape if first.builtin else _store_shape(first)
        inputs = np.random.default_rng(14).standard_normal((16, *shape)).astype(np.float32)
    start = time.perf_counter()
    service, scv, samples_of, path_ms, handoff = {}, {}, {}, 0.0, {}
    with Client(spec.client_endpoints, timeout_ms=30_000.0) as client:
        for i, t in tuples(cores):
            # (1, cores) gives the path, spaced even where its service time needs no pause:
            # back to back, every process on the path stays awake and the path reads short
            # (2.5 ms against 4.5 ms with 50 ms gaps), as light-load arrivals do not find it
            gap = GAP_S if (i, t) == (1, cores) else gap_s
            mean, v, lat, k = measure(client, dispatcher, workers, model, inputs, i, t, warmup, samples, gap)
            service[(i, t)], scv[(i, t)], samples_of[(i, t)] = mean, v, k
            log(f"  ({i}, {t}): {mean:7.2f} ms service, SCV {v:.3f}, {lat:7.2f} ms at the client")
            if (i, t) == (1, cores):
                path_ms = max(0.0, lat - mean)
        for c in sorted({i for i, _ in tuples(cores)}):
            set_configuration(dispatcher, model, c, cores // c)
            handoff[c] = handoff_ms(client, workers, model, inputs, c, max(5, samples // 2))
            log(f"  hand-off with {c} slots: {handoff[c]:.2f} ms a request (a slot idle between requests while a queue waits)")
        set_configuration(dispatcher, model, 1, cores)
        log(f"  path: {path_ms:.2f} ms (a request to an idle cluster, beyond its service time)")
    elapsed = time.perf_counter() - start
    version = version or (first.version or "1")
    return Profile(model, str(version), cores, service, scv, samples_of, path_ms, elapsed, stamp(), handoff)


def _store_shape(cfg) -> list[int]:
    from keel.common.modelstore import ModelStore

    return list(ModelStore(cfg.store).manifest(cfg.store_name or cfg.model, cfg.version).input_shape)
