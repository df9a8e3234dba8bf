"""``keel logs SPEC [SERVICE] [-f]``: what a cluster's services wrote, from the files
supervisord keeps of each one's output (``RUN_DIR/logs/NAME.log``, JSON lines).

SERVICE is a service name (``worker-m-0``) or a role (``worker``: every worker);
without it, every service of the spec on this machine. With more than one service each
line starts with its service's name. ``-f`` follows the files as they grow (and as
supervisord rotates them) until Ctrl-C; ``--level`` keeps the lines at or above a level.
Under systemd the same output is in the journal: ``journalctl -u keel-service@NAME``.

Example
-------
::

    keel logs deploy/examples/noop.toml worker -n 20
    keel logs deploy/examples/noop.toml frontend -f --level warning
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import orjson

from keel.common.logs import LEVELS
from keel.common.spec import ClusterSpec, SpecError


def log_paths(spec: ClusterSpec, service: str | None = None) -> dict[str, Path]:
    """Service name -> its log file, for ``service`` (a name or a role) or every service."""
    names = [s.name for s in spec.services]
    if service is None:
        chosen = names
    elif service in names:
        chosen = [service]
    else:
        chosen = [s.name for s in spec.role(service)]
        if not chosen:
            raise SpecError(f"no service or role {service!r} in cluster {spec.name!r}; services: {names}")
    paths = {}
    for name in chosen:
        paths[name] = Path(spec.run_dir) / "logs" / f"{name}.log"
        spare = paths[name].with_name(f"{name}-spare.log")  # a dispatcher's hot spare serves in turns with it
        if spare.exists():
            paths[spare.stem] = spare
    return paths


def keep(line: str, level: str | None) -> bool:
    """Whether ``line`` is at or above ``level`` (a line that is not a JSON log entry,
    a traceback's, is always kept)."""
    if level is None:
        return True
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return True
    return not isinstance(entry, dict) or LEVELS.get(str(entry.get("level")), 100) >= LEVELS[level]


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of ``path`` (none when it does not exist yet)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:] if lines > 0 else []


def show(paths: dict[str, Path], out: IO[str], lines: int = 50, level: str | None = None) -> int:
    """Print the last ``lines`` lines of each log; the number of lines printed."""
    prefix = len(paths) > 1
    width = max(map(len, paths), default=0)
    printed = 0
    for name, path in paths.items():
        for line in tail(path, lines):
            if keep(line, level):
                out.write(f"{name:<{width}} | {line}\n" if prefix else f"{line}\n")
                printed += 1
    out.flush()
    return printed


def follow(paths: dict[str, Path], out: IO[str], level: str | None = None, stop: Callable[[], bool] = lambda: False,
           interval_s: float = 0.2) -> None:
    """Print what is appended to each log from now on until ``stop()``; a file that
    shrank (rotated by supervisord) is read again from its start."""
    prefix = len(paths) > 1
    width = max(map(len, paths), default=0)
    offsets = {name: (path.stat().st_size if path.exists() else 0) for name, path in paths.items()}
    partial = {name: b"" for name in paths}
    while not stop():
        for name, path in paths.items():
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size < offsets[name]:
                offsets[name], partial[name] = 0, b""
            if size == offsets[name]:
                continue
            with open(path, "rb") as f:
                f.seek(offsets[name])
                data = partial[name] + f.read(size - offsets[name])
            offsets[name] = size
            *complete, partial[name] = data.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                if keep(line, level):
                    out.write(f"{name:<{width}} | {line}\n" if prefix else f"{line}\n")
        out.flush()
        time.sleep(interval_s)
