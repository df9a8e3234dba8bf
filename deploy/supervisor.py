"""Run a cluster spec's services on this machine under supervisord, a real process manager.

``render`` writes ``RUN_DIR/supervisord.conf`` (one ``[program:NAME]`` per service, each
restarted when it dies, its config in ``RUN_DIR/config/NAME.json``: ``deploy.programs``);
``up`` renders, checks ports and store files (``deploy.preflight``), starts supervisord and
waits until every program is RUNNING and the frontend answers a status request; on a
cluster that runs already it changes nothing and says what differs from the spec, unless
asked to apply it (``apply=True``, ``keel up --apply``); ``down`` shuts supervisord down and
waits until it and its programs are gone; ``status`` reads program states over
supervisord's XML-RPC socket and asks the frontends and the dispatcher for their status.
Everything ``up`` creates lives under the spec's run_dir.

Example
-------
>>> spec = up("deploy/examples/noop.toml")          # doctest: +SKIP
>>> status(spec)["programs"][0]["statename"]         # doctest: +SKIP
'RUNNING'
>>> up("deploy/examples/noop.toml", apply=True)      # doctest: +SKIP
>>> down(spec)                                       # doctest: +SKIP
"""
from __future__ import annotations

import configparser
import hashlib
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel.common.roles import ROLES
from keel.common.waiting import wait_until
from keel.common.spec import ClusterSpec, load_spec, run_dir_of
from keel.deploy.programs import (SPARE, Program, diff, open_versions_kept, programs, read_served, record_served,
                                  recorded_versions, running, store_models, versions_to_roll, write_configs)
from keel.deploy.units import render_systemd  # noqa: F401  (re-exported: deploy.supervisor.render_systemd)

_BAD_STATES = {"FATAL", "EXITED", "STOPPED", "UNKNOWN"}
_SOCKET_MAX = 100  # AF_UNIX paths are limited to ~107 bytes


class DeployError(RuntimeError):
    """``keel up/down/status`` could not do what was asked; the message says what to look at."""


# --------------------------------------------------------------------------- rendering


def _socket_path(run_dir: Path) -> Path:
    sock = run_dir / "supervisor.sock"
    if len(str(sock)) <= _SOCKET_MAX:
        return sock
    return Path("/tmp") / f"keel-{hashlib.sha1(str(run_dir).encode()).hexdigest()[:12]}.sock"


def _value(text: str, what: str) -> str:
    """``text`` safe as a supervisord option value: '%' is its expansion character and an
    inline ' ;' or ' #' would start a comment, which no quoting can protect."""
    if " ;" in text or " #" in text or "\n" in text:
        raise DeployError(f"{what}: {text[:80]!r}... holds ' ;', ' #' or a newline, which supervisord cannot carry")
    return text.replace("%", "%%")


def render(spec: ClusterSpec, python: str = sys.executable, served: dict[str, str] | None = None) -> Path:
    """Write ``spec.run_dir/supervisord.conf`` and every program's config file
    (``RUN_DIR/config/NAME.json``, serving the ``served`` versions where given: see
    ``deploy.programs``); returns the conf's path."""
    want = programs(spec, python, served)
    write_configs(spec.run_dir, want)
    return _write_conf(spec, want)


