"""``keel model add | list | show | remove | rollout | rollback``: bring your own model
into the model store, and move a running cluster between its versions.

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
version of NAME (manifest with its signature and sha256), and the command says what it
wrote. ``--input NAME:DTYPE:SHAPE`` (repeatable, ``common.signature``) names a model's
inputs; its outputs' names, dtypes and shapes come from the check batches
(``common.named_containers``). ``--input-shape`` stays the one-input shorthand.

Example
-------
::

    keel model add my-net net.pt --input-shape 4 --output-size 3
    keel model add my-rules --python my_rules.py:Rules --input-shape 4 --input-dtype float32
    keel model add rec rec.pt --input dense:float32:13 --input ids:int64:1..40 --input ids_mask:bool:mask=ids
    keel model list
    keel model show my-net --version 1
    keel model rollout deploy/examples/local.toml my-net --version 2   # one worker at a time
    keel model rollback deploy/examples/local.toml my-net              # to the version before
    keel model remove my-net 2                                         # refused while a cluster serves it

``rollout`` moves a running cluster's workers of one model to another store version one
at a time: each leaves the dispatcher (which hands what it held to the others), loads and
checks the new version with one batch, swaps and registers again; the next worker starts
only once this one is back, and a version a worker refuses stops the rollout there.
Replies say which version answered them. The version is recorded in the spec's run_dir
(``served.json``, which ``keel status`` shows) and written into the config files ``keel up``
gave the programs there, so a worker that supervisord restarts serves it too, and a later
``keel up`` keeps it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from keel.common.modelstore import DEFAULT_STORE, Manifest, ModelStore, ModelStoreError
from keel.common.model_add import ModelAddError, _shape, add_model, describe, detect_format  # noqa: F401
from keel.deploy.rollout import (RolloutError, configure_version, model_workers, previous_version,  # noqa: F401
                                 rollout, served_versions)


def _fail(msg: str) -> int:
    print(f"keel: {msg}", file=sys.stderr)
    return 1


def cmd_add(args: argparse.Namespace) -> int:
    try:
        manifest = add_model(args.store, args.name, args.file, python=args.python, input_shape=args.input_shape,
                             input_dtype=args.input_dtype, output_size=args.output_size, inputs=args.input)
    except (ModelAddError, ModelStoreError) as exc:
        return _fail(str(exc))
    print(describe(manifest, ModelStore(args.store)))
    if args.publish:
        return _publish(args.store, manifest.name, manifest.version, args.publish)
    return 0


def _publish(store: str, name: str, version: str | None, targets: list[str]) -> int:
    """Publish one version to store services: each target an endpoint, or a spec whose
    ``[store]`` replicas get it."""
    from keel.common.modelfetch import StoreRefused, StoreUnreachable, publish_all
    from keel.common.spec import SpecError, load_spec
    from keel.deploy.keys_cli import use_for_spec

    endpoints = []
    try:
        for target in targets:
            if "://" in target:
                endpoints.append(target)
                continue
            spec = load_spec(target)
            use_for_spec(spec)  # with CURVE on, as the spec's operator
            endpoints += [s.config.endpoint for s in spec.role("store")]
        if not endpoints:
            return _fail(f"{', '.join(targets)}: no store service to publish to (a spec needs a [store] table)")
        manifest = publish_all(endpoints, ModelStore(store), name, version)
    except (SpecError, ModelStoreError, StoreRefused, StoreUnreachable) as exc:
        return _fail(f"publish {name}: {exc}")
    print(f"published {name} version {manifest.version} to {', '.join(endpoints)}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    return _publish(args.store, args.name, args.version, args.to)


def cmd_fetch(args: argparse.Namespace) -> int:
    """Fetch a version into this host's store as a worker would (e.g. to fill a store before
    a start): every file checked, a damaged transfer refused and tried again."""
    from keel.common import logs
    from keel.common.modelfetch import StoreUnreachable, ensure

    log = logs.setup("keel-model-fetch")
    try:
        manifest = ensure(ModelStore(args.store), args.name, args.version, args.source, log=log.info,
                          deadline_s=args.timeout)
    except (StoreUnreachable, ModelStoreError) as exc:
        return _fail(f"fetch {args.name}: {exc}")
    print(f"fetched {args.name} version {manifest.version} into {args.store}")
    return 0


def _inputs_text(manifest: Manifest) -> str:
    """The list's input column: as before for one input, else each NAME:DTYPE:SHAPE."""
    try:
        sig = manifest.signature_of()
    except ModelStoreError:
        return f"{manifest.input_shape} {manifest.input_dtype}"
    if sig.is_single:
        return f"{manifest.input_shape} {manifest.input_dtype}"
    return " ".join(s.text() for s in sig.inputs)


