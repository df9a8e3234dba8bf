"""``keel model add | list | show``: bring your own model into the model store.

A model comes in three ways, each served by a model container behind ``predict_batch``
(``common.containers``):

- a TorchScript file (``torch.jit.save``);
- a ``torch.export`` program (``torch.export.save``, a ``.pt2`` file); one traced with a
  fixed batch size is run in chunks of that size;
- a Python class, ``--python module:Class`` (or ``--python path/file.py:Class``, whose file
  is copied into the version), with ``predict_batch(inputs) -> outputs`` and an optional
  ``load(path)`` that gets FILE when one is given (Clipper's container contract, §3).

``add`` writes the model to a scratch store first and runs one batch of zero queries
through it exactly as a worker would; only a model that passes is written as the next
version of NAME (manifest with its sha256), and the command says what it wrote.

Example
-------
::

    keel model add my-net net.pt --input-shape 4 --output-size 3
    keel model add my-rules --python my_rules.py:Rules --input-shape 4 --input-dtype float32
    keel model list
    keel model show my-net --version 1
    keel model rollout deploy/examples/local.toml my-net --version 2   # one worker at a time
    keel model rollback deploy/examples/local.toml my-net              # to the version before

``rollout`` moves a running cluster's workers of one model to another store version one
at a time: each leaves the dispatcher (which hands what it held to the others), loads and
checks the new version with one batch, swaps and registers again; the next worker starts
only once this one is back, and a version a worker refuses stops the rollout there. Replies say which version answered them. The change
is live only: a worker restarted from the spec serves the spec's version again.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from keel.common.modelstore import DEFAULT_STORE, Manifest, ModelStore, ModelStoreError


class ModelAddError(ValueError):
    """A model that cannot be added as given: the message says why."""


def _shape(text: str) -> list[int]:
    try:
        shape = [int(d) for d in text.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want sizes like 4 or 3,32,32") from None
    if not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be > 0")
    return shape


def _export_shape(path: Path) -> tuple[list[int] | None, int | None]:
    """(the query shape, the fixed batch size or None) of a ``.pt2`` program's one input."""
    import torch

    program = torch.export.load(str(path))
    names = set(program.graph_signature.user_inputs)
    inputs = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]
    if len(inputs) != 1 or inputs[0].meta.get("val") is None:
        raise ModelAddError(f"{path}: a program with one tensor input is served; this one has {len(inputs)}")
    dims = list(inputs[0].meta["val"].shape)
    static = [d if isinstance(d, int) else None for d in dims]
    return (static[1:] if all(d is not None for d in static[1:]) else None), static[0]


def detect_format(path: str | None, python: str | None) -> str:
    if python:
        return "python"
    if path is None:
        raise ModelAddError("give the model FILE (TorchScript or .pt2), or --python module:Class")
    return "export" if str(path).endswith(".pt2") else "torchscript"


def add_model(store: str, name: str, path: str | None, *, python: str | None = None,
              input_shape: list[int] | None = None, input_dtype: str = "float32",
              output_size: int | None = None, dataset: str | None = None) -> Manifest:
    """Check the model by running one batch, then write it as the next version of ``name``."""
    from keel.common.containers import check, store_predictor
    from keel.common.spec.tables import NAME

    if not NAME.match(name):
        raise ModelAddError(f"model name {name!r}: letters, digits, '_', '.', '-' (a spec names it so)")
    fmt = detect_format(path, python)
    if path is not None and not Path(path).is_file():
        raise ModelAddError(f"{path}: no such file")
    try:
        import numpy as np

        np.dtype(input_dtype)
    except TypeError:
        raise ModelAddError(f"--input-dtype {input_dtype!r} is not a numpy dtype") from None
    static_batch = None
    if fmt == "export":
        traced_shape, static_batch = _export_shape(Path(path))
        if input_shape is None:
            input_shape = traced_shape
        elif traced_shape is not None and input_shape != traced_shape:
            raise ModelAddError(f"--input-shape {input_shape} but the program was traced with {traced_shape}")
    if input_shape is None:
        raise ModelAddError("--input-shape is needed (one query's shape, e.g. 4 or 1,28,28)")
    fields: dict[str, Any] = dict(input_shape=list(input_shape), input_dtype=input_dtype,
                                  output_size=output_size or 1, static_batch=static_batch, dataset=dataset)
    with tempfile.TemporaryDirectory(prefix="keel-model-check-") as scratch:
        try:
            trial = ModelStore(scratch).add(name, path, fmt, entry=python, **fields)
            outputs = check(store_predictor(scratch, name, trial.version), list(input_shape), input_dtype)
        except (ModelStoreError, ImportError, OSError, RuntimeError, ValueError) as exc:
            raise ModelAddError(f"{name}: the check batch failed: {exc}") from None
    if output_size is not None and outputs.shape[1] != output_size:
        raise ModelAddError(f"--output-size {output_size} but the model answers {outputs.shape[1]} values per query")
    fields["output_size"] = int(outputs.shape[1])
    return ModelStore(store).add(name, path, fmt, entry=python, **fields)


