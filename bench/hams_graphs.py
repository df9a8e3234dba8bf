"""The graphs ``keel experiment hams-overhead`` runs (HAMS §VI in small) and the operator
kind of its own they use (``OnlineHashedLinear``): what is measured, apart from how
(``bench.hams_overhead``). An operator process loads the kind from here by name, without
the experiment's load client and launcher."""
from __future__ import annotations

import numpy as np
import torch

from keel.services.graph.models import StatefulOperator

#: states in flight to the backup: 2 lets the update of batch n+1 start once state n is
#: copied and state n-1 delivered (between §III-B's W=1 and §V's "copy finished")
WINDOW = 2
#: streams of each GRU: its hidden state is streams x hidden floats (g1's 1 MiB here)
GRU_STREAMS = 8192
#: hidden width of the online-learning MLP: ~340k parameters, 1.3 MiB of state
OL_HIDDEN = 16384
#: buckets of the large-state online model: 2^20 x 4 float32 weights, 16 MiB of state
OL_LARGE_BUCKETS = 1 << 20
#: its L2 weight decay: every step shrinks every weight, so each batch's state is all new
OL_LARGE_DECAY = 1e-4

class OnlineHashedLinear(StatefulOperator):
    """Online learning at scale in small: a linear model over hashed features (each
    feature's value picks a bucket of weights), one SGD step per batch on the feedback.
    Its parameters are large (``buckets`` x outputs) while its compute reads few of them.
    ``decay``: L2 regularisation (weight decay), which shrinks every weight at every step,
    so every batch changes the whole state, as HAMS's online-learned models do ("an ML
    model usually update[s] all its state after each batch", its related work); without it a batch changes
    only the buckets its features hashed to (``touched``). Input rows are features followed
    by the feedback for the stream's previous prediction."""

    def __init__(self, input_shape, output_shape, seed: int = 0, buckets: int = OL_LARGE_BUCKETS, lr: float = 0.01,
                 decay: float = 0.0, **options):
        super().__init__(input_shape, output_shape, seed)
        self.n_out = int(np.prod(output_shape))
        self.n_in = int(np.prod(input_shape)) - self.n_out
        self.buckets, self.lr, self.decay = buckets, lr, decay

    def initialize(self):
        return {"w": torch.zeros(self.buckets, self.n_out)}

    def _rows(self, batch):
        x = torch.from_numpy(np.ascontiguousarray(batch.inputs, dtype=np.float32)).reshape(len(batch.inputs), -1)
        feats, y = x[:, :self.n_in], x[:, self.n_in:]
        # bucket of feature i: its index and its value quantised, hashed (Knuth's multiplier)
        keys = (torch.arange(self.n_in) * 1024 + (feats * 64).floor().to(torch.int64)) * 2654435761
        return feats, y, keys.remainder(self.buckets)

    @torch.no_grad()
    def compute(self, batch):
        feats, _, idx = self._rows(batch)
        out = (self.state["w"][idx] * feats[..., None]).sum(1)  # reads the state only
        return out.reshape(len(batch.inputs), *self.output_shape).numpy()

    @torch.no_grad()
    def update(self, batch, outputs):
        feats, y, idx = self._rows(batch)
        err = torch.from_numpy(np.asarray(outputs, np.float32)).reshape(len(batch.inputs), -1) - y
        grad = err[:, None, :] * feats[..., None]  # d loss / d w[bucket] per (row, feature)
        if self.decay:
            self.state["w"].mul_(1.0 - self.lr * self.decay)  # every weight: the whole state changed
        self.state["w"].index_add_(0, idx.reshape(-1), grad.reshape(-1, self.n_out), alpha=-self.lr)
        self._touched = None if self.decay else np.unique(idx.numpy())

    def touched(self):
        """The buckets the batch's features hashed to: all that the update changed (None,
        the whole state, under weight decay)."""
        return None if self._touched is None else {"w": self._touched}


def graphs(pad_ms: float, batch: int) -> dict[str, dict]:
    """The paper's services in small: its stateful models carry MBs of state (a GRU's hidden
    states over many streams, a model trained online), so the states here are MBs too, not
    KBs -- copying them is what NSPB hides and S2/Remus pay for (HAMS §VI, NOTES.md)."""
    def op(kind, i, o, **kw):
        return {"kind": kind, "input_shape": [i], "output_shape": [o], "max_batch": batch, "pad_ms": pad_ms, **kw}

    gru = {"options": {"streams": GRU_STREAMS}}
    shapes = {
        "gru_gru": {"input_shape": [16], "edges": [["frontend", "g1"], ["g1", "g2"], ["g2", "frontend"]],
                    "operators": {"g1": op("gru", 16, 32, **gru), "g2": op("gru", 32, 8, **gru)}},
        "online_learning": {"input_shape": [20], "edges": [["frontend", "m"], ["m", "ol"], ["ol", "frontend"]],
                            "operators": {"m": op("mlp", 20, 20),
                                          "ol": op("online_mlp", 20, 4, options={"hidden": OL_HIDDEN})}},
        "fanout_join": {"input_shape": [16], "edges": [["frontend", "g"], ["frontend", "m"], ["g", "j"], ["m", "j"],
                                                       ["j", "frontend"]],
                        "operators": {"g": op("gru", 16, 16, **gru), "m": op("mlp", 16, 16), "j": op("mlp", 32, 8)}},
        "stateful_last": {"input_shape": [16], "edges": [["frontend", "m"], ["m", "g"], ["g", "frontend"]],
                          "operators": {"m": op("mlp", 16, 16), "g": op("gru", 16, 8, **gru)}},
        # the model's whole 16 MiB changes every batch (weight decay) and a stage follows it
        # (``post``), as in HAMS's services: NSPB ships the state while ``post`` computes,
        # S2 stops the model to copy it, Remus also holds its outputs until it is delivered
        "ol_large": {"input_shape": [20], "edges": [["frontend", "m"], ["m", "ol"], ["ol", "post"], ["post", "frontend"]],
                     "operators": {"m": op("mlp", 20, 20),
                                   "ol": op("keel.bench.hams_graphs:OnlineHashedLinear", 20, 4,
                                            options={"decay": OL_LARGE_DECAY}),
                                   "post": op("mlp", 4, 4)}},
    }
    return {name: dict(table, window=WINDOW) for name, table in shapes.items()}
