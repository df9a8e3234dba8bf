"""Start Keel services as real processes on this machine and stop them by PID.

Used by benchmarks and integration tests, where supervisord is not the thing under test
(``keel up`` uses supervisord; the chaos harness places services in network namespaces).

Example
-------
>>> with Launcher("runs/bench") as cluster:                        # doctest: +SKIP
...     cluster.start("worker", WorkerConfig(name="w0", builtin="noop"))
...     cluster.wait_workers(dispatcher_endpoint, 1)
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import config as configs
from common.transport import request_status


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_block(n: int, host: str = "127.0.0.1") -> int:
    """The first of ``n`` consecutive ports free on ``host`` right now (for specs, which
    number their ports up from a ``base_port``). Below the ephemeral range, where
    outgoing connections take their ports."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000)
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {n} free ports on {host}")


def local_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@dataclass
class Cluster:
    frontend: configs.FrontendConfig
    dispatcher: configs.DispatcherConfig
    workers: list[configs.WorkerConfig]

    @property
    def client_endpoint(self) -> str:
        return self.frontend.client_endpoint


class Launcher:
    def __init__(self, log_dir: str | os.PathLike = "runs/local", env: dict[str, str] | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()  # stopped on purpose: not a failure

    def start(self, role: str, cfg: Any) -> subprocess.Popen:
        cfg.validate()
        log = open(self.log_dir / f"{cfg.name}.log", "ab")
        argv = [sys.executable, "-m", "services.serve", role, "--config", configs.to_json(cfg)]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()
        self.procs[cfg.name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        self.killed.add(name)
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                proc.wait(10)

    def wait_status(self, endpoint: str, predicate=lambda info: True, timeout_s: float = 30.0) -> dict:
        """Poll a service's status until ``predicate(info)`` holds; raise with logs otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            info = request_status(endpoint, 0.5)
            if info is not None and predicate(info):
                return info
            time.sleep(0.05)
        raise TimeoutError(f"{endpoint} did not reach the expected state in {timeout_s} s; logs in {self.log_dir}")

    def wait_workers(self, dispatcher_worker_endpoint: str, count: int, timeout_s: float = 60.0) -> dict:
        return self.wait_status(dispatcher_worker_endpoint, lambda info: len(info["workers"]) >= count, timeout_s)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None and name not in self.killed:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"service {name} exited with {code}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM everything, then SIGKILL what has not exited within 5 s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()

    def start_cluster(self, models: dict[str, tuple[configs.ModelInfo, configs.BatchPolicy]],
                      workers: list[configs.WorkerConfig], frontend: dict | None = None,
                      dispatcher: dict | None = None, wait: bool = True) -> Cluster:
        """Frontend + dispatcher + ``workers`` on free loopback ports; waits until all registered."""
        fe = configs.FrontendConfig(
            name="frontend", client_endpoint=local_endpoint(), prediction_endpoint=local_endpoint(),
            models={m: info for m, (info, _) in models.items()}, **(frontend or {}))
        dp = configs.DispatcherConfig(
            name="dispatcher", query_endpoint=local_endpoint(), worker_endpoint=local_endpoint(),
            models={m: policy for m, (_, policy) in models.items()}, **(dispatcher or {}))
        fe.dispatcher_endpoint = dp.query_endpoint
        self.start("dispatcher", dp)
        self.start("frontend", fe)
        for w in workers:
            w.dispatcher_endpoint = dp.worker_endpoint
            self.start("worker", w)
        cluster = Cluster(fe, dp, workers)
        if wait:
            self.wait_status(fe.client_endpoint)
            self.wait_workers(dp.worker_endpoint, len(workers))
        return cluster

    def start_spec(self, spec, wait: bool = True, timeout_s: float = 60.0):
        """Every service of a cluster spec (``common.spec.ClusterSpec``); waits until ready."""
        for svc in spec.services:
            self.start(svc.role, svc.config)
        if wait:
            deadline = time.monotonic() + timeout_s
            while unready := spec.unready(lambda ep: request_status(ep, 0.5)):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready after {timeout_s} s: {unready}; logs in {self.log_dir}")
                time.sleep(0.05)
        return spec

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
