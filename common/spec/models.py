"""``[models.NAME]`` of a cluster spec resolved against the model store: every option
filled in, store-backed shapes and parity models found, placement and ParM mode read.

Serving options are checked by the config dataclasses themselves (``ModelInfo`` and
``BatchPolicy`` ``validate()``); a ``ConfigError`` is reported under the model's key
path (``models.m.deadline_ms: must be > 0``).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from keel.common import config as cfg
from keel.common.modelstore import ModelStoreError
from keel.common.spec.gpus import check_device_option, read_gpus
from keel.common.spec.pools import read_kairos, read_pools
from keel.common.spec.tables import NAME, SpecError, Table, fail, options

MODES = ("none", "equal", "parm")
#: the keys of a resolved model that make its ModelInfo (frontend) and BatchPolicy (dispatcher)
INFO_KEYS = ("input_shape", "output_size", "input_dtype", "version", "default_output", "deadline_ms", "signature")
#: the emulated SERF host's keys (``read_serf_host``)
SERF_HOST_KEYS = ("serf_host", "base_ms", "speedup", "interference")
POLICY_KEYS = ("batch_budget_ms", "max_batch", "fixed_batch", "batch_delay_ms", "aimd_step", "aimd_backoff", "ragged",
               "bucket_width")


def model_info(model: dict[str, Any]) -> dict[str, Any]:
    """The frontend's ``ModelInfo`` options of a resolved model."""
    return {k: model[k] for k in INFO_KEYS}


def batch_policy(model: dict[str, Any]) -> dict[str, Any]:
    """The dispatcher's ``BatchPolicy`` options of a resolved model (coding on in mode parm)."""
    out = {k: model[k] for k in POLICY_KEYS}
    if model.get("mode") == "parm":
        out.update(k=model["k"], parity_model=model["parity_model"])
    return out


def parm_refusal(signature: dict) -> str:
    """Why ParM cannot code a model of this signature (``Signature.to_dict``): the encoder
    sums the k batches of a coding group, which means something for floating inputs only."""
    kinds = {s["name"]: s["dtype"] for s in signature.get("inputs", []) if not s.get("mask_for")}
    other = [f"{n} ({d})" for n, d in kinds.items() if not d.startswith(("float", "bfloat"))]
    if other:
        return (f"ParM cannot code this model: its input(s) {', '.join(other)} are not floating point; a parity "
                "batch is the sum of k query batches, and a sum of ids, flags or bytes is no input the parity model "
                "can learn from. Serve it without k, or with mode = \"equal\" for the extra workers")
    return ("ParM codes one floating input; encoding each of several named inputs (variable dims padded to the "
            "group's largest) is not wired yet. Serve it without k")


def read_serf_host(t: Table, builtin: str | None) -> dict[str, Any] | None:
    """The emulated SERF host's curves of a ``builtin = "serf_host"`` model
    (``common.serf_host``): a preset (``serf_host`` = "small" or "large") and any of
    ``base_ms``, ``speedup``, ``interference`` given in its place."""
    if builtin != "serf_host":
        for key in SERF_HOST_KEYS:
            if t.has(key):
                fail(t.key(key), 'only used with builtin = "serf_host"')
        return None
    from keel.common.serf_host import SerfHostError, curves

    given = {"preset": t.take("serf_host", str, None), "base_ms": t.take("base_ms", float, None),
             "speedup": t.take("speedup", list[float], None), "interference": t.take("interference", list[float], None)}
    try:
        return curves(**given)
    except SerfHostError as exc:
        key = next((k for k in ("speedup", "interference", "base_ms") if k in str(exc)), "serf_host")
        raise SpecError(f"{t.key(key)}: {exc}") from None


def _validated(t: Table, model: str, make: Callable[[], Any]) -> None:
    """Build a config object and validate it, reporting its error under ``t``'s path."""
    try:
        make().validate(model)
    except cfg.ConfigError as exc:
        if exc.key is None:
            raise SpecError(f"{t.path}: {exc}") from None
        fail(t.key(exc.key), exc.reason)


