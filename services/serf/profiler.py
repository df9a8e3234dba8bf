"""SERF's lightweight profiler (§IV-B), through Keel's real path.

For parallelism degree tuples (i, t) with i x t <= cores: the dispatcher sets every
worker of the model to i slots and t threads (``Configure(model=...)`` on its ROUTER, the
live switch), then (after a warm-up) requests until the mean service time is known to
``REL_SE``, and the workers' own service-time counters (``service_times`` in their
status, by how many batches were computing when each started, read before and after)
give the mean service time and its SCV with i running:

- i >= 2, or a model whose single request needs no pause: a closed loop keeps i requests
  per worker in flight (``rounds``), at least ``MIN_CLOSED`` requests in whole rounds of
  the slots, a round more while the mean's standard error is above ``REL_SE``; every
  request of the loop counts (SERF's own way: i run at once), whichever number ran when
  it started;
- i = 1 on a real model: one request at a time with a pause of ``gap_s`` before each
  (``spaced``; at least ``MIN_SAMPLES``, then until the mean's standard error is
  ``REL_SE`` of it), as open-loop arrivals find a worker at the light loads where one
  request runs alone. Back to back is not how they find it: torch's second thread has
  gone to sleep by the next arrival, and waking it costs most of what it gains (resnet18
  on 3x32x32, measured here: two threads 1.62x faster than one back to back, 1.47x with
  50 ms pauses, 1.12x with 100 ms, none with 150 ms); a profile taken back to back put
  1x2 ahead of 2x1 at light load, and the adaptive run lost to fixed 2x1 in every phase.

Not every tuple is measured where the curves are smooth (``curve``): the speed-up by
threads of one request, then for each thread count the interference by requests at
once, each from its ends and middles, a stretch whose middle lies on the straight line
between its ends (within ``REL_SE``) interpolated. On the emulated 8-core host this
measures 12-18 of the 20 tuples; on two cores there is nothing between the ends.

The hand-off (``handoff_ms``): with a queue at the dispatcher, a slot stays idle between
one request's end and the next one's start (Done to the dispatcher, the next Batch to the
worker). For c slots it is timed in the loop of tuple (c, cores // c) itself, which then
keeps 2c requests per worker in flight (a request queued behind every slot: with only
c + 1, eight slots that finish together wait for the client's next requests, and that
round trip read as a 7 ms hand-off on the emulated 8-core host): every round after the
first starts from the queue, and the median round's time beyond the service time is the
hand-off (one round of eight slots of a 200 ms service; three of short ones, where a
single hiccup of a shared machine read as 14 ms). Measured on the sleep builtin: 2.2 ms
a request with one slot, 1.5 ms with two, a tenth of a 20 ms service. For one slot, a
queued loop after the spaced one. The profile keeps one hand-off for every number of
slots, the median of those timed (``pooled``): each alone moved by several ms from one
profile to the next. Keel's path overhead (a reply's latency minus the worker's
service time) comes from the tuples with no queue behind their slots, each at the rate its
requests came (``path_rate``): the spaced requests of (1, cores), where every process has
gone idle between them as between light-load arrivals, and the closed loops back to back;
``Profile.path_at`` interpolates it by rate. Requests are never batched here
(SERF does not batch): the model's ``max_batch`` should be 1.

Profiling time (the emulated 8-core host, a 2-core VM shared with other work,
2026-11-27): 20 tuples x 10 samples and a separate loop of at least three rounds per
number of slots took 7.0 s (small model) and 11.6-12.3 s (large, whose eight-at-once
tuples take 200 ms a round); measured as above, 2.8 s and 5.4 s (load average 5.6).

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
from dataclasses import dataclass

import numpy as np

from keel.common import transport
from keel.common.client import Client
from keel.common.protocol import Configure
from keel.services.serf.profile import Profile, path_bands, stamp


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
#: back-to-back tuples: at least this many service times (in whole rounds of the slots);
#: an emulated host's are all but equal, a real model's spread asks for more (REL_SE)
MIN_CLOSED = 5
#: the hand-off is the median of up to HANDOFF_ROUNDS rounds, as many as take HANDOFF_S
HANDOFF_ROUNDS, HANDOFF_S = 3, 0.15


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


def service_between(before: dict, after: dict, *running: int) -> tuple[int, float, float]:
    """(count, mean ms, SCV) of the batches started with any of ``running`` computing,
    between two reads."""
    k = total = sq = 0.0
    for i in running:
        n0, s0, ss0 = before.get(i, (0, 0.0, 0.0))
        n1, s1, ss1 = after.get(i, (0, 0.0, 0.0))
        k, total, sq = k + n1 - n0, total + s1 - s0, sq + ss1 - ss0
    if k <= 0:
        return 0, 0.0, 0.0
    mean = total / k
    var = max(0.0, sq / k - mean ** 2)
    return int(k), mean, var / mean ** 2 if mean > 0 else 0.0


def spaced(client: Client, model: str, inputs: np.ndarray, count: int, gap_s: float,
           enough: Callable[[int], bool] = lambda n: False) -> list[float]:
    """Up to ``count`` requests one at a time, each after a pause of ``gap_s``, until
    ``enough(requests so far)``: their latencies (ms)."""
    lat: list[float] = []
    while len(lat) < count and not enough(len(lat)):
        time.sleep(gap_s)
        lat += closed_loop(client, model, inputs, 1, 1)
    return lat


@dataclass
class Measured:
    """One tuple's figures: the mean service time (ms) and its SCV with i running, the
    mean latency at the client (ms), the service times counted, and (a queue behind the
    slots) the hand-off (ms)."""
    service_ms: float
    scv: float
    latency_ms: float
    samples: int
    handoff_ms: float | None = None


def measure(client: Client, dispatcher: str, workers: list[str], model: str, inputs: np.ndarray, i: int, t: int,
            warmup: int, samples: int, gap_s: float = 0.0, handoff: bool = False) -> Measured:
    """Tuple (i, t) after ``warmup`` requests: one at a time with a pause of ``gap_s``
    before each (``gap_s`` > 0, one worker, i = 1), or back to back (``rounds``), with a
    queue behind every slot where ``handoff`` (2i in flight, the hand-off timed in the
    same loop). Either stops once the mean's standard error is within ``REL_SE`` of it."""
    set_configuration(dispatcher, model, i, t)
    if not (gap_s > 0 and len(workers) * i == 1):
        return rounds(client, workers, model, inputs, i, warmup, samples, handoff)
    closed_loop(client, model, inputs, 1, max(warmup, 1))
    time.sleep(0.02)  # the last warm-up Done may still be on its way to the counters
    before = service_counters(workers)

    def enough(done: int) -> bool:  # the mean's standard error is within REL_SE of it
        if done < MIN_SAMPLES:
            return False
        k, _, scv = service_between(before, service_counters(workers), i)
        # (the last reply can reach the client before its service time reaches the counters)
        return k >= done - 1 and math.sqrt(scv / k) <= REL_SE

    lat = spaced(client, model, inputs, samples, gap_s, enough)
    time.sleep(0.02)
    return _counted(before, service_counters(workers), i, float(np.mean(lat)))