def _outputs_text(manifest: Manifest) -> Any:
    try:
        sig = manifest.signature_of()
    except ModelStoreError:
        return manifest.output_size
    return manifest.output_size if sig.is_single else " ".join(s.text() for s in sig.outputs)


def rows(store: ModelStore) -> list[dict[str, Any]]:
    out = []
    for name in store.models():
        latest = store.manifest(name)
        out.append({"model": name, "versions": ",".join(store.versions(name)), "latest": latest.version,
                    "format": latest.format, "input": _inputs_text(latest),
                    "output": _outputs_text(latest), "created": latest.created})
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
    try:
        print(f"signature{'' if manifest.signature is not None else ' (from input_shape, input_dtype, output_size)'}:\n"
              f"{manifest.signature_of().describe()}")
    except ModelStoreError as exc:
        print(f"signature: {exc}")
    print(f"versions: {', '.join(store.versions(args.name))}; folder {store.folder(manifest)}")
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from keel.common.curve import CurveError, use_for_spec
    from keel.common.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
        use_for_spec(spec)
        version = args.version
        if args.model_command == "rollback" and version is None:
            version = previous_version(spec, args.model)
        done = rollout(spec, args.model, version, args.timeout, profile=not args.no_profile)
    except (SpecError, CurveError, ModelStoreError, RolloutError) as exc:
        return _fail(str(exc))
    if Path(spec.run_dir).is_dir():  # a cluster started from this spec keeps its record there
        from keel.deploy.programs import record_served

        record_served(spec, {args.model: done}, f"model {args.model_command}")
    print(f"{args.model}: every worker serves version {done}")
    return 0


def serving_clusters(store: ModelStore, name: str, version: str, specs: list[str]) -> list[str]:
    """Running clusters that serve ``version`` of store model ``name``, each said as a
    phrase: those of ``specs`` (their workers asked, and their record) and every cluster
    whose run_dir is under ``./runs`` (its record of served versions, ``deploy.programs``)."""
    from keel.deploy.keys_cli import use_for_spec
    from keel.common.spec import load_spec
    from keel.deploy.programs import read_served
    from keel.deploy.supervisor import is_up

    root = store.root.resolve()
    found: dict[Path, str] = {}  # run_dir -> the phrase
    for source in specs:
        spec = load_spec(source)
        use_for_spec(spec)
        for model, table in spec.models.items():
            if (table.get("store_name") or model) == name and Path(spec.store).resolve() == root:
                live = sorted(w for w, v in served_versions(spec, model, timeout_s=1.0).items() if v == version)
                if live:
                    found[Path(spec.run_dir)] = f"the cluster of {source} ({', '.join(live)})"
    # the records too: a spec's workers may not have answered in time
    run_dirs = [Path(load_spec(s).run_dir) for s in specs] + [p.absolute() for p in sorted(Path("runs").glob("*"))]
    for run_dir in dict.fromkeys(run_dirs):
        records = [m for m, r in read_served(run_dir).items() if r.get("store_name") == name
                   and r.get("version") == version and Path(r.get("store", "")).resolve() == root]
        if records and run_dir not in found and is_up(run_dir):
            found[run_dir] = f"the cluster running in {run_dir} (model {', '.join(records)})"
    return list(found.values())


def cmd_remove(args: argparse.Namespace) -> int:
    from keel.common.curve import CurveError
    from keel.common.spec import SpecError

    store = ModelStore(args.store)
    try:
        version = store.resolve(args.name, args.version)
        serving = serving_clusters(store, args.name, version, args.spec or [])
    except (ModelStoreError, SpecError, CurveError) as exc:
        return _fail(str(exc))
    if serving and not args.force:
        return _fail(f"{args.name} version {version} is served by {'; '.join(serving)}: roll it to another version "
                     "first (keel model rollout SPEC MODEL --version V), or give --force")
    folder = store.remove(args.name, version)
    left = store.versions(args.name)
    print(f"removed {args.name} version {version} ({folder}); versions left: {', '.join(left) or 'none'}")
    if serving:
        print(f"still served by {'; '.join(serving)}: a worker restarted there cannot load it")
    return 0


