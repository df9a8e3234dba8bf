"""``keel model add``: check a model by running it as a worker would, then write it into the
store as the next version, with its signature.

A model's inputs are the single-input shorthand (``--input-shape``: one input named
``input``, a float32 ``output`` of the size the check batch answers), or named
(``--input NAME:DTYPE:SHAPE`` each, ``common.signature``), or read from a ``.pt2``
program (names, dtypes, and its dims' ranges as bounds). A named model's outputs -- names,
dtypes, shapes, which dims vary -- come from check batches (``common.named_containers``).
``deploy.model_cli`` is the command line around it; Keel's own training adds its models through it too.

Example
-------
>>> add_model("store", "rec", "rec.pt", inputs=["dense:float32:13", "ids:int64:1..40",
...           "ids_mask:bool:mask=ids"])                                     # doctest: +SKIP
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from keel.common.modelstore import Manifest, ModelStore, ModelStoreError


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


def _export_inputs(path: Path) -> tuple[list[Any], int | None]:
    """(a ``TensorSpec`` per user input, the fixed batch size or None) of a ``.pt2`` program:
    names and dtypes as traced, a dim traced as a symbol -1 with the program's range as
    its bounds (the payload limit's default where the range is open)."""
    import torch

    from keel.common.signature import VARIABLE, SignatureError, TensorSpec, default_bound, dtype_name

    program = torch.export.load(str(path))
    names = list(program.graph_signature.user_inputs)
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs, static_batch = [], None
    for name in names:
        val = nodes[name].meta.get("val") if name in nodes else None
        if val is None or not hasattr(val, "shape"):
            raise ModelAddError(f"{path}: input {name!r} is not a tensor; a program with tensor inputs is served")
        dims = list(val.shape)
        if not dims:
            raise ModelAddError(f"{path}: input {name!r} has no batch dim")
        static_batch = dims[0] if isinstance(dims[0], int) else None
        shape, lo, hi = [], [], []
        for d in dims[1:]:
            if isinstance(d, int):
                shape.append(d), lo.append(d), hi.append(d)
                continue
            bounds = program.range_constraints.get(d.node.expr)
            lower = getattr(bounds, "lower", 0)
            upper = getattr(bounds, "upper", None)
            shape.append(VARIABLE)
            lo.append(int(lower) if getattr(lower, "is_finite", True) else 0)
            hi.append(int(upper) if upper is not None and getattr(upper, "is_finite", False) else None)
        try:
            dtype = dtype_name(str(val.dtype).removeprefix("torch."))
            bound = default_bound(dtype, shape)
            specs.append(TensorSpec(name, dtype, tuple(shape), tuple(lo), tuple(bound if h is None else h for h in hi)))
        except SignatureError as exc:
            raise ModelAddError(f"{path}: {exc}") from None
    return specs, static_batch


def _agree(traced: list[Any], given: list[Any], path: str) -> list[Any]:
    """``--input`` for a ``.pt2``: the program's inputs, in its order and dtypes; the given
    specs may bound its variable dims and declare masks."""
    if [s.name for s in given] != [s.name for s in traced]:
        raise ModelAddError(f"--input names {[s.name for s in given]} but {path} takes {[s.name for s in traced]}")
    for g, t in zip(given, traced):
        if g.dtype != t.dtype:
            raise ModelAddError(f"--input {g.name} is {g.dtype} but {path} takes {t.dtype}")
        if g.mask_for is None and (len(g.shape) != len(t.shape) or any(
                td != -1 and gd != td for gd, td in zip(g.shape, t.shape))):
            raise ModelAddError(f"--input {g.text()} does not fit the program's shape {list(t.shape)}")
    return given


def detect_format(path: str | None, python: str | None) -> str:
    if python:
        return "python"
    if path is None:
        raise ModelAddError("give the model FILE (TorchScript or .pt2), or --python module:Class")
    return "export" if str(path).endswith(".pt2") else "torchscript"


def add_model(store: str, name: str, path: str | None, *, python: str | None = None,
              input_shape: list[int] | None = None, input_dtype: str = "float32",
              output_size: int | None = None, dataset: str | None = None,
              inputs: list[str] | None = None, manifest_fields: dict[str, Any] | None = None) -> Manifest:
    """Check the model by running one batch, then write it as the next version of ``name``.
    ``inputs`` (``NAME:DTYPE:SHAPE`` each, ``common.signature``) name its inputs; without
    them ``input_shape`` is the single-input shorthand. ``manifest_fields`` (role, parity,
    metrics, ...) go into the manifest as given: Keel's own training adds its models so."""
    from keel.common.containers import check, store_predictor
    from keel.common.signature import Signature, SignatureError, parse_input
    from keel.common.spec.tables import NAME

    if not NAME.match(name):
        raise ModelAddError(f"model name {name!r}: letters, digits, '_', '.', '-' (a spec names it so)")
    fmt = detect_format(path, python)
    if path is not None and not Path(path).is_file():
        raise ModelAddError(f"{path}: no such file")
    if inputs and input_shape is not None:
        raise ModelAddError("give --input (named inputs) or --input-shape (one input), not both")
    try:
        import numpy as np

        np.dtype(input_dtype)
        Signature.single([], input_dtype)  # a dtype a signature names
    except TypeError:
        raise ModelAddError(f"--input-dtype {input_dtype!r} is not a numpy dtype") from None
    except SignatureError as exc:
        raise ModelAddError(f"--input-dtype: {exc}") from None
    try:
        specs = [parse_input(text) for text in inputs or ()]
    except SignatureError as exc:
        raise ModelAddError(str(exc)) from None
    static_batch = None
    if fmt == "export":
        traced, static_batch = _export_inputs(Path(path))
        if specs:
            specs = _agree(traced, specs, path)
        elif len(traced) == 1 and not traced[0].variable:  # one fixed input: the shorthand, as before
            if input_shape is not None and input_shape != list(traced[0].shape):
                raise ModelAddError(f"--input-shape {input_shape} but the program was traced with {list(traced[0].shape)}")
            input_shape = list(traced[0].shape)
        elif input_shape is not None:
            raise ModelAddError(f"--input-shape {input_shape} but {path} takes "
                                f"{', '.join(s.text() for s in traced)}: give --input for each, or nothing")
        else:
            specs = traced
    if specs:
        return _add_named(store, name, path, fmt, python, specs, static_batch, output_size, dataset,
                          manifest_fields or {})
    if input_shape is None:
        raise ModelAddError("--input-shape is needed (one query's shape, e.g. 4 or 1,28,28), "
                            "or --input NAME:DTYPE:SHAPE for each named input")
    fields: dict[str, Any] = dict(input_shape=list(input_shape), input_dtype=input_dtype,
                                  output_size=output_size or 1, static_batch=static_batch, dataset=dataset,
                                  **(manifest_fields or {}))
    with tempfile.TemporaryDirectory(prefix="keel-model-check-") as scratch:
        try:
            trial = ModelStore(scratch).add(name, path, fmt, entry=python, **fields)
            outputs = check(store_predictor(scratch, name, trial.version), list(input_shape), input_dtype)
        except (ModelStoreError, ImportError, OSError, RuntimeError, ValueError) as exc:
            raise ModelAddError(f"{name}: the check batch failed: {exc}") from None
    if output_size is not None and outputs.shape[1] != output_size:
        raise ModelAddError(f"--output-size {output_size} but the model answers {outputs.shape[1]} values per query")
    fields["output_size"] = int(outputs.shape[1])
    fields["signature"] = Signature.single(input_shape, input_dtype, fields["output_size"]).to_dict()
    return ModelStore(store).add(name, path, fmt, entry=python, **fields)


def _add_named(store: str, name: str, path: str | None, fmt: str, python: str | None, specs: list[Any],
               static_batch: int | None, output_size: int | None, dataset: str | None,
               manifest_fields: dict[str, Any]) -> Manifest:
    """``add_model`` for named inputs: the outputs' names, dtypes and shapes come from
    check batches (``common.named_containers.infer_outputs``)."""
    from keel.common.containers import store_predictor
    from keel.common.named_containers import infer_outputs
    from keel.common.signature import Signature, SignatureError

    if output_size is not None:
        raise ModelAddError("--output-size is for the single-input shorthand; with --input the check batch "
                            "names the outputs and their shapes")
    try:
        signature = Signature(tuple(specs))
    except SignatureError as exc:
        raise ModelAddError(str(exc)) from None
    if fmt != "python" and any(s.dtype == "bytes" for s in signature.inputs):
        raise ModelAddError(f"a {fmt} model takes tensors; a bytes input is decoded by a Python class "
                            "(--python module:Class)")
    fields: dict[str, Any] = dict(**signature.legacy_fields(), static_batch=static_batch, dataset=dataset,
                                  signature=signature.to_dict(), **manifest_fields)
    with tempfile.TemporaryDirectory(prefix="keel-model-check-") as scratch:
        try:
            trial = ModelStore(scratch).add(name, path, fmt, entry=python, **fields)
            outputs = infer_outputs(store_predictor(scratch, name, trial.version), signature)
        except (ModelStoreError, ImportError, OSError, RuntimeError, ValueError) as exc:
            raise ModelAddError(f"{name}: the check batch failed: {exc}") from None
    signature = Signature(signature.inputs, outputs)
    fields.update(signature.legacy_fields(), signature=signature.to_dict())
    return ModelStore(store).add(name, path, fmt, entry=python, **fields)


def describe(manifest: Manifest, store: ModelStore) -> str:
    folder = store.folder(manifest)
    what = manifest.entry if manifest.format == "python" else manifest.format
    lines = [f"added {manifest.name} version {manifest.version} ({what}): input {manifest.input_shape} "
             f"{manifest.input_dtype}, output {manifest.output_size}"]
    if manifest.signature is not None and not manifest.signature_of().is_single:
        lines[0] = f"added {manifest.name} version {manifest.version} ({what}):"
        lines.append(manifest.signature_of().describe())
    if manifest.weights:
        lines.append(f"  {folder / manifest.weights}  sha256 {manifest.sha256}")
    if manifest.container_sha256:
        lines.append(f"  {folder / 'container.py'}  sha256 {manifest.container_sha256}")
    lines.append(f"  {folder / 'manifest.json'}")
    return "\n".join(lines)