def _write_conf(spec: ClusterSpec, want: dict[str, Program]) -> Path:
    run_dir = Path(spec.run_dir)
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    lines = [
        f"; supervisord configuration of Keel cluster {spec.name!r}, rendered by `keel up` from its spec.",
        "; Do not edit: `keel up` renders it again.",
        "[unix_http_server]",
        f"file = {_value(str(_socket_path(run_dir)), 'socket')}",
        "chmod = 0700",
        "",
        "[supervisord]",
        f"pidfile = {_value(str(run_dir / 'supervisord.pid'), 'run_dir')}",
        f"logfile = {_value(str(run_dir / 'supervisord.log'), 'run_dir')}",
        "logfile_maxbytes = 10MB",
        "logfile_backups = 2",
        "loglevel = info",
        "nodaemon = false",
        f"directory = {_value(cwd, 'cwd')}",
        f"childlogdir = {_value(str(logs), 'run_dir')}",
        f"identifier = keel-{spec.name}",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl = unix://{_value(str(_socket_path(run_dir)), 'socket')}",
        "",
    ]
    for prog in want.values():
        lines += [
            f"[program:{prog.name}]",
            f"command = {_value(shlex.join(prog.argv), prog.name + ' command')}",
            f"directory = {_value(cwd, 'cwd')}",
            # what others connect to starts first; a hot spare just after its service (which
            # of the two serves first is the one whose imports end first) and it stops just
            # before it (else it would take over as the service stops)
            f"priority = {ROLES[prog.role].priority + prog.name.endswith(SPARE)}",
            "autostart = true",
            "autorestart = true",
            "startsecs = 1",
            "startretries = 3",
            "stopsignal = TERM",
            "stopwaitsecs = 5",
            "stopasgroup = true",
            "killasgroup = true",
            "redirect_stderr = true",
            f"stdout_logfile = {_value(str(logs / (prog.name + '.log')), 'run_dir')}",
            "stdout_logfile_maxbytes = 10MB",
            "stdout_logfile_backups = 2",
            f"environment = {_environment(prog)}",
            "",
        ]
    python = next((p.argv[0] for p in want.values()), sys.executable)
    lines += [  # a program that dies is restarted at once, not on supervisord's 1 s poll (deploy.restarts)
        "[eventlistener:keel-restarts]",
        f"command = {_value(shlex.join([python, '-m', 'keel.deploy.restarts']), 'keel-restarts command')}",
        f"directory = {_value(cwd, 'cwd')}",
        "events = PROCESS_STATE_RUNNING",
        "priority = 1",
        "autorestart = true",
        f"stderr_logfile = {_value(str(logs / 'keel-restarts.log'), 'run_dir')}",
        "stderr_logfile_maxbytes = 1MB",
        "stderr_logfile_backups = 1",
        "",
    ]
    conf = run_dir / "supervisord.conf"
    tmp = conf.with_suffix(".conf.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(conf)
    return conf


def _environment(prog: Program) -> str:
    """The program's ``environment`` option: unbuffered output, and a worker placed on a GPU
    sees only that one (``common.devices.program_env``)."""
    from keel.common.devices import program_env

    env = {"PYTHONUNBUFFERED": "1", **(program_env(prog.config) if prog.role == "worker" else {})}
    return ",".join(f'{k}="{_value(v, prog.name + " " + k)}"' for k, v in env.items())


# --------------------------------------------------------------------------- talking to supervisord


def _conf_paths(run_dir: Path) -> tuple[Path, Path]:
    """(socket, pidfile) named in a rendered configuration."""
    conf = run_dir / "supervisord.conf"
    if not conf.is_file():
        raise DeployError(f"{conf} does not exist: nothing was brought up from this run_dir")
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",), strict=False)
    parser.read(conf)
    unsub = lambda s: s.replace("%%", "%")  # noqa: E731
    return Path(unsub(parser.get("unix_http_server", "file"))), Path(unsub(parser.get("supervisord", "pidfile")))


def rpc(run_dir: str | os.PathLike) -> Any:
    """An XML-RPC proxy to the supervisord of ``run_dir`` (``proxy.supervisor.getState()``...)."""
    from supervisor.xmlrpc import SupervisorTransport

    sock, _ = _conf_paths(Path(run_dir))
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=SupervisorTransport(None, None, f"unix://{sock}"))


def _running(run_dir: Path) -> bool:
    try:
        rpc(run_dir).supervisor.getState()
        return True
    except (OSError, xmlrpc.client.Fault, DeployError):
        return False


def is_up(run_dir: str | os.PathLike) -> bool:
    """Whether the supervisord of ``run_dir`` answers."""
    return _running(Path(run_dir))


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: in a container nobody may reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def _read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def log_tail(run_dir: str | os.PathLike, name: str, lines: int = 20) -> str:
    path = Path(run_dir) / "logs" / f"{name}.log"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or f"(empty log {path})"


def _as_spec(spec: ClusterSpec | str | os.PathLike | dict, addresses: dict[str, str] | None = None) -> ClusterSpec:
    return spec if isinstance(spec, ClusterSpec) else load_spec(spec, addresses)


