"""``python -m keel.bench.serf_path [MODEL]``: Keel's path on one configuration, as the
profile measures it (requests one at a time, 50 ms apart) and as open-loop Poisson
arrivals at several rates see it: is an open-loop window worth its profiling time?

On a cluster of the SERF experiment (``bench.serf_experiment.cluster``), configuration
1 x cores: the slot's service time and hand-off from the profiler's queued loop; then,
``REPEATS`` times, spaced requests and a Poisson window at each of ``RATES``. A Poisson
request's path is its latency less the service time and its wait for the slot, the wait
by Lindley's recursion from the send times (W_k = max(0, W_k-1 + S + h - gap_k)): exact for
the emulated host's constant service, near it for a real model at these loads.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from keel.bench.serf_experiment import cluster, cores_of, inputs_for
from keel.bench.serf_step import run_load
from keel.common.client import Client
from keel.deploy.local import Launcher
from keel.services.serf.profiler import GAP_S, rounds, set_configuration, spaced

RATES = (10.0, 20.0, 40.0)
REPEATS = 2
#: requests a window
COUNT = 60


def lindley_waits(sent_s: np.ndarray, slot_ms: float) -> np.ndarray:
    """Each request's wait (ms) for one slot held ``slot_ms`` a request, from its send time."""
    waits = np.zeros(len(sent_s))
    for k in range(1, len(sent_s)):
        waits[k] = max(0.0, waits[k - 1] + slot_ms - 1000.0 * (sent_s[k] - sent_s[k - 1]))
    return waits


def probe(model: str = "host-small", store: str = "runs/serf/store", log=print) -> list[dict]:
    spec = cluster(store, model)
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    workers = [s.config.status_endpoint for s in spec.services if s.role == "worker"]
    inputs, cores, rows = inputs_for(model), cores_of(model), []
    with Launcher(Path(f"runs/serf/{model}/path")) as launcher, Client(spec.client_endpoints, timeout_ms=30_000.0) as client:
        launcher.start_spec(spec, timeout_s=180.0)
        set_configuration(dispatcher, model, 1, cores)
        m = rounds(client, workers, model, inputs, 1, 2, 20, handoff=True)
        service, handoff = m.service_ms, m.handoff_ms or 0.0
        log(f"{model} 1x{cores}: service {service:.2f} ms, hand-off {handoff:.2f} ms; load average {os.getloadavg()}")
        for rep in range(REPEATS):
            lat = np.array(spaced(client, model, inputs, COUNT // 2, GAP_S))
            rows.append({"repeat": rep, "how": f"spaced {GAP_S * 1000:.0f} ms", "rate": None,
                         "path_ms": float(np.mean(lat) - service), "wait_ms": 0.0})
            for rate in RATES:
                records, _ = run_load(client, model, inputs, rate, COUNT / rate, 100_000, seed=7 * rep + int(rate))
                ok = [r for r in records if r.received and not r.error_code]
                sent = np.array([r.sent for r in ok])
                latency = np.array([(r.received - r.sent) * 1000.0 for r in ok])
                waits = lindley_waits(sent, service + handoff)
                rows.append({"repeat": rep, "how": "Poisson", "rate": rate,
                             "path_ms": float(np.mean(latency - service - waits)), "wait_ms": float(np.mean(waits))})
            for row in rows[-1 - len(RATES):]:
                at = "" if row["rate"] is None else f"{row['rate']:4.0f}/s"
                log(f"  {row['repeat']} {row['how']:>10} {at:>6}: path {row['path_ms']:5.2f} ms (wait {row['wait_ms']:.2f} ms)")
    return rows


if __name__ == "__main__":
    probe(*sys.argv[1:2])
