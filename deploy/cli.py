"""``keel up | down | status | predict | serve-spec | render-systemd | render-k8s | logs``: run a cluster spec.

``keel up`` on a cluster that runs already changes nothing: it says what differs between
the spec and what runs (``deploy.programs``); ``keel up --apply`` applies it.

``add_parser(subparsers)`` adds the subcommands to the ``keel`` parser; each sets
``func(args) -> int`` (the exit status).

Example
-------
::

    keel up deploy/examples/noop.toml
    keel up deploy/examples/noop.toml --apply      # after an edit: roll and restart what changed
    keel predict --spec deploy/examples/noop.toml noop --input '[0, 0, 0, 0]'
    keel predict --spec deploy/examples/selection.toml digits --key alice --input '[0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]'
    keel status deploy/examples/noop.toml
    keel logs deploy/examples/noop.toml worker -f
    keel down deploy/examples/noop.toml
    keel up deploy/examples/three-hosts.toml --host h2   # on host h2: its services only
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from keel.common.spec import SpecError, load_spec
from keel.deploy.keys_cli import use_for_spec


def _addresses(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        host, sep, address = pair.partition("=")
        if not sep:
            raise SpecError(f"--address {pair!r}: expected HOST=ADDRESS")
        out[host] = address
    return out


def _fail(msg: str) -> int:
    print(f"keel: {msg}", file=sys.stderr)
    return 1


def cmd_up(args: argparse.Namespace) -> int:
    from keel.deploy.supervisor import DeployError, up

    try:
        spec = load_spec(args.spec, _addresses(args.address))
        use_for_spec(spec)
        up(spec.for_host(args.host) if args.host else spec, wait_s=args.wait, apply=args.apply)
    except (SpecError, DeployError) as exc:
        return _fail(str(exc))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from keel.deploy.supervisor import DeployError, down

    try:
        if args.host:  # this host's supervisord: its run_dir is the spec's, on this machine
            _check_host(args.target, args.host)
        down(args.target, wait_s=args.wait)
    except (SpecError, DeployError) as exc:
        return _fail(str(exc))
    return 0


def _check_host(target: str, host: str) -> None:
    """``host`` is one of the spec's [hosts], read without resolving the rest: ``down`` needs
    neither the model store nor the store service (they may be down first)."""
    from keel.common.spec.tables import read_source

    if Path(target).is_dir():
        return  # a run_dir: it is this machine's whatever the host
    hosts = read_source(target).get("hosts", {"local": "127.0.0.1"})
    if not isinstance(hosts, dict) or host not in hosts:
        raise SpecError(f"host {host!r} is not in [hosts] ({sorted(hosts) if isinstance(hosts, dict) else hosts})")


def cmd_status(args: argparse.Namespace) -> int:
    from keel.deploy.supervisor import DeployError, format_table, status

    try:
        spec = load_spec(args.spec, _addresses(args.address))
        use_for_spec(spec)
        st = status(spec, timeout_s=args.timeout)
    except (SpecError, DeployError) as exc:
        return _fail(str(exc))
    if args.json:
        print(orjson.dumps(st, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
        return 0 if st["running"] else 3
    answered = any(v is not None for v in st["info"].values())
    if not st["running"]:
        print("supervisord is not running for this spec" + (" on this host" if answered else ""))
    print(format_table(st["programs"]))
    if st["served"]:
        print("\n== served versions (set by keel up, up --apply, model rollout, model rollback)")
        print(format_table([{"model": m, **{k: r.get(k, "-") for k in ("version", "store_name", "by", "at")}}
                            for m, r in st["served"].items()]))
    for name, info in st["info"].items():
        print(f"\n== {name}")
        if info is None:
            print(f"(no answer within {args.timeout:g} s)")
            continue
        for title, rows in info_tables(info):
            if title:
                print(f"-- {title}")
            print(format_table(rows))
    if (st["running"] or answered) and spec.role("manager"):
        from keel.deploy.manager_cli import show

        print("\n== the manager's view (leader, term, roles and epochs, last decisions)")
        show([s.config.endpoint for s in spec.role("manager")])
    return 0 if st["running"] or answered else 3


def info_tables(info: dict[str, Any]) -> list[tuple[str, list[dict]]]:
    """A service's status dict as tables: scalars as key/value rows, then one table per
    dict-of-dicts (e.g. per-worker batch sizes and queue lengths) or list of dicts; a
    frontend's ``targets`` as one row per target (what ``keel predict`` can call)."""
    scalars = [{"key": k, "value": v} for k, v in info.items() if not _is_table(v)]
    tables: list[tuple[str, list[dict]]] = [("", scalars)] if scalars else []
    for key, value in info.items():
        if key == "targets" and _is_table(value):
            tables.append(("targets", target_rows(value)))
        elif _is_table(value):
            tables.append((key, [{key: k, **v} for k, v in value.items()] if isinstance(value, dict) else value))
    return tables


