"""Reading a cluster spec's TOML tables: typed keys, unknown keys refused, errors that
start with the key path at fault (``models.digits.k: must be 0 or >= 2``)."""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from keel.common.jsontypes import describe, fits
from keel.common.roles import ROLES

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HOSTNAME_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_REQUIRED = object()


class SpecError(ValueError):
    """A cluster spec that cannot be deployed; the message names the key path at fault."""


def fail(path: str, msg: str) -> None:
    raise SpecError(f"{path}: {msg}")


class Table:
    """One TOML table being read: typed ``take``s, then ``finish`` refuses what is left."""

    def __init__(self, data: Any, path: str):
        if not isinstance(data, dict):
            raise SpecError(f"{path}: must be a table, got {type(data).__name__}")
        self.data, self.path, self.taken = data, path, set()

    def key(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def take(self, key: str, hint: Any, default: Any = _REQUIRED) -> Any:
        """The value of ``key`` if it fits the annotation ``hint`` (``int``, ``float``,
        ``list[str]``, ``dict``...); a float hint gives a float."""
        self.taken.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise SpecError(f"{self.key(key)}: required")
            return default
        value = self.data[key]
        if not fits(value, hint):
            raise SpecError(f"{self.key(key)}: must be {describe(hint)}, got {value!r}")
        return float(value) if hint is float else value

    def has(self, key: str) -> bool:
        return key in self.data

    def rest(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in self.taken}

    def finish(self) -> None:
        extra = sorted(set(self.data) - self.taken)
        if extra:
            raise SpecError(f"{self.key(extra[0])}: unknown key; known keys here: {sorted(self.taken)}")


def options(role: str, table: Table) -> dict[str, Any]:
    """The untaken keys of ``table`` as config options of ``role``, checked by name
    (their values are checked when the config is built)."""
    row = ROLES[role]
    rest = table.rest()
    known = {f.name for f in dataclasses.fields(row.config)}
    for key in sorted(rest):
        if key in row.spec_sets:
            fail(table.key(key), "is set by the spec itself and cannot be given (see docs/deploy.md)")
        if key not in known:
            fail(table.key(key), f"unknown key; {role} options: {sorted(known - row.spec_sets)}")
    table.taken.update(rest)
    return rest


def check_address(path: str, address: str) -> None:
    """An IPv4 address (``127.0.0.1``) or a host name (``localhost``, ``node-1.lan``)."""
    bad = f"must be an address such as 127.0.0.1 or a host name, got {address!r}"
    if not address or len(address) > 253:
        fail(path, bad)
    if all(c.isdigit() or c == "." for c in address):
        try:
            ipaddress.IPv4Address(address)
        except ValueError as exc:
            fail(path, f"{bad}: {exc}")
        return
    if not all(_HOSTNAME_LABEL.match(label) for label in address.removesuffix(".").split(".")):
        fail(path, bad)


def read_source(source: str | os.PathLike | dict) -> dict:
    """The parsed spec: a dict as given, or a TOML file read."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, not a spec file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (a spec is TOML)") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None


def run_dir(given: str | None, name: str) -> str:
    return str(Path(given if given is not None else f"runs/{name}").absolute())


def run_dir_of(source: str | os.PathLike | dict) -> str:
    """The absolute run_dir of a spec, read without checking the rest of it (so that
    ``keel down`` works even when, say, the model store has gone)."""
    cluster = read_source(source).get("cluster", {})
    if not isinstance(cluster, dict):
        raise SpecError("cluster: must be a table")
    name, given = cluster.get("name", "keel"), cluster.get("run_dir")
    if not isinstance(name, str) or not (given is None or isinstance(given, str)):
        raise SpecError("cluster.name and cluster.run_dir must be strings")
    return run_dir(given, name)