def add_parser(subparsers: Any) -> None:
    """Add ``model`` (add, list, show, remove, rollout, rollback) to the ``keel`` parser."""
    p = subparsers.add_parser("model", help="bring your own model: add, list, show and remove store versions; "
                              "roll a running cluster out or back")
    which = p.add_subparsers(dest="model_command", required=True)
    store = dict(default=DEFAULT_STORE, help="model store folder (default: %(default)s)")

    a = which.add_parser("add", help="check a model by running one batch, then store it as a new version")
    a.add_argument("name", help="the model's name (queries use it)")
    a.add_argument("file", nargs="?", help="TorchScript file, torch.export .pt2, or what --python's load(path) reads")
    a.add_argument("--python", metavar="MODULE:CLASS", help="a Python container class (module:Class or file.py:Class)")
    a.add_argument("--input", action="append", metavar="NAME:DTYPE:SHAPE",
                   help="a named input, in the order the model takes them (repeatable): e.g. dense:float32:13, "
                        "ids:int64:1..40 (a variable dim and its bounds; -1: bounded by the payload limit), "
                        "text:bytes:scalar, ids_mask:bool:mask=ids (filled by the batcher); a .pt2 gives its own")
    a.add_argument("--input-shape", type=_shape, help="one query's shape, e.g. 4 or 1,28,28: one input named "
                   "'input' (a .pt2 gives its own)")
    a.add_argument("--input-dtype", default="float32", help="the queries' dtype (default: %(default)s)")
    a.add_argument("--output-size", type=int, help="values per answer (default: what the check batch returns)")
    a.add_argument("--store", **store)
    a.add_argument("--publish", action="append", metavar="ENDPOINT|SPEC",
                   help="then publish it to a store service (an endpoint, or a spec's [store] replicas; repeatable)")
    a.set_defaults(func=cmd_add)

    a = which.add_parser("publish", help="send one version to store services, whose hosts' workers fetch it")
    a.add_argument("name")
    a.add_argument("--version", default=None, help="default: the latest")
    a.add_argument("--to", action="append", required=True, metavar="ENDPOINT|SPEC",
                   help="a store service endpoint, or a spec whose [store] replicas get it (repeatable)")
    a.add_argument("--store", **store)
    a.set_defaults(func=cmd_publish)

    a = which.add_parser("fetch", help="copy one version from a store service into this host's store, checked")
    a.add_argument("name")
    a.add_argument("--version", default=None, help="default: the latest")
    a.add_argument("--from", dest="source", action="append", required=True, metavar="ENDPOINT",
                   help="a store service endpoint (repeatable: replicas)")
    a.add_argument("--timeout", type=float, default=60.0, help="seconds to keep trying (default 60)")
    a.add_argument("--store", **store)
    a.set_defaults(func=cmd_fetch)

    a = which.add_parser("list", help="models in the store, their versions and formats")
    a.add_argument("--store", **store)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_list)

    a = which.add_parser("show", help="one version's manifest and signature")
    a.add_argument("name")
    a.add_argument("--version", default=None, help="default: the latest")
    a.add_argument("--store", **store)
    a.set_defaults(func=cmd_show)

    a = which.add_parser("remove", help="delete one version from the store (refused while a running cluster "
                         "serves it, unless --force)")
    a.add_argument("name")
    a.add_argument("version", help="the version to remove (a number; its number is never given again)")
    a.add_argument("--spec", action="append", metavar="SPEC",
                   help="a cluster spec whose running cluster to check too (repeatable; the clusters with a "
                        "run_dir under ./runs are always checked)")
    a.add_argument("--force", action="store_true", help="remove it even while a running cluster serves it")
    a.add_argument("--store", **store)
    a.set_defaults(func=cmd_remove)

    for command, what in (("rollout", "roll a running cluster's workers of MODEL to a version, one at a time"),
                          ("rollback", "roll MODEL's workers back to the version before the one they serve")):
        a = which.add_parser(command, help=what)
        a.add_argument("spec", help="the cluster spec the cluster runs")
        a.add_argument("model")
        a.add_argument("--version", default=None,
                       help="store version (rollout default: latest; rollback default: the one before)")
        a.add_argument("--timeout", type=float, default=60.0, help="seconds per worker (default 60)")
        a.add_argument("--no-profile", action="store_true",
                       help="a model SERF manages whose version has no profile stays held (its configuration "
                            "kept) instead of being profiled through the cluster after the switch")
        a.set_defaults(func=cmd_rollout)