def target_rows(targets: dict[str, dict]) -> list[dict]:
    """One row per target: its name, kind, version (- for none), whether it takes a key,
    its input and output."""
    return [{"target": name, "kind": t.get("kind", "-"), "version": t.get("version") or "-",
             "key": "yes" if t.get("key") else "no",
             "input": f"{t.get('input_dtype', '?')}{t.get('input_shape', '?')}", "output": t.get("output_size", "-"),
             **{k: v for k, v in t.items() if k not in ("kind", "version", "key", "input_dtype", "input_shape", "output_size")}}
            for name, t in sorted(targets.items())]


def _is_table(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value) and all(isinstance(v, dict) for v in value.values())
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _input(text: str, target: dict):
    """``--input`` (a JSON list or a .npy file) as one input of ``target``: reshaped when
    its values fill the target's shape, converted by the rules every caller shares."""
    import numpy as np

    from keel.common import inputs

    if text.endswith(".npy"):
        x = np.load(text, allow_pickle=False)
    else:
        try:
            x = np.asarray(orjson.loads(text))
        except orjson.JSONDecodeError as exc:
            raise SpecError(f"--input: neither a .npy file nor a JSON list: {exc}") from None
    shape = target["input_shape"]
    if list(x.shape) != shape and x.size == int(np.prod(shape)):
        x = x.reshape(shape)
    try:
        return np.ascontiguousarray(inputs.validate(x, shape, target["input_dtype"], what="--input"))
    except inputs.InputError as exc:
        raise SpecError(str(exc)) from None


def served_targets(endpoints: list[str], timeout_s: float = 2.0) -> dict[str, dict] | None:
    """name -> target (kind, input shape and dtype, output size, version, key) as the first
    frontend that answers lists them (its status ``targets``); None if none does."""
    from keel.common.transport import request_status

    for endpoint in endpoints:
        info = request_status(endpoint, timeout_s=timeout_s)
        if info is not None and isinstance(info.get("targets"), dict):
            return info["targets"]
    return None


def _target(spec: Any, name: str) -> dict:
    """What ``name`` is: a model, an application or a graph, as the frontends serve it; the
    spec's model table while no frontend answers."""
    targets = served_targets(spec.local_client_endpoints)
    if targets is None:
        if name not in spec.models:
            raise SpecError(f"no frontend listed its targets (asked {', '.join(spec.client_endpoints) or 'none'}), "
                            f"and {name!r} is not one of the spec's models ({sorted(spec.models)})")
        table = spec.models[name]
        return {"kind": "model", "input_shape": table["input_shape"], "input_dtype": table["input_dtype"], "key": False}
    if name not in targets:
        served = ", ".join(f"{n} ({t.get('kind')})" for n, t in sorted(targets.items())) or "nothing"
        raise SpecError(f"{name!r} is not served; the frontends serve: {served}")
    return targets[name]