def _counted(before: dict, after: dict, i: int, latency_ms: float, handoff: float | None = None) -> Measured:
    # every request of the loop, whichever number ran when it started: i start together
    # only where their rounds drift apart (a real model); on the emulated host a round
    # ends at once and its successors start one by one, yet run with i beside them
    k, mean, scv = service_between(before, after, *range(1, i + 1))
    if k <= 0:
        raise ProfileError(f"no service times counted with {i} running")
    return Measured(mean, scv, latency_ms, k, None if handoff is None else max(0.0, handoff - mean))


def rounds(client: Client, workers: list[str], model: str, inputs: np.ndarray, i: int, warmup: int, samples: int,
           handoff: bool = False) -> Measured:
    """One closed loop of i requests per worker in flight (2i with ``handoff``): the
    service times counted after the first ``warmup`` answers, at least ``MIN_CLOSED`` in
    whole rounds of the slots, then a round more while their mean's standard error is
    above ``REL_SE`` of it (checked before the loop stops feeding the slots; at most
    ``samples``). The slots of a round are measured at once, and the loop is never
    emptied and refilled: a slow tuple (200 ms, 8 at once) costs its rounds, no more.

    With ``handoff`` the loop also times the hand-off: after the answer that ends the
    first round, every round starts from the queue (2n were sent at once, then one per
    answer), its slots busy or between a ``Done`` and the next ``Batch``, so a round (n requests on n slots) takes a
    service time and a hand-off: the median round less the service time is the hand-off
    (at least a round, and ``MIN_CLOSED`` requests; ``HANDOFF_ROUNDS`` where they take
    under ``HANDOFF_S``). One round for eight slots of a 200 ms service: the hand-off
    matters where the service is short, and there the rounds are cheap."""
    n = len(workers) * i  # slots in all
    outstanding = 2 * n if handoff else n
    start = max(warmup, n) if handoff else warmup  # the hand-off's clock starts a round in
    # whole rounds of the slots; with a hand-off, a round (and MIN_CLOSED requests) timed
    # after the first round's end: every later round starts from the queue
    target = n * math.ceil(max(warmup + MIN_CLOSED, start + max(n, MIN_CLOSED) if handoff else 0) / n)
    most = max(target + (HANDOFF_ROUNDS - 1) * n if handoff else target, n * math.ceil((warmup + samples) / n))
    sent = answered = 0
    lat: list[float] = []
    at: list[float] = []  # when each answer came
    before, checked = None, 0
    deadline = time.monotonic() + 30.0 + 2 * most * 0.5
    while answered < target:
        while sent < target and sent - answered < outstanding:
            client.submit(model, inputs[sent % len(inputs)])
            sent += 1
        if sent == target and checked < target and target < most and before is not None:
            checked = target  # about to stop feeding the slots: are the service times so far enough?
            k, _, scv = service_between(before, service_counters(workers), *range(1, i + 1))
            timed = (answered - start) // n if handoff and answered > start else 0
            # the hand-off: a median of HANDOFF_ROUNDS rounds where they take under
            # HANDOFF_S (a round of one hiccup on a shared machine read as 14 ms)
            short = timed and (target - start) // n < HANDOFF_ROUNDS \
                and (at[answered - 1] - at[start - 1]) / timed * HANDOFF_ROUNDS < HANDOFF_S
            if (k >= 2 and math.sqrt(scv / k) > REL_SE) or short:
                target = min(most, target + n)
                continue
        for result in client.collect(50.0):
            if not result.ok:
                raise ProfileError(f"a profiling request failed: {result.error_code}: {result.error}")
            answered += 1
            lat.append(result.latency_ms)
            at.append(time.perf_counter())
            if answered == warmup:
                before = service_counters(workers)
        if time.monotonic() > deadline:
            raise ProfileError(f"{target - answered} profiling requests unanswered")
    time.sleep(0.02)  # the last Done may still be on its way to the counters
    after = service_counters(workers)
    per_request = None
    if handoff:
        # the rounds after the first, each started from the queue: a round of n requests
        # on n slots takes a service time and a hand-off
        ends = [at[k - 1] for k in range(start, target + 1, n)]
        per_request = 1000.0 * float(np.median(np.diff(ends)))
    return _counted(before, after, i, float(np.mean(lat[warmup:])), per_request)