# --------------------------------------------------------------------------- up / down / status


def up(spec: ClusterSpec | str | os.PathLike | dict, wait_s: float = 30.0, addresses: dict[str, str] | None = None,
       out: Callable[[str], Any] | None = print, apply: bool = False) -> ClusterSpec:
    """Bring a spec's cluster up; on one that runs already, say what differs and change it
    only when ``apply`` is set.

    Starting: render, check that the ports are free and the store's files intact, start
    supervisord, wait until every program is RUNNING and the cluster is ready, record the
    versions served, print a table. Raises ``DeployError`` naming the failing programs with
    the tail of their logs; a supervisord this call started is shut down again first.

    Running already: what runs is left as it is, and the versions rolled out or back are
    kept (``deploy.programs``); the differences are printed. With ``apply``, changed models
    are rolled like ``keel model rollout`` and other changed services restarted one at a
    time, each ready before the next.
    """
    spec = _as_spec(spec, addresses)
    run_dir = Path(spec.run_dir)
    if _running(run_dir):
        return _reconcile(spec, wait_s, out, apply)
    try:
        conf = render(spec)
    except OSError as exc:
        raise DeployError(f"run_dir {run_dir}: cannot write there: {exc.strerror or exc}"
                          + (f" ({exc.filename})" if exc.filename else "")) from None
    from keel.deploy.preflight import PreflightError, check_devices, check_ports, check_store

    try:
        check_ports(spec)
        check_store(spec)
        check_devices(spec)
    except PreflightError as exc:
        raise DeployError(str(exc)) from None
    supervisord = Path(sys.executable).parent / "supervisord"
    # a venv that borrows its packages (an editable worktree's) has supervisor but not its script
    command = [str(supervisord)] if supervisord.exists() else [sys.executable, "-m", "supervisor.supervisord"]
    if not supervisord.exists() and importlib.util.find_spec("supervisor") is None:
        raise DeployError(f"{supervisord} not found: install supervisor in this environment (pip install supervisor)")
    proc = subprocess.run([*command, "-c", str(conf)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise DeployError(f"supervisord failed to start (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}\n"
                          f"see {run_dir / 'supervisord.log'}")
    if not wait_until(lambda: _running(run_dir), 10.0, interval_s=0.1):
        raise DeployError(f"supervisord did not open its socket; see {run_dir / 'supervisord.log'}")
    try:
        _wait_ready(spec, time.monotonic() + wait_s)
    except DeployError:
        down(spec, out=None)
        raise
    record_served(spec, {m: t["version"] for m, t in store_models(spec).items()}, "up", replace=True)
    if out:
        out(format_table(_program_rows(spec, _programs(run_dir))))
        out(f"cluster {spec.name} is up: supervisord in {run_dir}; clients connect to {', '.join(spec.client_endpoints)}")
    return spec


def _reconcile(spec: ClusterSpec, wait_s: float, out: Callable[[str], Any] | None, apply: bool) -> ClusterSpec:
    """``up`` on a running cluster: the differences, applied only when asked."""
    run_dir = Path(spec.run_dir)
    say = out or (lambda _: None)
    want = programs(spec, served=recorded_versions(spec))
    states = {n: p.get("statename", "?") for n, p in _programs(run_dir).items()}
    plan = diff(want, running(run_dir), states, versions_to_roll(spec), open_versions_kept(spec))
    say(format_table(_program_rows(spec, _programs(run_dir))))
    if plan.empty:
        say("\n".join([f"cluster {spec.name} runs as its spec says: nothing to change", *plan.lines()]))
        return spec
    say("\n".join([f"cluster {spec.name} runs; its spec differs from what runs:", *plan.lines()]))
    if not apply:
        say("nothing changed: `keel up SPEC --apply` applies the differences")
        return spec
    from keel.deploy.preflight import PreflightError, check_devices

    try:
        check_devices(spec)  # a worker moved to a GPU this host lacks would restart for ever
    except PreflightError as exc:
        raise DeployError(str(exc)) from None
    server = rpc(run_dir)
    write_configs(run_dir, want, plan.added + list(plan.changed))
    _write_conf(spec, want)
    command_changed = set(server.supervisor.reloadConfig()[0][1])
    for name in plan.removed:
        _stop(server, name, group=True)
        (run_dir / "config" / f"{name}.json").unlink(missing_ok=True)
        say(f"{name}: stopped and removed")
    for name in list(plan.changed) + plan.added + list(plan.stopped):
        if name in plan.added or name in command_changed:  # supervisord takes a new command only with a new group
            _stop(server, name, group=True)
            server.supervisor.addProcessGroup(name)
        else:
            _stop(server, name, group=False)
            server.supervisor.startProcess(name, False)
        _wait_ready(spec, time.monotonic() + wait_s)  # one at a time: the next only once this one serves
        say(f"{name}: {'started' if name in plan.added or name in plan.stopped else 'restarted'}, ready")
    from keel.deploy.rollout import RolloutError, rollout

    for model, (_, version) in plan.versions.items():
        try:
            rollout(spec, model, version, timeout_s=wait_s, log=say)
        except RolloutError as exc:
            raise DeployError(f"model {model}: {exc}") from None
        record_served(spec, {model: version}, "up --apply")
    recorded = recorded_versions(spec)
    started = {m: t["version"] for m, t in store_models(spec).items() if m not in recorded}
    if started:  # models new to the cluster serve the spec's version
        record_served(spec, started, "up --apply")
    say(f"cluster {spec.name}: applied")
    return spec


def _stop(server: Any, name: str, group: bool) -> None:
    """Stop a program (and with ``group`` remove it from supervisord); one that is not
    running or not known is fine."""
    try:
        server.supervisor.stopProcessGroup(name) if group else server.supervisor.stopProcess(name)
    except xmlrpc.client.Fault:
        pass
    if group:
        try:
            server.supervisor.removeProcessGroup(name)
        except xmlrpc.client.Fault:
            pass


def _programs(run_dir: Path) -> dict[str, dict]:
    try:
        return {p["name"]: p for p in rpc(run_dir).supervisor.getAllProcessInfo()}
    except (OSError, xmlrpc.client.Fault):
        return {}


def _wait_ready(spec: ClusterSpec, deadline: float) -> None:
    """Until every program is RUNNING and the cluster is ready (``ClusterSpec.unready``:
    frontends answer, every worker has registered with the dispatcher).

    A program that restarts meanwhile (its pid changes) has failed, even if it outlived
    ``startsecs``: nothing in a healthy start makes a Keel service exit.
    """
    from keel.common.transport import request_status

    run_dir = Path(spec.run_dir)
    names = [s.name for s in spec.services]
    first_pid: dict[str, int] = {}
    unready: list[str] = []
    while True:
        procs = _programs(run_dir)
        for n in names:
            if procs.get(n, {}).get("pid"):
                first_pid.setdefault(n, procs[n]["pid"])
        failed = [n for n in names if procs.get(n, {}).get("statename") in _BAD_STATES
                  or procs.get(n, {}).get("pid") not in (None, 0, first_pid.get(n))]
        waiting = [n for n in names if procs.get(n, {}).get("statename") != "RUNNING"]
        if not failed and not waiting:
            unready = spec.unready(lambda ep: request_status(ep, timeout_s=0.25))
            if not unready:
                return
        if failed or time.monotonic() >= deadline:
            if failed:
                bad, why = failed, "exited during start-up"
            elif waiting:
                bad, why = waiting, "not RUNNING by the deadline"
            else:
                bad, why = unready, "RUNNING but not ready (no status answer, or workers not registered)"
            detail = "\n".join(f"--- {n} ({procs.get(n, {}).get('statename', 'missing')}), "
                               f"tail of {run_dir / 'logs' / (n + '.log')}:\n{log_tail(run_dir, n)}" for n in bad[:3])
            raise DeployError(f"cluster {spec.name}: {', '.join(bad)} {why}\n{detail}")
        time.sleep(0.1)


def _run_dir(target: ClusterSpec | str | os.PathLike | dict) -> Path:
    if isinstance(target, ClusterSpec):
        return Path(target.run_dir)
    if isinstance(target, dict) or Path(target).is_file():
        return Path(run_dir_of(target))
    if Path(target).is_dir():
        return Path(target)
    raise DeployError(f"{target}: neither a spec file nor a run_dir")


def down(target: ClusterSpec | str | os.PathLike | dict, wait_s: float = 30.0, out: Callable[[str], Any] | None = print) -> bool:
    """Shut down the supervisord of a spec (or run_dir) and wait until it and its programs
    are gone. Returns False when nothing was running (never brought up, or down already):
    ``down`` is idempotent."""
    run_dir = _run_dir(target)
    if not (run_dir / "supervisord.conf").is_file():
        if out:
            out(f"nothing was brought up in {run_dir}; nothing to stop")
        return False
    sock, pidfile = _conf_paths(run_dir)
    pid = _read_pid(pidfile)
    children = [p["pid"] for p in _programs(run_dir).values() if p.get("pid")]
    try:
        rpc(run_dir).supervisor.shutdown()
    except (OSError, xmlrpc.client.Fault):
        if pid is None or not _alive(pid):
            if out:
                out(f"nothing running in {run_dir}")
            return False
        os.kill(pid, signal.SIGTERM)  # its socket is gone but our supervisord is not: TERM is its shutdown
    deadline = time.monotonic() + wait_s
    if pid is not None and not wait_until(lambda: not _alive(pid), deadline=deadline, interval_s=0.1):
        raise DeployError(f"supervisord (pid {pid}) still runs {wait_s:.0f} s after shutdown; see {run_dir / 'supervisord.log'}")
    wait_until(lambda: not any(_alive(c) for c in children), deadline=deadline, interval_s=0.1)
    left = [c for c in children if _alive(c)]
    for child in left:  # supervisord is gone; these were its programs
        os.kill(child, signal.SIGKILL)
    if out:
        out(f"cluster in {run_dir} is down" + (f" (killed leftover pids {left})" if left else ""))
    return True


def status(spec: ClusterSpec | str | os.PathLike | dict, timeout_s: float = 1.0) -> dict[str, Any]:
    """{"running": bool, "programs": [row per service], "info": {service: status dict or None},
    "served": {model: {"version", "by", "at", ...}}} (``served``: ``deploy.programs.read_served``)."""
    spec = _as_spec(spec)
    run_dir = Path(spec.run_dir)
    running = (run_dir / "supervisord.conf").is_file() and _running(run_dir)
    rows = _program_rows(spec, _programs(run_dir) if running else {})
    info: dict[str, Any] = {}
    if running or len(spec.hosts) > 1:  # across hosts, the others' services answer whatever runs here
        from keel.common.transport import request_status

        for name, ep in spec.status_endpoints().items():
            info[name] = request_status(ep, timeout_s=timeout_s)
        for row in rows:
            if row["name"] in info:
                row["answers"] = "yes" if info[row["name"]] is not None else "no"
    return {"running": running, "programs": rows, "info": info, "served": read_served(run_dir)}


def _program_rows(spec: ClusterSpec, procs: dict[str, dict]) -> list[dict[str, Any]]:
    rows = []
    now = time.time()
    for svc in spec.services:
        p = procs.get(svc.name, {})
        up_s = now - p["start"] if p.get("statename") == "RUNNING" and p.get("start") else None
        rows.append({"name": svc.name, "role": svc.role, "host": svc.host, "state": p.get("statename", "-"),
                     "pid": p.get("pid") or "-", "uptime_s": f"{up_s:.0f}" if up_s is not None else "-",
                     "endpoints": " ".join(svc.endpoints()) or "-"})
        if any(getattr(s.config, "device", "cpu") != "cpu" for s in spec.role("worker")):
            from keel.common.devices import wanted_gpu

            rows[-1]["gpu"] = (wanted_gpu(svc.config) or "cpu") if svc.role == "worker" else "-"
    return rows


def format_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """A plain text table of ``rows`` (dicts), columns in first-seen key order."""
    if not rows:
        return "(none)"
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[str(c).upper() for c in columns]] + [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (dict, list)):
        import orjson

        return orjson.dumps(value).decode()
    return str(value)