def cmd_predict(args: argparse.Namespace) -> int:
    from keel.common.client import Client
    from keel.deploy import predict

    try:
        spec = load_spec(args.spec, _addresses(args.address))
        use_for_spec(spec)
        target = _target(spec, args.model)
        if args.key is not None and not target.get("key"):
            raise SpecError(f"{target.get('kind', 'model')} {args.model!r} takes no --key (applications and graphs do)")
        x = predict.inputs_of(args.input, target, _input)
    except (SpecError, OSError, ValueError) as exc:
        return _fail(str(exc))
    with Client(spec.local_client_endpoints) as client:
        result = client.predict(args.model, x, key=args.key, version=args.version, timeout_ms=args.timeout_ms)
    print(orjson.dumps(predict.answer(result), option=orjson.OPT_SERIALIZE_NUMPY).decode())
    answered = result.output is not None or getattr(result, "outputs", None) is not None
    return 0 if result.error is None and answered else 1


def cmd_serve_spec(args: argparse.Namespace) -> int:
    """Replace this process with one service of the spec (for systemd or by hand)."""
    try:
        svc = load_spec(args.spec, _addresses(args.address)).service(args.service)
    except (SpecError, KeyError) as exc:
        return _fail(str(exc).strip('"'))
    argv = svc.argv()
    os.execv(argv[0], argv)
    return 0  # not reached


def cmd_render_systemd(args: argparse.Namespace) -> int:
    from keel.deploy.units import render_systemd

    try:
        spec = load_spec(args.spec, _addresses(args.address))
        hosts = [args.host] if args.host else list(spec.hosts)
        for host in hosts:
            out = Path(args.out) / host if not args.host else Path(args.out)
            paths = render_systemd(spec, host, out, python=args.python, workdir=args.workdir, etc_dir=args.etc,
                                   store=args.store)
            print(f"{host}: {len(paths)} files in {out}")
    except SpecError as exc:
        return _fail(str(exc))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from keel.deploy.logs import follow, log_paths, show

    try:
        paths = log_paths(load_spec(args.spec), args.service)
    except SpecError as exc:
        return _fail(str(exc))
    show(paths, sys.stdout, args.lines, args.level)
    if args.follow:
        try:
            follow(paths, sys.stdout, args.level)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_render_k8s(args: argparse.Namespace) -> int:
    from keel.deploy.k8s import render, write
    from keel.deploy.k8s_check import schema_errors, wiring_errors

    try:
        manifests = render(args.spec, image=args.image, worker_memory=args.worker_memory)
    except SpecError as exc:
        return _fail(str(exc))
    problems = wiring_errors(manifests)
    try:
        problems += schema_errors(manifests)
        checked = "checked against the Kubernetes OpenAPI schemas and wired"
    except ImportError:
        checked = "wired; not checked against the schemas (pip install 'keel[k8s]')"
    if problems:
        return _fail("the manifests would not run:\n  " + "\n  ".join(problems))
    paths = write(manifests, args.out)
    print(f"{len(paths)} files in {args.out}, {checked}; kubectl apply -f {args.out}")
    return 0


