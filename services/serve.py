"""Start one Keel process: ``python -m keel.services.serve ROLE --config JSON``.

ROLE is a role of common.roles.ROLES; JSON is the role's config (see common.config).
supervisord, systemd and the chaos harness all start services this way.

``--spare-lock PATH`` (env ``KEEL_SPARE_LOCK``) makes a hot spare of a process: it does its
imports, then waits for an exclusive lock on PATH and only then builds its service (binds
its sockets) and serves, holding the lock until it dies. Two processes started alike are a
serving one and a spare: when the serving one dies, even by SIGKILL, the kernel releases
its lock and the spare serves within milliseconds, while its supervisor restarts the dead
one, which becomes the next spare (``deploy.programs``: a dispatcher's ``spare = true``).
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import gc
import os
import re
import signal
import sys

import orjson
import zmq

from keel.common import operations
from keel.common.config import ConfigError
from keel.common.roles import from_dict
from keel.common.roles import role as role_of
from keel.services.base import BindError, catch_signals_early


def build(role: str, cfg):
    """The process of ``role`` (a row of ``common.roles.ROLES``) for ``cfg``."""
    return role_of(role).build(cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="keel serve", description=__doc__.splitlines()[0])
    parser.add_argument("role")
    parser.add_argument("--config", required=True, help="the role's config as JSON, or @FILE")
    parser.add_argument("--curve", default=os.environ.get("KEEL_CURVE_KEYS") or None, metavar="DIR",
                        help="CURVE on every socket with the keys in DIR (keel keys generate; env KEEL_CURVE_KEYS)")
    parser.add_argument("--spare-lock", default=os.environ.get("KEEL_SPARE_LOCK") or None, metavar="PATH",
                        help="serve only while holding this lock: a hot spare until then (env KEEL_SPARE_LOCK)")
    operations.add_arguments(parser)
    args = parser.parse_args(argv)
    catch_signals_early()
    operations.apply(args)
    raw = args.config
    if raw.startswith("@"):
        with open(raw[1:], "rb") as f:
            raw = f.read()
    try:
        cfg = from_dict(args.role, orjson.loads(raw))
    except (ConfigError, orjson.JSONDecodeError) as exc:
        print(f"keel serve {args.role}: bad config: {exc}", file=sys.stderr)
        return 2
    if args.curve:
        from keel.common import curve

        try:
            curve.use(args.curve)
        except curve.CurveError as exc:
            print(f"keel serve {args.role}: {exc}", file=sys.stderr)
            return 2
    from keel.common.containers import DeviceError

    if args.role == "worker" and cfg.store_endpoints and cfg.builtin is None:
        from keel.common import logs
        from keel.common.modelfetch import StoreUnreachable, fetch_for_worker
        from keel.services import base

        try:  # the version first, from the store service, checked; the worker registers only after
            fetch_for_worker(cfg, logs.setup(cfg.name).info, stop=lambda: base._early_signals > 0)
        except StoreUnreachable:  # stopped while waiting: nothing was started
            return 0
    role_of(args.role).service_class()  # the role's imports, before anything is built
    # What the imports made is frozen now, so the collection ``Service.run`` makes as it
    # starts walks only what the service built, not the ~35,000 objects of numpy, ZeroMQ,
    # structlog... (a full collection of them took ~80 ms on a loaded 2-core host). The
    # imports leave next to no garbage to keep (about a dozen objects).
    gc.freeze()
    if args.spare_lock and not take_lock(args.spare_lock, cfg.name):
        return 0  # stopped while a spare: the imports are what it would have saved its successor
    try:
        service = build(args.role, cfg)
        service.run()
    except DeviceError as exc:  # a spec asking for hardware this host lacks: say so, once
        print(f"keel serve {args.role}: {exc}", file=sys.stderr)
        return 2
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise
        print(f"keel serve {args.role}: {_bind_error(cfg, str(exc))}", file=sys.stderr)
        return 2
    except BindError as exc:
        print(f"keel serve {args.role}: {exc}", file=sys.stderr)
        return 2
    return 0


#: the spare lock's descriptor, open (and so held) for this process's life
_lock_fd: int | None = None


class _Stopped(Exception):
    """SIGTERM/SIGINT while a spare waits: it has nothing to drain, it ends."""


def _stop_waiting(signum: int, frame) -> None:
    raise _Stopped


def take_lock(path: str, name: str) -> bool:
    """Hold the exclusive lock on ``path``, waiting while another process holds it (flock:
    the kernel releases it when that process dies, however it dies); then write this pid
    into the file, for tools that look for the serving process. False when stopped by a
    signal while waiting. The lock is never released by this process: it ends with it (the
    descriptor is not inherited by what the service may exec)."""
    global _lock_fd
    from keel.common import logs
    from keel.services import base

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log = logs.setup(name)
        log.info("spare: waiting to serve", lock=path, pid=os.getpid())
        early = {sig: signal.signal(sig, _stop_waiting) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            if base._early_signals:
                raise _Stopped
            fcntl.flock(fd, fcntl.LOCK_EX)
        except _Stopped:
            os.close(fd)
            log.info("spare: stopped")
            return False
        finally:
            for sig, handler in early.items():
                signal.signal(sig, handler)
        log.info("spare: lock taken, serving", lock=path)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _lock_fd = fd
    return True


def lock_holder(path: str) -> int | None:
    """The pid of the process that took the spare lock at ``path`` last (None: none yet)."""
    try:
        with open(path) as f:
            return int(f.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _bind_error(cfg, text: str) -> BindError:
    """The address a ZeroMQ bind found taken (pyzmq names it in its message) and the config
    option that holds it."""
    found = re.search(r"\(addr='([^']*)'\)", text)
    address = found.group(1) if found else "an address"
    option = next((f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) == address), "its endpoint options")
    return BindError(address, option)


if __name__ == "__main__":
    sys.exit(main())
