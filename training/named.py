"""Training helpers for models with named inputs (``common.signature``).

- ``Star``: ``training.train.fit`` calls ``model(x)`` with one x; a model of several
  positional inputs is wrapped so that x is a tuple spread into its arguments;
- ``add_scripted``: TorchScript a trained module and add it to the store as ``keel model
  add FILE --input ...`` would (checked by its check batches, written with its signature).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from keel.common.modelstore import Manifest


class Star(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, xs: tuple) -> Any:
        return self.inner(*xs)


def add_scripted(store_root: str, name: str, module: nn.Module, inputs: list[str], **fields: Any) -> Manifest:
    """``module`` (eval mode) as the next version of ``name``: ``fields`` (dataset, role,
    parity, metrics, arch, arch_config) go into its manifest."""
    from keel.common.model_add import add_model

    module.eval()
    with tempfile.TemporaryDirectory(prefix="keel-train-") as tmp:
        path = Path(tmp) / f"{name}.pt"
        torch.jit.save(torch.jit.script(module), str(path))
        dataset = fields.pop("dataset", None)
        return add_model(store_root, name, str(path), inputs=inputs, dataset=dataset, manifest_fields=fields)
