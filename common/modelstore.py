"""The model store: a folder per model version, each with ``manifest.json`` and weights.

Layout::

    ROOT/NAME/VERSION/manifest.json   architecture, signature (named inputs and outputs),
                                      input shape and dtype, output size, role, dataset,
                                      metrics, sha256 of the weights
    ROOT/NAME/VERSION/weights.pt      torch state_dict (format "state_dict")
    ROOT/NAME/VERSION/model.pt        a TorchScript file (format "torchscript")
    ROOT/NAME/VERSION/model.pt2       a ``torch.export`` program (format "export")
    ROOT/NAME/VERSION/container.py    a Python container's module, when added from a file
    ROOT/NAME/VERSION/artifact        what a Python container's ``load(path)`` reads (optional)

Versions are integers as strings ("1", "2", ...); "latest" is the highest. A removed
version (``remove``) leaves its folder with a ``REMOVED`` note, so no later version
takes its number. The sha256 in
the manifest is checked at every load, so a truncated or swapped file is refused instead
of served. Architectures of Keel's own training code are built by name through
``common.architectures.build``; a user's own model comes in as a file (``add``), so the
store never needs to know how it was built. Every version, trained or added, is written by
one function (``_commit``): a folder, its artifact, its sha256, then the manifest.

A Python container is a class named ``module:Class`` (or ``path/to/file.py:Class``, whose
file is copied into the version) with ``predict_batch(inputs) -> outputs`` and an optional
``load(path)``: Clipper's container contract (§3). It is run by ``common.containers`` in
the worker process, never by the store.

Example
-------
>>> store = ModelStore("store")                                  # doctest: +SKIP
>>> m = store.save("digits-mlp", net, arch="mlp", arch_config={...},
...                input_shape=[64], output_size=10, dataset="digits")  # doctest: +SKIP
>>> net, manifest = store.load("digits-mlp")                     # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

DEFAULT_STORE = os.environ.get("KEEL_STORE", "store")


class ModelStoreError(RuntimeError):
    """A model or version is missing, or its files do not match its manifest."""


@dataclass
class Manifest:
    name: str
    version: str
    arch: str
    input_shape: list[int]
    output_size: int
    arch_config: dict[str, Any] = field(default_factory=dict)
    input_dtype: str = "float32"
    role: str = "deployed"  # or "parity"
    dataset: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] | None = None  # role parity: {"k", "encoder", "deployed": "name/version"}
    sha256: str = ""
    weights: str = "weights.pt"
    created: str = ""
    #: how the artifact is loaded: "state_dict" (arch + weights), "torchscript", "export" (.pt2), "python"
    format: str = "state_dict"
    #: format "python": "module:Class", or "container.py:Class" for a file copied into the version
    entry: str | None = None
    #: a ``torch.export`` program traced with a fixed batch size: batches are run in chunks of it
    static_batch: int | None = None
    #: format "python" from a file: the sha256 of the version's copy, container.py
    container_sha256: str = ""
    #: named inputs and outputs (``common.signature``, ``Signature.to_dict``); None in a
    #: version written before signatures: ``signature_of`` derives it from the fields above
    signature: dict[str, Any] | None = None

    def signature_of(self) -> Any:
        """The version's ``Signature``: the stored one, or for a version that has none the
        single input ``input`` (input_shape, input_dtype) and float32 ``output`` (output_size)."""
        from keel.common.signature import Signature, SignatureError

        try:
            if self.signature is not None:
                return Signature.from_dict(self.signature)
            return Signature.single(self.input_shape, self.input_dtype, self.output_size)
        except SignatureError as exc:
            raise ModelStoreError(f"{self.name}/{self.version}: its manifest's signature is unreadable ({exc})") from None

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        data = orjson.loads(raw)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def version_files(manifest: Manifest) -> dict[str, str]:
    """A version's files besides its manifest -> the sha256 the manifest gives for each:
    what a copy of the version must hold (``common.modelfetch``, ``services.store``)."""
    files = {}
    if manifest.weights:
        files[manifest.weights] = manifest.sha256
    if manifest.container_sha256:
        files["container.py"] = manifest.container_sha256
    return files


#: formats ``ModelStore.add`` takes, and the artifact name each is stored under
FORMATS = {"torchscript": "model.pt", "export": "model.pt2", "python": "artifact"}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ModelStore:
    def __init__(self, root: str | os.PathLike = DEFAULT_STORE):
        self.root = Path(root)

    def versions(self, name: str) -> list[str]:
        folder = self.root / name
        if not folder.is_dir():
            return []
        found = [p.name for p in folder.iterdir() if p.name.isdigit() and (p / "manifest.json").is_file()]
        return sorted(found, key=int)

    def models(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and self.versions(p.name))

    def has(self, name: str, version: str | None = None) -> bool:
        versions = self.versions(name)
        return bool(versions) if version in (None, "latest") else version in versions

    def resolve(self, name: str, version: str | None = None) -> str:
        versions = self.versions(name)
        if not versions:
            known = ", ".join(self.models()) or "none"
            raise ModelStoreError(f"model {name!r} is not in the store at {self.root} (models there: {known})")
        if version in (None, "latest"):
            return versions[-1]
        if version not in versions:
            raise ModelStoreError(f"model {name!r} has no version {version!r} (versions: {versions})")
        return version

    def manifest(self, name: str, version: str | None = None) -> Manifest:
        version = self.resolve(name, version)
        path = self.root / name / version / "manifest.json"
        try:
            return Manifest.from_json(path.read_bytes())
        except (OSError, orjson.JSONDecodeError, TypeError) as exc:  # TypeError: a field missing
            raise ModelStoreError(f"{name}/{version}: {path} is unreadable or not a manifest ({exc}); "
                                  "restore it, or remove the version (keel model remove)") from None

    def remove(self, name: str, version: str) -> Path:
        """Delete one version's files; returns its folder. The manifest goes first, so a
        version half removed is no longer a version. The folder stays, holding only a
        ``REMOVED`` note, so that its number is never given to another model: frontends
        cache answers by (model, version)."""
        version = self.resolve(name, version)
        folder = self.root / name / version
        (folder / "manifest.json").unlink()
        for path in folder.iterdir():
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        (folder / "REMOVED").write_text(f"version {version} of {name} removed at {_now()}\n")
        return folder

    def save(self, name: str, module: Any, **fields: Any) -> Manifest:
        """Write ``module``'s state_dict as the next version of ``name``; returns its manifest."""
        import torch

        def write(folder: Path) -> Path:
            buf = io.BytesIO()
            torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, buf)
            weights = folder / "weights.pt"
            weights.write_bytes(buf.getvalue())
            return weights

        return self._commit(name, write, fields)

    def add(self, name: str, path: str | os.PathLike | None, format: str, *, entry: str | None = None,
            **fields: Any) -> Manifest:
        """Copy a user's model file into the next version of ``name``; returns its manifest.

        Parameters
        ----------
        path : path or None
            The TorchScript file, the ``.pt2`` program, or what a Python container's
            ``load(path)`` reads (None: a container that loads nothing).
        format : str
            ``"torchscript"``, ``"export"`` or ``"python"``.
        entry : str
            Format python: ``module:Class``, or ``FILE.py:Class`` (the file is copied in).
        **fields
            Manifest fields: ``input_shape``, ``output_size``, ``input_dtype``, ...
        """
        if format not in FORMATS:
            raise ModelStoreError(f"unknown model format {format!r}; formats: {sorted(FORMATS)}")
        if format == "python":
            module, _, cls = (entry or "").rpartition(":")
            if not module or not cls:
                raise ModelStoreError(f"a Python container is named module:Class, got {entry!r}")
        elif path is None:
            raise ModelStoreError(f"format {format} needs the model file")
        if path is not None and not Path(path).is_file():
            raise ModelStoreError(f"{path}: no such file")

        def write(folder: Path) -> Path | None:
            nonlocal entry, container_sha256
            if format == "python" and module.endswith(".py"):
                if not Path(module).is_file():
                    raise ModelStoreError(f"{module}: no such file")
                shutil.copyfile(module, folder / "container.py")
                entry, container_sha256 = f"container.py:{cls}", sha256_file(folder / "container.py")
            if path is None:
                return None
            target = folder / FORMATS[format]
            shutil.copyfile(path, target)
            return target

        container_sha256 = ""
        fields.setdefault("arch", format)
        return self._commit(name, write, {**fields, "format": format},
                            lambda: {"entry": entry, "container_sha256": container_sha256})

    def _commit(self, name: str, write: Any, fields: dict[str, Any], late: Any = None) -> Manifest:
        """The one way a version is made: a new folder, ``write(folder) -> artifact or None``,
        then the manifest with the artifact's sha256 (a version exists once its manifest does)."""
        parent = self.root / name
        taken = [int(p.name) for p in parent.iterdir() if p.name.isdigit()] if parent.is_dir() else []
        version = str(max(taken, default=0) + 1)  # a removed version's number is never reused
        folder = parent / version
        folder.mkdir(parents=True, exist_ok=False)
        try:
            artifact = write(folder)
            extra = late() if late else {}
            manifest = Manifest(name=name, version=version, created=_now(),
                                sha256=sha256_file(artifact) if artifact else "",
                                weights=artifact.name if artifact else "", **fields, **extra)
            tmp = folder / "manifest.json.tmp"
            tmp.write_bytes(manifest.to_json())
            tmp.replace(folder / "manifest.json")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return manifest

    def folder(self, manifest: Manifest) -> Path:
        return self.root / manifest.name / manifest.version

    def artifact(self, manifest: Manifest) -> Path | None:
        """The version's checked artifact file (None: a Python container without one)."""
        if not manifest.weights:
            return None
        path = self.folder(manifest) / manifest.weights
        if not path.is_file():
            raise ModelStoreError(f"{manifest.name}/{manifest.version}: file {path} is missing")
        digest = sha256_file(path)
        if digest != manifest.sha256:
            raise ModelStoreError(
                f"{manifest.name}/{manifest.version}: sha256 of {path.name} is {digest[:12]}..., "
                f"manifest says {manifest.sha256[:12]}...; refusing to load"
            )
        return path

    def update_metrics(self, name: str, version: str, metrics: dict[str, Any]) -> Manifest:
        manifest = self.manifest(name, version)
        manifest.metrics.update(metrics)
        path = self.root / name / manifest.version / "manifest.json"
        path.write_bytes(manifest.to_json())
        return manifest

    def load(self, name: str, version: str | None = None) -> tuple[Any, Manifest]:
        """(torch module in eval mode, manifest); refuses files whose sha256 differs.
        A Python container is no torch module: ``common.containers`` loads it."""
        import torch

        manifest = self.manifest(name, version)
        if manifest.format == "python":
            raise ModelStoreError(f"{name}/{manifest.version} is a Python container ({manifest.entry}); "
                                  "keel.common.containers.PythonPredictor runs it")
        path = self.artifact(manifest)
        if manifest.format == "torchscript":
            module = torch.jit.load(str(path), map_location="cpu")
        elif manifest.format == "export":
            module = torch.export.load(str(path)).module()
        elif manifest.format == "state_dict":
            from keel.common.architectures import build

            module = build(manifest.arch, **manifest.arch_config)
            module.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        else:
            raise ModelStoreError(f"{name}/{manifest.version}: unknown format {manifest.format!r}")
        if manifest.format != "export":  # an exported program is already traced for inference
            module.eval()
        return module, manifest