def describe(manifest: Manifest, store: ModelStore) -> str:
    folder = store.folder(manifest)
    what = manifest.entry if manifest.format == "python" else manifest.format
    lines = [f"added {manifest.name} version {manifest.version} ({what}): input {manifest.input_shape} "
             f"{manifest.input_dtype}, output {manifest.output_size}"]
    if manifest.weights:
        lines.append(f"  {folder / manifest.weights}  sha256 {manifest.sha256}")
    if manifest.container_sha256:
        lines.append(f"  {folder / 'container.py'}  sha256 {manifest.container_sha256}")
    lines.append(f"  {folder / 'manifest.json'}")
    return "\n".join(lines)


def _fail(msg: str) -> int:
    print(f"keel: {msg}", file=sys.stderr)
    return 1


def cmd_add(args: argparse.Namespace) -> int:
    try:
        manifest = add_model(args.store, args.name, args.file, python=args.python, input_shape=args.input_shape,
                             input_dtype=args.input_dtype, output_size=args.output_size)
    except (ModelAddError, ModelStoreError) as exc:
        return _fail(str(exc))
    print(describe(manifest, ModelStore(args.store)))
    return 0


def rows(store: ModelStore) -> list[dict[str, Any]]:
    out = []
    for name in store.models():
        latest = store.manifest(name)
        out.append({"model": name, "versions": ",".join(store.versions(name)), "latest": latest.version,
                    "format": latest.format, "input": f"{latest.input_shape} {latest.input_dtype}",
                    "output": latest.output_size, "created": latest.created})
    return out


def cmd_list(args: argparse.Namespace) -> int:
    from keel.deploy.supervisor import format_table

    store = ModelStore(args.store)
    table = rows(store)
    if args.json:
        print(orjson.dumps(table, option=orjson.OPT_INDENT_2).decode())
    elif not table:
        print(f"no models in {store.root}")
    else:
        print(format_table(table))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = ModelStore(args.store)
    try:
        manifest = store.manifest(args.name, args.version)
    except ModelStoreError as exc:
        return _fail(str(exc))
    print(manifest.to_json().decode())
    print(f"versions: {', '.join(store.versions(args.name))}; folder {store.folder(manifest)}")
    return 0


class RolloutError(RuntimeError):
    """A rollout stopped: a worker refused the version or did not come back."""


def configure_version(endpoint: str, version: str, timeout_s: float, model: str | None = None,
                      ctx: Any = None) -> dict | None:
    """Ask the worker whose status endpoint is ``endpoint`` to serve ``version``; the status
    it answers with. ``ctx``:
    the ZeroMQ context to use (default the process's; the chaos harness passes one made
    inside a network namespace)."""
    from keel.common import protocol, transport

    return transport.ask(endpoint, protocol.Configure(version=version, model=model), timeout_s, ctx)


def model_workers(spec: Any, model: str) -> list[Any]:
    workers = [s for s in spec.role("worker") if s.config.model == model and s.config.role == "deployed"]
    if not workers:
        raise RolloutError(f"no workers serve model {model!r} in this spec (models: {sorted(spec.models)})")
    return workers


def served_versions(spec: Any, model: str, ctx: Any = None) -> dict[str, str | None]:
    """Worker name -> the version it serves now (None: no answer)."""
    from keel.common.transport import request_status

    return {w.name: (request_status(w.config.status_endpoint, 2.0, ctx=ctx) or {}).get("version")
            for w in model_workers(spec, model)}


def rollout(spec: Any, model: str, version: str | None, timeout_s: float = 60.0, log: Any = print,
            ctx: Any = None) -> str:
    """Move every deployed worker of ``model`` to store ``version`` (None: latest), one at a
    time; returns the version. Raises ``RolloutError`` where it stopped. ``ctx``: as for
    ``configure_version``."""
    from keel.common.transport import request_status
    from keel.common.waiting import wait_until

    workers = model_workers(spec, model)
    store_name = workers[0].config.store_name or model
    version = ModelStore(spec.store).resolve(store_name, version)
    dispatcher = spec.service("dispatcher").config.worker_endpoint
    for w in workers:
        info = configure_version(w.config.status_endpoint, version, timeout_s, ctx=ctx)
        if info is None:
            raise RolloutError(f"{w.name} did not answer within {timeout_s:g} s; stopped there")
        if info.get("refused"):
            raise RolloutError(f"{w.name} refused version {version}: {info['refused']}; stopped there, "
                               "the others serve what they served")

        def back() -> bool:
            seen = request_status(dispatcher, 1.0, ctx=ctx)
            return bool(seen) and w.name in seen.get("workers", {})

        if not wait_until(back, timeout_s, 0.05):
            raise RolloutError(f"{w.name} serves version {version} but did not register again within {timeout_s:g} s")
        log(f"{w.name}: serving {model} version {info.get('version')}")
    for fe in spec.role("frontend"):  # the frontends key their caches by the version served
        if not tell_frontend(fe.config, model, version, timeout_s, ctx):
            raise RolloutError(f"every worker serves version {version}, but frontend {fe.name} did not take it")
    return version