def read_model(model: str, t: Table, mstore: Any, all_hosts: list[str],
               hosts_of: Callable[[Table, str, list[str]], list[str]],
               pool_prices: dict[str, float] | None = None, host_gpus: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The resolved table of one ``[models.NAME]``: every option filled, checked, store-backed.
    ``mstore``: where manifests come from (``common.modelfetch.Manifests``: the local store,
    else the store service); ``pool_prices``: the root ``[pools.TYPE] price`` overrides
    (``common.spec.pools``); ``host_gpus``: the GPUs each host lists (``common.spec.gpus``)."""
    if not NAME.match(model):
        fail(t.path, "model names must be letters, digits, '_', '.', '-'")
    out: dict[str, Any] = {}
    builtin = out["builtin"] = t.take("builtin", str, None)
    if builtin not in (None, "noop", "sleep", "kairos", "serf_host"):
        fail(t.key("builtin"), f'must be "noop", "sleep", "kairos" or "serf_host", got {builtin!r}')
    out.update(read_kairos(t, builtin))
    host = read_serf_host(t, builtin)
    if builtin and t.has("store_name"):
        fail(t.key("store_name"), "a builtin model has no store_name; give one or the other")
    out["store_name"] = t.take("store_name", str, None if builtin else model)
    version = t.take("version", str | int, None)
    version = None if version is None else str(version)
    # a pinned version is the spec's to keep; an open one follows rollouts (deploy.programs)
    out["version_pinned"] = version is not None
    shape = t.take("input_shape", list[int], None)
    output_size = t.take("output_size", int, None)
    dtype = t.take("input_dtype", str, None)
    for key in ("fixed_ms", "per_query_ms"):
        out[key] = t.take(key, float, 0.0)
        if t.has(key) and builtin in ("noop", "kairos", "serf_host"):
            fail(t.key(key), f'the builtin "{builtin}" model has no cost to set')
        if out[key] < 0:
            fail(t.key(key), "must be >= 0")
    if builtin:
        # kairos: one feature per row, the query's batch size (items)
        default_shape, default_size = ([1], 1) if builtin == "kairos" else ([64], 10)
        out.update(version="1", input_shape=shape or default_shape, output_size=output_size or default_size,
                   input_dtype=dtype or "float32")
    else:
        try:
            manifest = mstore.manifest(out["store_name"], version)
        except ModelStoreError as exc:
            key = "version" if mstore.has(out["store_name"]) else "store_name"
            raise SpecError(f"{t.key(key)}: {exc}") from None
        signature = manifest.signature_of() if manifest.signature is not None else None  # common.signature
        if signature is not None and not signature.is_single:
            out["signature"] = signature.to_dict()  # named tensors: checked and batched by it
        for key, given, stored in (("input_shape", shape, manifest.input_shape), ("output_size", output_size, manifest.output_size),
                                   ("input_dtype", dtype, manifest.input_dtype)):
            if given is not None and given != stored:
                fail(t.key(key), f"{given!r} but store model {manifest.name}/{manifest.version} has {stored!r}")
        out.update(version=manifest.version, input_shape=list(manifest.input_shape), output_size=manifest.output_size,
                   input_dtype=manifest.input_dtype)

    # serving: the frontend's deadline default and the dispatcher's batching
    out["deadline_ms"] = t.take("deadline_ms", float, cfg.ModelInfo.deadline_ms)
    out["batch_budget_ms"] = t.take("batch_budget_ms", float,
                                    out["deadline_ms"] if t.has("deadline_ms") else cfg.BatchPolicy.batch_budget_ms)
    out["max_batch"] = t.take("max_batch", int, cfg.BatchPolicy.max_batch)
    out["fixed_batch"] = t.take("fixed_batch", int, None)
    out["batch_delay_ms"] = t.take("batch_delay_ms", float, cfg.BatchPolicy.batch_delay_ms)
    out["aimd_step"] = t.take("aimd_step", int, cfg.BatchPolicy.aimd_step)
    out["aimd_backoff"] = t.take("aimd_backoff", float, cfg.BatchPolicy.aimd_backoff)
    default = t.take("default_output", list[float], None)
    out["default_output"] = None if default is None else [float(v) for v in default]
    out.setdefault("signature", None)
    if out["default_output"] is not None and out["signature"] is not None:
        fail(t.key("default_output"), "a model with named outputs has no default output (one flat vector) yet")
    # a named model's batching of variable shapes (common.ragged; the worker pads)
    out["ragged"] = t.take("ragged", str, cfg.BatchPolicy.ragged)
    out["bucket_width"] = t.take("bucket_width", int, cfg.BatchPolicy.bucket_width)
    _validated(t, model, lambda: cfg.ModelInfo(**model_info(out)))
    _validated(t, model, lambda: cfg.BatchPolicy(**batch_policy(out)))
    # Relation: AIMD grows a batch while its service time stays under the budget; a
    # budget beyond the deadline lets batches grow until every query in them is late.
    if out["batch_budget_ms"] > out["deadline_ms"]:
        fail(t.key("batch_budget_ms"), f"must be <= deadline_ms ({out['deadline_ms']:g})")

    # placement and ParM
    # Kairos: one (instance type, price) per worker of a heterogeneous pool, or None
    out["pool"] = read_pools(t, out, pool_prices or {})
    out["hosts"] = hosts_of(t, "hosts", all_hosts)
    out["parity_hosts"] = hosts_of(t, "parity_hosts", out["hosts"])
    read_gpus(t, out, host_gpus or {})  # placed on GPUs: a worker per GPU slot unless workers says
    out["workers"] = len(out["pool"]) if out["pool"] else t.take("workers", int, len(out["gpu_slots"] or [None]))
    if out["workers"] < 1:
        fail(t.key("workers"), "must be >= 1")
    k = out["k"] = t.take("k", int, 0)
    if k == 1 or k < 0:
        fail(t.key("k"), "must be 0 or >= 2")
    mode = out["mode"] = t.take("mode", str, "parm" if k else "none")
    if mode not in MODES:
        fail(t.key("mode"), f"must be one of {list(MODES)}, got {mode!r}")
    if mode == "none" and k:
        fail(t.key("mode"), f'"none" with k = {k}; set mode = "parm" or "equal", or drop k')
    if mode != "none" and not k:
        fail(t.key("k"), f'mode "{mode}" needs k >= 2')
    if mode == "parm" and out["signature"] is not None:
        fail(t.key("k"), parm_refusal(out["signature"]))
    if mode != "none" and out["pool"]:
        fail(t.key("pools"), f'mode "{mode}" with pools: which instance type would the extra workers be? Not supported')
    # ParM §6.1: m/k parity workers; Equal-Resources gets as many extra deployed ones
    out["parity_workers"] = math.ceil(out["workers"] / k) if k else 0
    out["encoder"] = t.take("encoder", str, "add")
    if out["encoder"] not in ("add", "concat"):
        fail(t.key("encoder"), f'must be "add" or "concat", got {out["encoder"]!r}')
    out["parity_model"] = f"{model}-parity" if mode == "parm" else None
    out["parity_store_name"] = t.take("parity_store_name", str, None)
    out["parity_version"] = t.take("parity_version", str, None)
    for key in ("parity_store_name", "parity_version", "parity_hosts"):
        if t.has(key) and mode != "parm":
            fail(t.key(key), 'only used with mode = "parm"')
    if mode == "parm" and not builtin:
        key = "parity_store_name" if t.has("parity_store_name") else "k"
        out["parity_store_name"] = out["parity_store_name"] or f"{out['store_name']}-parity"
        try:
            pm = mstore.manifest(out["parity_store_name"], out["parity_version"])
        except ModelStoreError as exc:
            raise SpecError(f"{t.key(key)}: parity model: {exc}") from None
        for key, value in (("k", k), ("encoder", out["encoder"])):
            trained = (pm.parity or {}).get(key)
            if trained is not None and trained != value:
                fail(t.key(key), f"{value!r} but parity model {pm.name}/{pm.version} was trained for {key} = {trained!r}")
        out["parity_version"] = pm.version
    out["worker_options"] = options("worker", Table(t.take("worker", dict, {}), t.key("worker")))
    check_device_option(t, out)
    if host is not None:
        out["worker_options"]["serf_host"] = host  # the workers' emulated curves, as a worker option
    t.finish()
    return out
