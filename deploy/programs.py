"""A spec's services as supervisord programs, what runs now, and what differs between them.

``keel up`` runs each service as ``python -m keel.services.serve ROLE --config @FILE``
with its config in ``RUN_DIR/config/NAME.json``: the command line never changes with the
config, so supervisord restarts a program that dies with the config the operator last
applied, and a rollout can change the version in a worker's file without restarting it.

``RUN_DIR/served.json`` records the version each store-backed model serves and who set
it (``up``, ``up --apply``, ``model rollout``, ``model rollback``)::

    {"models": {"scale": {"version": "1", "store_name": "scale", "store": "/abs/store",
                          "by": "model rollback", "at": "2025-01-01T00:00:00Z"}}}

``keel status`` shows it; ``keel up`` on a running cluster keeps those versions (a model
whose spec leaves ``version`` open serves what was rolled out or back) and ``diff`` says
what else differs between the spec and what runs: programs added, removed, or with
another config, programs not RUNNING, and pinned versions that differ from the served one.

Example
-------
>>> want = programs(spec, served=recorded_versions(spec))   # doctest: +SKIP
>>> plan = diff(want, running(spec.run_dir), states, versions_to_roll(spec))  # doctest: +SKIP
>>> print("\\n".join(plan.lines()))                           # doctest: +SKIP
"""
from __future__ import annotations

import configparser
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from keel.common import config as cfg
from keel.common.roles import ROLES

SERVED = "served.json"


def config_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "config"


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


# --------------------------------------------------------------------------- served versions


def read_served(run_dir: str | os.PathLike) -> dict[str, dict[str, str]]:
    """Model -> {"version", "by", "at"} from ``RUN_DIR/served.json`` ({} when absent or unreadable:
    the record only ever keeps versions, it never decides whether a cluster runs)."""
    try:
        data = orjson.loads((Path(run_dir) / SERVED).read_bytes())
        models = data["models"]
        return {m: dict(v) for m, v in models.items() if isinstance(v, dict) and isinstance(v.get("version"), str)}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return {}


def set_version(config: dict[str, Any], model: str, version: str) -> bool:
    """Make one service config (a dict) serve ``version`` of ``model``: a deployed worker's
    ``version``, a frontend's or the gateway's ``models[model].version``; whether it changed."""
    changed = False
    if config.get("model") == model and config.get("role") == "deployed" and "version" in config:
        changed, config["version"] = config["version"] != version, version
    infos = config.get("models")
    if isinstance(infos, dict) and isinstance(infos.get(model), dict) and "version" in infos[model]:
        changed = changed or infos[model]["version"] != version
        infos[model]["version"] = version
    return changed


