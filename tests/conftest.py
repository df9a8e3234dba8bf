"""Shared fixtures: zmq sockets that are always closed, launchers whose processes always die,
clients that are always closed, and a "poll until a condition or a deadline" helper.

Every fixture that makes something yields a factory and tears down all it made, so a test
that fails half way leaves no socket, context or process behind (nameko, pyzmq style).
"""
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from keel.common import waiting
from keel.common.client import Client
from keel.deploy.local import Launcher


def wait_until(condition: Callable[[], Any], timeout_s: float = 5.0, interval_s: float = 0.01, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy (returned) or fail at the deadline."""
    value = waiting.wait_until(condition, timeout_s, interval_s)
    if not value:
        raise AssertionError(f"{what} did not hold within {timeout_s} s")
    return value


@pytest.fixture
def wait() -> Callable[..., Any]:
    """``wait(condition, timeout_s=5, what=...)``: poll until truthy, else fail the test."""
    return wait_until


@pytest.fixture
def zsock() -> Iterator[Callable[..., zmq.Socket]]:
    """Factory ``zsock(kind, bind=None, connect=None, identity=None)`` of linger-0 sockets on
    one private context; every socket is closed and the context terminated at teardown.
    ``bind="tcp://127.0.0.1:*"`` picks an ephemeral port (``transport.endpoint_of`` reads it)."""
    ctx = zmq.Context()
    made: list[zmq.Socket] = []

    def make(kind: int, bind: str | None = None, connect: str | None = None, identity: bytes | None = None) -> zmq.Socket:
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        made.append(sock)
        if bind is not None:
            sock.bind(bind)
        if connect is not None:
            sock.connect(connect)
        return sock

    yield make
    for sock in made:
        sock.close(0)
    ctx.term()


@contextlib.contextmanager
def _launchers(root: Path) -> Iterator[Callable[[str], Launcher]]:
    made: list[Launcher] = []

    def make(name: str = "run") -> Launcher:
        launcher = Launcher(root / f"{name}-{len(made)}")
        made.append(launcher)
        return launcher

    try:
        yield make
    finally:
        for launcher in made:
            # A SIGSTOPped process would sit on SIGTERM until Launcher.stop gives up on it.
            for proc in launcher.procs.values():
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGCONT)
            launcher.stop()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Callable[[str], Launcher]]:
    """Factory of ``Launcher``s logging under tmp_path; every process they started is
    resumed (if stopped) and stopped at teardown."""
    with _launchers(tmp_path) as make:
        yield make


@pytest.fixture(scope="module")
def module_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Launcher]]:
    """``launcher`` for a cluster shared by the tests of one module."""
    with _launchers(tmp_path_factory.mktemp("cluster")) as make:
        yield make


@pytest.fixture
def client() -> Iterator[Callable[..., Client]]:
    """Factory ``client(endpoints, **kwargs)`` of Clients closed at teardown."""
    made: list[Client] = []

    def make(endpoints, **kwargs) -> Client:
        c = Client(endpoints, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
