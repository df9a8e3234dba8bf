"""``keel serf profile|table|set SPEC --model M``: SERF's profile, reference table and
a manual switch for a model of a running cluster (``keel up SPEC`` first).

- ``profile``: §IV-B through the cluster (``services.serf.profiler``): the mu table, each
  tuple's SCV, the path overhead and how long profiling took; kept beside the model
  version in the store (``serf_profile.json``) or, for a builtin model, in the spec's run
  folder. A profile of another version is stale: ``table`` says so and asks to reprofile.
- ``table``: the configuration reference table (Eq. 13 per configuration at ten loads up
  to the largest capacity) and how long building it took.
- ``set``: switch the model's workers to ``--slots`` x ``--threads`` live.

To let the dispatcher switch by itself, name the profile in the spec:
``[dispatcher] serf = {M = "PATH"}`` (and share each host's cores between the models
there: ``serf_cores = {HOST = N}``). ``keel model rollout`` of such a model profiles the
new version through the cluster right after the switch when it has no profile yet.

Example
-------
::

    keel serf profile deploy/examples/serf.toml --model resnet18 --cores 2
    keel serf table deploy/examples/serf.toml --model resnet18
"""
from __future__ import annotations

import argparse
import time


def _spec(args: argparse.Namespace):
    from keel.common.spec import load_spec
    from keel.deploy.keys_cli import use_for_spec

    spec = load_spec(args.spec)
    use_for_spec(spec)
    return spec


def _model_version(spec, model: str) -> tuple[str, str, str | None]:
    """(store name, version, store or None for a builtin) of ``model``'s deployed workers."""
    cfg = next((s.config for s in spec.services if s.role == "worker" and s.config.model == model
                and s.config.role == "deployed"), None)
    if cfg is None:
        raise SystemExit(f"keel: the spec has no workers of {model!r}")
    if cfg.builtin:
        return model, "1", None
    return cfg.store_name or model, str(cfg.version or "1"), cfg.store


def model_cores(spec, model: str) -> int:
    """The cores ``model`` is given: an emulated SERF host's own (8), else this machine's 2."""
    cfg = next(s.config for s in spec.services if s.role == "worker" and s.config.model == model)
    return int(cfg.serf_host["cores"]) if cfg.builtin == "serf_host" and cfg.serf_host else 2


def profile_path(spec, model: str):
    from keel.services.serf.profile import where

    name, version, store = _model_version(spec, model)
    return where(name, version, store, spec.run_dir), version


def profile_lines(p) -> list[str]:
    from keel.services.serf.profile import path_bands

    lines = [f"SERF profile of {p.model} v{p.version} ({p.cores} cores): {p.profiling_s:.2f} s to profile, "
             f"path {p.path_ms:.2f} ms" + ("; by rate " + ", ".join(f"{ms:.2f} ms at {r:.0f}/s" for r, ms in path_bands(p.path_points))
                                           if p.path_points else ""),
             f"{'i x t':>7} {'service ms':>11} {'mu /s':>8} {'SCV':>7} {'samples':>8}"]
    for (i, t), ms in sorted(p.service_ms.items()):
        lines.append(f"{i:>3} x {t:<2} {ms:11.2f} {1000 / ms:8.1f} {p.scv.get((i, t), 0):7.3f} {p.samples.get((i, t), 0):8d}")
    return lines


def table_lines(p, rates: list[float] | None = None) -> list[str]:
    configs = p.configurations()
    top = max(p.capacity(c) for c in configs)
    rates = rates or [round(top * f, 2) for f in (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)]
    t0 = time.perf_counter()
    table = p.table(rates)
    ms = (time.perf_counter() - t0) * 1000
    names = ["x".join(map(str, c)) for c in configs]
    lines = [f"reference table of {p.model} v{p.version}: {len(rates)} rates x {len(configs)} configurations "
             f"in {ms:.2f} ms; capacity " + ", ".join(f"{n} {p.capacity(c):.1f}/s" for n, c in zip(names, configs)),
             f"{'rate /s':>9} " + " ".join(f"{n + ' ms':>10}" for n in names) + "   best"]
    for row in table:
        cells = [row["latency_s"].get(c) for c in configs]
        lines.append(f"{row['rate']:9.2f} " + " ".join(f"{'-':>10}" if v is None else f"{v * 1000 + p.path_at(row['rate']):10.2f}"
                                                        for v in cells)
                     + "   " + ("x".join(map(str, row["best"])) if row["best"] else "none stable"))
    return lines


def cmd_profile(args: argparse.Namespace) -> int:
    from keel.services.serf.profile import save
    from keel.services.serf.profiler import ProfileError, profile_model

    spec = _spec(args)
    path, version = profile_path(spec, args.model)
    try:
        p = profile_model(spec, args.model, args.cores or model_cores(spec, args.model), warmup=args.warmup,
                          samples=args.samples, version=version, log=print)
    except ProfileError as exc:
        print(f"keel: {exc}")
        return 1
    save(p, path)
    for line in profile_lines(p):
        print(line)
    print(f"saved {path}")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from keel.services.serf.profile import load

    spec = _spec(args)
    path, version = profile_path(spec, args.model)
    p = load(path, version)
    if p is None:
        print(f"keel: no SERF profile of {args.model} v{version} at {path} (a new version needs one): "
              f"run keel serf profile {args.spec} --model {args.model}")
        return 1
    for line in profile_lines(p) + [""] + table_lines(p, args.rates):
        print(line)
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    from keel.services.serf.profiler import ProfileError, set_configuration

    spec = _spec(args)
    try:
        names = set_configuration(spec.service("dispatcher").config.worker_endpoint, args.model, args.slots, args.threads)
    except ProfileError as exc:
        print(f"keel: {exc}")
        return 1
    print(f"{args.model}: {', '.join(names)} now run {args.slots} request(s) at once x {args.threads} thread(s)")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("serf", help="SERF: profile a model, show its configuration table, switch it")
    which = p.add_subparsers(dest="serf_cmd", required=True)
    s = which.add_parser("profile", help="profile every (requests at once, threads) tuple through the cluster")
    s.add_argument("spec")
    s.add_argument("--model", required=True)
    s.add_argument("--cores", type=int, help="cores the model is given (default: an emulated serf_host's, else 2)")
    s.add_argument("--warmup", type=int, default=5, help="warm-up requests per tuple (default: %(default)s)")
    s.add_argument("--samples", type=int, default=20, help="samples per tuple (default: %(default)s)")
    s.set_defaults(func=cmd_profile)
    s = which.add_parser("table", help="the configuration reference table from the stored profile")
    s.add_argument("spec")
    s.add_argument("--model", required=True)
    s.add_argument("--rates", type=float, nargs="+", help="arrival rates (req/s per worker)")
    s.set_defaults(func=cmd_table)
    s = which.add_parser("set", help="switch the model's workers live")
    s.add_argument("spec")
    s.add_argument("--model", required=True)
    s.add_argument("--slots", type=int, required=True)
    s.add_argument("--threads", type=int, required=True)
    s.set_defaults(func=cmd_set)