def tell_frontend(cfg: Any, model: str, version: str, timeout_s: float, ctx: Any = None) -> bool:
    """Tell the frontend of ``cfg`` that ``model``'s workers serve ``version``: on its
    prediction endpoint (its clients' port refuses control messages), then wait until its
    status says so."""
    import zmq

    from keel.common import protocol, transport
    from keel.common.waiting import wait_until

    push = transport.make_socket(ctx or zmq.Context.instance(), zmq.PUSH, connect=cfg.prediction_endpoint)
    try:
        transport.send(push, protocol.Configure(version=version, model=model), flags=zmq.NOBLOCK)
    except zmq.Again:
        return False
    finally:
        push.close(int(timeout_s * 1000))

    def taken() -> bool:
        info = transport.request_status(cfg.client_endpoint, 1.0, ctx=ctx) or {}
        return (info.get("serving") or {}).get(model) == version

    return bool(wait_until(taken, timeout_s, 0.05))


def previous_version(spec: Any, model: str, ctx: Any = None) -> str:
    """The store version just before the one the model's workers serve."""
    served = {v for v in served_versions(spec, model, ctx).values() if v is not None}
    if len(served) != 1:
        raise RolloutError(f"workers of {model} serve {sorted(served) or 'nothing that answers'}; "
                           "give --version to roll back to")
    store_name = model_workers(spec, model)[0].config.store_name or model
    versions = ModelStore(spec.store).versions(store_name)
    current = served.pop()
    earlier = [v for v in versions if int(v) < int(current)]
    if not earlier:
        raise RolloutError(f"{model} serves version {current}, the first in the store: nothing to roll back to")
    return earlier[-1]


def cmd_rollout(args: argparse.Namespace) -> int:
    from keel.common.spec import SpecError, load_spec

    from keel.common.curve import use_for_spec

    try:
        spec = load_spec(args.spec)
        use_for_spec(spec)
        version = args.version
        if args.model_command == "rollback" and version is None:
            version = previous_version(spec, args.model)
        done = rollout(spec, args.model, version, args.timeout)
    except (SpecError, ModelStoreError, RolloutError) as exc:
        return _fail(str(exc))
    print(f"{args.model}: every worker serves version {done}")
    return 0


def add_parser(subparsers: Any) -> None:
    """Add ``model`` (add, list, show) to the ``keel`` parser."""
    p = subparsers.add_parser("model", help="bring your own model: add, list and show model store versions")
    which = p.add_subparsers(dest="model_command", required=True)
    store = dict(default=DEFAULT_STORE, help="model store folder (default: %(default)s)")

    a = which.add_parser("add", help="check a model by running one batch, then store it as a new version")
    a.add_argument("name", help="the model's name (queries use it)")
    a.add_argument("file", nargs="?", help="TorchScript file, torch.export .pt2, or what --python's load(path) reads")
    a.add_argument("--python", metavar="MODULE:CLASS", help="a Python container class (module:Class or file.py:Class)")
    a.add_argument("--input-shape", type=_shape, help="one query's shape, e.g. 4 or 1,28,28 (a .pt2 gives its own)")
    a.add_argument("--input-dtype", default="float32", help="the queries' dtype (default: %(default)s)")
    a.add_argument("--output-size", type=int, help="values per answer (default: what the check batch returns)")
    a.add_argument("--store", **store)
    a.set_defaults(func=cmd_add)

    a = which.add_parser("list", help="models in the store, their versions and formats")
    a.add_argument("--store", **store)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_list)

    a = which.add_parser("show", help="one version's manifest")
    a.add_argument("name")
    a.add_argument("--version", default=None, help="default: the latest")
    a.add_argument("--store", **store)
    a.set_defaults(func=cmd_show)

    for command, what in (("rollout", "roll a running cluster's workers of MODEL to a version, one at a time"),
                          ("rollback", "roll MODEL's workers back to the version before the one they serve")):
        a = which.add_parser(command, help=what)
        a.add_argument("spec", help="the cluster spec the cluster runs")
        a.add_argument("model")
        a.add_argument("--version", default=None,
                       help="store version (rollout default: latest; rollback default: the one before)")
        a.add_argument("--timeout", type=float, default=60.0, help="seconds per worker (default 60)")
        a.set_defaults(func=cmd_rollout)
