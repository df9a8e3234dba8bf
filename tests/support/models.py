"""Small TorchScript-able models the integration tests put in a store."""
from __future__ import annotations

import torch


class Scale(torch.nn.Module):
    """4 -> 2: (sum of x + ``offset``, 3 * x[0]); versions differ by their offset, so every
    reply can be checked against the version it names."""

    def __init__(self, offset: float = 0.0):
        super().__init__()
        self.offset = offset

    def forward(self, x):
        return torch.stack([x.sum(1) + self.offset, 3 * x[:, 0]], dim=1)
