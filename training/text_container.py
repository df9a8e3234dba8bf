"""The text classifier's Python container: bytes in, a label string and a score out.

``keel model add text-gru ARTIFACT --python training/text_container.py:TextClassifier
--input text:bytes:scalar`` copies this file into the version, so it imports nothing of
Keel's: a version serves as it was added. ``load(path)`` reads the artifact (weights,
vocabulary, labels, sizes); ``predict_batch`` tokenises each text (lower case, words of
letters and apostrophes; an unknown word is ``<unk>``, an empty text one ``<unk>``), runs
the int64 ids of each text's own length through an embedding and a GRU (packed, so a
padded batch computes exactly what each text alone would) and answers, per text, the
label and its probability.

Example
-------
>>> c = TextClassifier(); c.load("store/text-gru/1/artifact")          # doctest: +SKIP
>>> c.predict_batch({"text": np.array([b"a great film", b"awful"], dtype=object)})  # doctest: +SKIP
{'label': [b'positive', b'negative'], 'score': array([0.98, 0.97], dtype=float32)}
"""
from __future__ import annotations

import re

import numpy as np
import torch
from torch import nn

PAD, UNK = 0, 1
WORD = re.compile(r"[a-z']+")


def tokenise(text: bytes | str) -> list[str]:
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8", errors="replace")
    return WORD.findall(text.lower())


def encode(texts: list, index: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids padded with PAD, lengths): each text's word ids, ``<unk>`` for words not in
    ``index``, one ``<unk>`` for a text with no words."""
    rows = [[index.get(w, UNK) for w in tokenise(t)] or [UNK] for t in texts]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    ids = torch.full((len(rows), int(lengths.max()) if rows else 1), PAD, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.int64)
    return ids, lengths


class GRUClassifier(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 32, hidden: int = 48, n_labels: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim, padding_idx=PAD)
        self.gru = nn.GRU(dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, n_labels)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(ids), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.out(h[-1])


class TextClassifier:
    """Clipper's container contract: ``load(path)`` then ``predict_batch(inputs)``."""

    def load(self, path: str) -> None:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        self.labels = [str(x) for x in saved["labels"]]
        self.index = {w: i for i, w in enumerate(saved["vocab"])}
        self.model = GRUClassifier(len(saved["vocab"]), **saved["sizes"], n_labels=len(self.labels))
        self.model.load_state_dict(saved["state_dict"])
        self.model.eval()

    def predict_batch(self, inputs: dict) -> dict:
        texts = list(np.asarray(inputs["text"], dtype=object).reshape(-1))
        ids, lengths = encode(texts, self.index)
        with torch.inference_mode():
            probs = torch.softmax(self.model(ids, lengths), dim=1).numpy()
        best = probs.argmax(axis=1)
        return {"label": [self.labels[b].encode() for b in best],
                "score": probs[np.arange(len(best)), best].astype(np.float32)}
