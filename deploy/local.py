"""A local process backend, beside supervisord (``deploy.supervisor``) and systemd
(``deploy.units``): the services of a cluster spec as plain child processes of this
one, stopped by PID. Benchmarks and integration tests use it where supervisord is not
the thing under test; the chaos harness places services in network namespaces itself.

Every launch path builds a spec first (``common.spec.load_spec``: the wiring of
``keel up``) and starts each ``ServiceLaunch.argv()``.

Example
-------
>>> spec = load_spec({"cluster": {"base_port": free_port_block()},          # doctest: +SKIP
...                   "models": {"m": {"builtin": "noop", "workers": 2}}})
>>> with Launcher("runs/bench") as cluster:                                 # doctest: +SKIP
...     cluster.start_spec(spec)
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

from keel.common.spec import ClusterSpec, ServiceLaunch
from keel.common.transport import request_status
from keel.common.waiting import wait_until


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def local_endpoint() -> str:
    """A tcp endpoint on loopback whose port is free right now."""
    return f"tcp://127.0.0.1:{free_port()}"


def free_port_block(n: int = 64, host: str = "127.0.0.1") -> int:
    """The first of ``n`` consecutive ports free on ``host`` right now (for specs, which
    number their ports up from a ``base_port``; 64 covers every spec the tests and
    benchmarks make). Below the ephemeral range, where
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


class Launcher:
    def __init__(self, log_dir: str | os.PathLike = "runs/local", env: dict[str, str] | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()  # stopped on purpose: not a failure

    def address_of(self, name: str) -> str:
        """The address the service ``name`` listens on (every one on loopback here; a
        launcher that places each service on its own host answers that host's)."""
        return "127.0.0.1"

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, svc: ServiceLaunch) -> subprocess.Popen:
        """Start one service of a spec; its output goes to ``log_dir/NAME.log``."""
        with open(self.log_path(svc.name), "ab") as log:
            proc = subprocess.Popen(svc.argv(), stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs[svc.name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL, wait: bool = True) -> None:
        """Send ``sig``; for SIGKILL/SIGTERM wait for the exit unless ``wait`` is False (a
        load generator that kills mid-stream must not pause for the reaping: a torch
        process takes ~35 ms to go; ``stop`` reaps it)."""
        proc = self.procs[name]
        self.killed.add(name)
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            if wait and sig in (signal.SIGKILL, signal.SIGTERM):
                proc.wait(10)

    def wait_status(self, endpoint: str, predicate=lambda info: True, timeout_s: float = 30.0, ctx=None) -> dict:
        """Poll a service's status until ``predicate(info)`` holds; raise with logs otherwise
        (``ctx``: the ZeroMQ context to ask from, see ``common.transport.ask``)."""
        def reached() -> dict | None:
            self.check_alive()
            info = request_status(endpoint, 0.5, ctx=ctx)
            return info if info is not None and predicate(info) else None

        info = wait_until(reached, timeout_s, interval_s=0.05)
        if info is not None:
            return info
        raise TimeoutError(f"{endpoint} did not reach the expected state in {timeout_s} s; logs in {self.log_dir}")

    def wait_workers(self, dispatcher_worker_endpoint: str, count: int, timeout_s: float = 60.0) -> dict:
        return self.wait_status(dispatcher_worker_endpoint, lambda info: len(info["workers"]) >= count, timeout_s)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None and name not in self.killed:
                tail = self.log_path(name).read_text(errors="replace")[-2000:]
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

    def start_spec(self, spec: ClusterSpec, wait: bool = True, timeout_s: float = 60.0) -> ClusterSpec:
        """Every service of a cluster spec; waits until ready (``ClusterSpec.unready``)."""
        for svc in spec.services:
            self.start(svc)
        if wait:
            def ready() -> bool:
                self.check_alive()
                return not spec.unready(lambda ep: request_status(ep, 0.5))

            if not wait_until(ready, timeout_s, interval_s=0.05):
                unready = spec.unready(lambda ep: request_status(ep, 0.5))
                raise TimeoutError(f"not ready after {timeout_s} s: {unready}; logs in {self.log_dir}")
        return spec

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
