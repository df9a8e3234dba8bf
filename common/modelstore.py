"""The model store: a folder per model version, each with ``manifest.json`` and weights.

Layout::

    ROOT/NAME/VERSION/manifest.json   architecture, input shape and dtype, output size,
                                      role, dataset, metrics, sha256 of the weights
    ROOT/NAME/VERSION/weights.pt      torch state_dict

Versions are integers as strings ("1", "2", ...); "latest" is the highest. The sha256 in
the manifest is checked at every load, so a truncated or swapped weights file is refused
instead of served. Architectures are built by name through ``common.architectures.build``.

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
        return Manifest.from_json((self.root / name / version / "manifest.json").read_bytes())

    def save(self, name: str, module: Any, **fields: Any) -> Manifest:
        """Write ``module``'s state_dict as the next version of ``name``; returns its manifest."""
        import torch

        versions = self.versions(name)
        version = str(int(versions[-1]) + 1 if versions else 1)
        folder = self.root / name / version
        folder.mkdir(parents=True, exist_ok=False)
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, buf)
        weights = folder / "weights.pt"
        weights.write_bytes(buf.getvalue())
        manifest = Manifest(
            name=name,
            version=version,
            sha256=sha256_file(weights),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **fields,
        )
        tmp = folder / "manifest.json.tmp"
        tmp.write_bytes(manifest.to_json())
        tmp.replace(folder / "manifest.json")  # a version exists only once its manifest does
        return manifest

    def update_metrics(self, name: str, version: str, metrics: dict[str, Any]) -> Manifest:
        manifest = self.manifest(name, version)
        manifest.metrics.update(metrics)
        path = self.root / name / manifest.version / "manifest.json"
        path.write_bytes(manifest.to_json())
        return manifest

    def load(self, name: str, version: str | None = None) -> tuple[Any, Manifest]:
        """(torch module in eval mode, manifest); refuses weights whose sha256 differs."""
        import torch

        from common.architectures import build

        manifest = self.manifest(name, version)
        weights = self.root / name / manifest.version / manifest.weights
        if not weights.is_file():
            raise ModelStoreError(f"{name}/{manifest.version}: weights file {weights} is missing")
        digest = sha256_file(weights)
        if digest != manifest.sha256:
            raise ModelStoreError(
                f"{name}/{manifest.version}: sha256 of {weights.name} is {digest[:12]}..., "
                f"manifest says {manifest.sha256[:12]}...; refusing to load"
            )
        module = build(manifest.arch, **manifest.arch_config)
        module.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        module.eval()
        return module, manifest