def curve(xs: list[int], value: Callable[[int], float], known: dict[int, float] | None = None) -> dict[int, float]:
    """A smooth curve over ``xs`` from few of its points: its ends, then each stretch's
    middle; a stretch whose middle lies within ``REL_SE`` of the straight line between its
    ends is taken as straight and its other points interpolated, else both halves are
    looked at the same way. ``value(x)`` measures a point; ``known`` ones are not
    measured again.

    SERF's curves are smooth where it matters to the cost: the emulated small model's
    interference is flat (three of eight tuples measured), the large one's a straight rise
    from two requests on, and the speed-up flattens past four threads."""
    got = dict(known or {})

    def at(x: int) -> float:
        if x not in got:
            got[x] = value(x)
        return got[x]

    def line(lo: int, hi: int, x: int) -> float:
        return got[lo] + (got[hi] - got[lo]) * (x - lo) / (hi - lo)

    def stretch(a: int, b: int) -> None:  # indices into xs, both ends known
        if b - a < 2:
            return
        m = (a + b) // 2
        lo, mid, hi = xs[a], at(xs[m]), xs[b]
        if abs(mid - line(lo, hi, xs[m])) <= REL_SE * mid:
            for x in xs[a + 1:b]:
                got.setdefault(x, line(lo, hi, x))
        else:
            stretch(a, m)
            stretch(m, b)

    at(xs[0]), at(xs[-1])
    stretch(0, len(xs) - 1)
    return {x: got[x] for x in xs}


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
    warmup = max(1, warmup)  # the counters are read at the warm-up's last answer
    start = time.perf_counter()
    service, scv, samples_of, handoff, path_ms = {}, {}, {}, {}, 0.0
    path_points: list[tuple[float, float, int]] = []
    with Client(spec.client_endpoints, timeout_ms=30_000.0) as client:
        def tuple_ms(i: int, t: int) -> float:
            nonlocal path_ms
            # (1, cores) gives the path, spaced even where its service time needs no pause:
            # back to back, every process on the path stays awake and the path reads short
            # (2.5 ms against 4.5 ms with 50 ms gaps), as light-load arrivals do not find it
            gap = GAP_S if (i, t) == (1, cores) else gap_s
            # the hand-off with c slots is timed on (c, cores // c) in the tuple's own loop
            # (with one slot, a queued loop after the spaced one)
            queued = i > 1 and t == cores // i
            m = measure(client, dispatcher, workers, model, inputs, i, t, warmup, samples, gap, handoff=queued)
            service[(i, t)], scv[(i, t)], samples_of[(i, t)] = m.service_ms, m.scv, m.samples
            if not queued:  # no queue behind the slots: latency less service is the path, at this tuple's rate
                path_points.append((path_rate(m, len(workers) * i, gap if len(workers) * i == 1 else 0.0),
                                    max(0.0, m.latency_ms - m.service_ms), m.samples))
            log(f"  ({i}, {t}): {m.service_ms:7.2f} ms service, SCV {m.scv:.3f}, {m.latency_ms:7.2f} ms at the client"
                f" ({m.samples} counted)")
            if (i, t) == (1, cores):
                path_ms = max(0.0, m.latency_ms - m.service_ms)
                m = rounds(client, workers, model, inputs, 1, warmup, samples, handoff=True)
            if m.handoff_ms is not None:
                handoff[i] = m.handoff_ms
                log(f"  hand-off with {i} slots: {m.handoff_ms:.2f} ms a request (a slot idle between requests while a queue waits)")
            return m.service_ms

        # the speed-up by threads (one request), then each thread count's interference by
        # requests at once: a curve's ends and middles, the straight stretches interpolated
        speedup = curve(list(range(1, cores + 1)), lambda t: tuple_ms(1, t))
        for t in range(1, cores + 1):
            known = {1: speedup[t]}
            for i, ms in curve(list(range(1, cores // t + 1)), lambda i: tuple_ms(i, t), known).items():
                if (i, t) not in service:
                    service[(i, t)], scv[(i, t)], samples_of[(i, t)] = ms, 0.0, 0
                    log(f"  ({i}, {t}): {ms:7.2f} ms service, interpolated")
        # one hand-off for every number of slots: the median of those measured (``pooled``)
        handoff = pooled(handoff, cores)
        set_configuration(dispatcher, model, 1, cores)
        log(f"  path: {path_ms:.2f} ms (a request to an idle cluster, beyond its service time); by rate: "
            + ", ".join(f"{ms:.2f} ms at {r:.0f}/s" for r, ms in path_bands(path_points)))
    elapsed = time.perf_counter() - start
    version = version or (first.version or "1")
    return Profile(model, str(version), cores, service, scv, samples_of, path_ms, elapsed, stamp(), handoff,
                   path_points)


def pooled(handoff: dict[int, float], cores: int) -> dict[int, float]:
    """The hand-off for 1..``cores`` slots: the median of those measured (slots -> ms),
    the same for every number of slots. The hand-off is the same work whatever the
    slots (a Done to the dispatcher, the next Batch to the worker, its executor woken);
    timed per number of slots from a few rounds each, it read 0.2-3.2 ms in one profile of
    the emulated host and 0-5.4 ms in another, with no order by slots across five
    profiles (2026-11-27), while their medians read 0.8-1.3 ms. One 3.2 ms outlier for two
    slots made 2x4 read 2 ms slower a request, and Eq. 13 picked 4x2 at 98/s where 2x4
    measured 8% faster."""
    if not handoff:
        return {}
    h = float(np.median(list(handoff.values())))
    return {c: h for c in range(1, cores + 1)}


def path_rate(m: Measured, in_flight: int, gap_s: float) -> float:
    """The rate (requests/s) at which a queue-free tuple's requests reached the path: one
    at a time after a pause of ``gap_s`` (spaced), or ``in_flight`` back to back (a
    closed loop's throughput). Requests no further apart are what an open-loop load at
    that rate sends on average; the path of each is timed in the profile's own loops, so
    the path by rate costs no request of its own."""
    return 1000.0 * in_flight / (m.latency_ms + 1000.0 * gap_s)


def _store_shape(cfg) -> list[int]:
    from keel.common.modelstore import ModelStore

    return list(ModelStore(cfg.store).manifest(cfg.store_name or cfg.model, cfg.version).input_shape)