def record_served(spec: Any, versions: dict[str, str], by: str, replace: bool = False) -> None:
    """Record in ``spec``'s run_dir that ``versions`` (model -> version) are served, and
    write them into the config files of the programs that hold them, so that a restart
    serves them too. ``replace``: forget what was recorded before (a fresh ``up``)."""
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    models = {} if replace else read_served(run_dir)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    models.update({m: {"version": v, "store_name": spec.models[m].get("store_name") or m, "store": spec.store,
                       "by": by, "at": at} for m, v in versions.items()})
    _write(run_dir / SERVED, orjson.dumps({"models": models}, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    for path in sorted(config_dir(run_dir).glob("*.json")):
        try:
            config = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if any([set_version(config, m, v) for m, v in versions.items()]):
            _write(path, orjson.dumps(config))


def store_models(spec: Any) -> dict[str, dict]:
    """The spec's models served from the store (builtins have no versions to keep)."""
    return {m: t for m, t in spec.models.items() if not t.get("builtin")}


def recorded_versions(spec: Any) -> dict[str, str]:
    """Model -> the version recorded as served, for the spec's store-backed models."""
    served = read_served(spec.run_dir)
    return {m: served[m]["version"] for m in store_models(spec) if m in served}


def versions_to_roll(spec: Any) -> dict[str, tuple[str, str]]:
    """Model -> (served, wanted) where the spec pins a version other than the one served.
    A model whose spec leaves the version open keeps what was rolled out or back."""
    served = recorded_versions(spec)
    return {m: (served[m], t["version"]) for m, t in store_models(spec).items()
            if t.get("version_pinned") and m in served and served[m] != t["version"]}


def open_versions_kept(spec: Any) -> dict[str, tuple[str, str]]:
    """Model -> (served, the spec's latest) where the spec leaves the version open and a
    rollout or rollback made the cluster serve another."""
    served = recorded_versions(spec)
    return {m: (served[m], t["version"]) for m, t in store_models(spec).items()
            if not t.get("version_pinned") and m in served and served[m] != t["version"]}


# --------------------------------------------------------------------------- programs


@dataclass
class Program:
    """One supervisord program: its command line and the config its file holds."""

    name: str
    role: str
    argv: list[str]
    config: dict[str, Any]


def programs(spec: Any, python: str = sys.executable, served: dict[str, str] | None = None) -> dict[str, Program]:
    """The spec's services as programs, in spec order, serving ``served`` versions (model ->
    version) where given instead of the spec's."""
    folder = config_dir(spec.run_dir)
    out = {}
    for svc in spec.services:
        config = orjson.loads(cfg.to_json(svc.config))
        for model, version in (served or {}).items():
            set_version(config, model, version)
        argv = svc.argv(python, config=f"@{folder / (svc.name + '.json')}")
        if config.get("spare"):  # a hot spare beside it, started alike: whichever holds the lock serves
            argv += ["--spare-lock", str(spare_lock(spec.run_dir, svc.name))]
            out[svc.name + SPARE] = Program(svc.name + SPARE, svc.role, argv, config)
        out[svc.name] = Program(svc.name, svc.role, argv, config)
    return dict(sorted(out.items(), key=lambda item: item[0].endswith(SPARE)))  # spares after every service


#: the name of a service's hot spare program is the service's with this suffix
SPARE = "-spare"


def spare_lock(run_dir: str | os.PathLike, name: str) -> Path:
    """The lock a service and its hot spare take turns holding (``services.serve``); the
    file holds the pid of the process that serves."""
    return Path(run_dir) / "locks" / f"{name}.lock"


def write_configs(run_dir: str | os.PathLike, want: dict[str, Program], names: list[str] | None = None) -> None:
    """Write the config files of ``names`` (default: every program; then files of programs
    that are gone are removed)."""
    folder = config_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if names is None:
        for stale in folder.glob("*.json"):
            if stale.stem not in want:
                stale.unlink()
    for name in want if names is None else names:
        _write(folder / f"{name}.json", orjson.dumps(want[name].config))


def running(run_dir: str | os.PathLike) -> dict[str, Program]:
    """The programs of ``RUN_DIR/supervisord.conf`` with the configs they start with."""
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",), strict=False)
    parser.read(Path(run_dir) / "supervisord.conf")
    out = {}
    for section in parser.sections():
        if not section.startswith("program:"):
            continue
        name = section.removeprefix("program:")
        argv = shlex.split(parser.get(section, "command", fallback="").replace("%%", "%"))
        role = argv[argv.index("keel.services.serve") + 1] if "keel.services.serve" in argv[:-1] else "?"
        out[name] = Program(name, role, argv, _config_of(argv))
    return out


def _config_of(argv: list[str]) -> dict[str, Any]:
    if "--config" not in argv[:-1]:
        return {}
    raw = argv[argv.index("--config") + 1]
    try:
        return orjson.loads(Path(raw[1:]).read_bytes() if raw.startswith("@") else raw)
    except (OSError, orjson.JSONDecodeError):
        return {}


# --------------------------------------------------------------------------- differences


@dataclass
class Plan:
    """What ``keel up --apply`` would do to make what runs match the spec."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    #: program -> what differs ("timeout_ms: 1000.0 -> 2000.0", ...)
    changed: dict[str, list[str]] = field(default_factory=dict)
    #: program -> its state, for programs that should run and do not
    stopped: dict[str, str] = field(default_factory=dict)
    #: model -> (served, wanted): rolled like ``keel model rollout``
    versions: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: model -> (served, the spec's latest): kept, said for information
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.stopped or self.versions)

    def lines(self) -> list[str]:
        out = [f"  {m}: serves version {old} (rolled out or back); the spec leaves its version open "
               f"(latest {new}): kept; `keel model rollout` moves it" for m, (old, new) in self.kept.items()]
        out += [f"  {n}: new service; --apply starts it" for n in self.added]
        out += [f"  {n}: not in the spec; --apply stops it" for n in self.removed]
        out += [f"  {n}: {'; '.join(what)}; --apply restarts it" for n, what in self.changed.items()]
        out += [f"  {n}: {state}; --apply starts it" for n, state in self.stopped.items()]
        out += [f"  model {m}: serves version {old}, the spec pins version {new}; --apply rolls its workers "
                "one at a time" for m, (old, new) in self.versions.items()]
        return out


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _differences(old: Program, new: Program) -> list[str]:
    what = []
    if old.role != new.role:
        what.append(f"role {old.role} -> {new.role}")
    for key in sorted(set(old.config) | set(new.config)):
        if old.config.get(key) != new.config.get(key):
            what.append(f"{key}: {_short(old.config.get(key))} -> {_short(new.config.get(key))}")
    strip = lambda argv: [a for i, a in enumerate(argv) if not (i and argv[i - 1] == "--config") and a != "--config"]  # noqa: E731
    if strip(old.argv) != strip(new.argv):
        what.append(f"command: {shlex.join(strip(old.argv))} -> {shlex.join(strip(new.argv))}")
    return what


def diff(want: dict[str, Program], have: dict[str, Program], states: dict[str, str],
         versions: dict[str, tuple[str, str]] | None = None, kept: dict[str, tuple[str, str]] | None = None) -> Plan:
    """What differs between the programs ``want``ed and those that ``have`` run (``states``:
    program -> supervisord state name)."""
    plan = Plan(versions=dict(versions or {}), kept=dict(kept or {}))
    order = lambda names: sorted(names, key=lambda n: ROLES[want[n].role].priority if n in want and want[n].role in ROLES else 0)  # noqa: E731
    plan.added = [n for n in want if n not in have]
    plan.removed = [n for n in have if n not in want]
    for name in order([n for n in want if n in have]):
        what = _differences(have[name], want[name])
        if what:
            plan.changed[name] = what
        elif states.get(name) != "RUNNING":
            plan.stopped[name] = states.get(name, "missing")
    return plan