def add_parser(subparsers: Any) -> None:
    """Add up, down, status, predict, serve-spec, render-systemd, render-k8s and logs to ``keel``."""
    address = dict(action="append", metavar="HOST=ADDRESS", help="override a host's address from [hosts]")

    p = subparsers.add_parser("up", help="start a cluster spec's services under supervisord; on a running "
                              "cluster, say what differs from the spec (--apply changes it)")
    p.add_argument("spec", help="cluster spec (TOML)")
    p.add_argument("--apply", action="store_true",
                   help="on a running cluster, apply what differs: roll changed models like `keel model rollout`, "
                        "restart other changed services one at a time (default: change nothing, say what differs)")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for every service (default 30)")
    p.add_argument("--host", default=None, help="a host of [hosts]: start only its services, under this machine's "
                   "own supervisord (run on each host; default: every service here)")
    p.add_argument("--address", **address)
    p.set_defaults(func=cmd_up)

    p = subparsers.add_parser("down", help="stop a cluster brought up with `keel up`")
    p.add_argument("target", metavar="SPEC", help="cluster spec (TOML) or its run_dir")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for every process to exit")
    p.add_argument("--host", default=None, help="the host whose services this machine runs (checked against the spec)")
    p.set_defaults(func=cmd_down)

    p = subparsers.add_parser("status", help="program states and the frontends' and dispatcher's status")
    p.add_argument("spec", help="cluster spec (TOML)")
    p.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for each status answer")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--address", **address)
    p.set_defaults(func=cmd_status)

    p = subparsers.add_parser("predict", help="send one query to a model, application or graph of a running cluster")
    p.add_argument("--spec", required=True, help="cluster spec (TOML)")
    p.add_argument("model", metavar="NAME", help="a model, application or graph the frontends serve (keel status)")
    p.add_argument("--input", required=True, action="append",
                   help="NAME=JSON (or NAME=FILE.npy), once per input: nested lists, strings for bytes; "
                        "a single-input target takes the bare JSON list or .npy file")
    p.add_argument("--key", default=None, help="an application's context (a user, a session) or a graph's stream")
    p.add_argument("--version", default=None, help="a model version: answered by it or refused")
    p.add_argument("--timeout-ms", type=float, default=None, help="deadline (default: the client's, 1000 ms)")
    p.add_argument("--address", **address)
    p.set_defaults(func=cmd_predict)

    p = subparsers.add_parser("serve-spec", help="run one service of a spec in this process (systemd, by hand)")
    p.add_argument("spec", help="cluster spec (TOML)")
    p.add_argument("--service", required=True, help="service name, e.g. worker-digits-0")
    p.add_argument("--address", **address)
    p.set_defaults(func=cmd_serve_spec)

    p = subparsers.add_parser("render-systemd", help="write systemd units for the services of one host")
    p.add_argument("spec", help="cluster spec (TOML)")
    p.add_argument("--host", help="host of [hosts]; default every host, each in OUT/HOST")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--python", default=sys.executable, help="the interpreter on the target host")
    p.add_argument("--workdir", default=None, help="the services' working directory there (default: cwd)")
    p.add_argument("--etc", default="/etc/keel", help="where OUT/keel/ is installed (default /etc/keel)")
    p.add_argument("--store", default=None, help="the model store folder on the host (default: the spec's store "
                   "as resolved here); with a [store] table, workers fetch into it what it lacks")
    p.add_argument("--address", **address)
    p.set_defaults(func=cmd_render_systemd)

    p = subparsers.add_parser("render-k8s", help="write Kubernetes manifests (and a Containerfile) that run the spec")
    p.add_argument("spec", help="cluster spec (TOML)")
    p.add_argument("--out", required=True, help="output folder (kubectl apply -f OUT)")
    p.add_argument("--image", default="keel:latest", help="the image every pod runs (built from OUT/Containerfile)")
    p.add_argument("--worker-memory", default="1Gi", help="each worker's memory request and limit (default 1Gi)")
    p.set_defaults(func=cmd_render_k8s)

    p = subparsers.add_parser("logs", help="what a cluster's services wrote (RUN_DIR/logs), -f to follow")
    p.add_argument("spec", help="cluster spec (TOML)")
    p.add_argument("service", nargs="?", default=None, help="a service name or a role (default: every service)")
    p.add_argument("-f", "--follow", action="store_true", help="print what they write from now on, until Ctrl-C")
    p.add_argument("-n", "--lines", type=int, default=50, help="last lines of each log first (default 50)")
    p.add_argument("--level", choices=["debug", "info", "warning", "error", "critical"], default=None,
                   help="only lines at or above this level")
    p.set_defaults(func=cmd_logs)
