"""A text classifier fed strings (Clipper's containers take strings of variable length).

Reviews are generated (seeded) from a small vocabulary: neutral filler words, positive and
negative words, and "not", which flips the sentiment word after it; a review's label is
the sign of its summed sentiment (ties are never generated). Lengths run from 3 to 30
words, so the GRU sees ids of varying length. The container (``training.text_container``)
tokenises bytes itself; the model is trained on the same tokenisation.

Example
-------
>>> m = train_text_classifier("store", seed=0)   # doctest: +SKIP
>>> m.metrics["test_accuracy"]                    # doctest: +SKIP
"""
from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from keel.common.modelstore import DEFAULT_STORE, Manifest
from keel.training.named import Star
from keel.training.text_container import GRUClassifier, encode, tokenise
from keel.training.train import RUNS_DIR, fit

POSITIVE = ("good great excellent love loved wonderful fine happy best nice amazing brilliant enjoyable fun "
            "superb delightful charming moving").split()
NEGATIVE = ("bad awful terrible hate hated poor worst boring sad horrible ugly dull weak mess disappointing "
            "tedious bland annoying").split()
FILLER = ("the a an movie film plot story actor actors scene scenes music ending it this that was is were "
          "very really quite and but with of in to for at its their director script cast overall "
          "somewhat rather too time").split()
LABELS = ("negative", "positive")
INPUTS = ["text:bytes:scalar"]
CONTAINER = Path(__file__).with_name("text_container.py")


@dataclass
class TextConfig:
    n_train: int = 8_000
    n_test: int = 2_000
    dim: int = 32
    hidden: int = 48
    epochs: int = 3
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 1e-6
    seed: int = 0


def review(rng: np.random.Generator) -> tuple[str, int]:
    """One generated review and its label (1 positive)."""
    length = int(rng.integers(3, 31))
    words = list(rng.choice(FILLER, size=length))
    score = 0
    while score == 0:
        for _ in range(int(rng.integers(1, 4))):
            sign = 1 if rng.random() < 0.5 else -1
            word = str(rng.choice(POSITIVE if sign > 0 else NEGATIVE))
            at = int(rng.integers(0, len(words) + 1))
            if rng.random() < 0.25:  # "not good" is negative
                words[at:at] = ["not", word]
                sign = -sign
            else:
                words[at:at] = [word]
            score += sign
    return " ".join(words), int(score > 0)


def generate(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng([seed, 11])
    pairs = [review(rng) for _ in range(n)]
    return [t for t, _ in pairs], np.array([y for _, y in pairs], np.int64)


def train_text_classifier(store_root: str = DEFAULT_STORE, *, seed: int = 0, epochs: int = 3, name: str = "text-gru",
                          progress: bool = True, runs_dir: str = RUNS_DIR, n_train: int = TextConfig.n_train,
                          n_test: int = TextConfig.n_test) -> Manifest:
    """Train the GRU on generated reviews and add the Python container (bytes in; label
    and score out) with its artifact and signature; ``metrics["test_accuracy"]``."""
    from keel.common.model_add import add_model

    config = TextConfig(epochs=epochs, seed=seed, n_train=n_train, n_test=n_test)
    texts, labels = generate(config.n_train, seed)
    test_texts, test_labels = generate(config.n_test, seed + 10_000)
    vocab = ["<pad>", "<unk>"] + sorted({w for t in texts for w in tokenise(t)})
    index = {w: i for i, w in enumerate(vocab)}
    ids, lengths = encode(texts, index)
    y = torch.from_numpy(labels)
    torch.manual_seed(seed)
    model = GRUClassifier(len(vocab), config.dim, config.hidden, len(LABELS))
    steps_per_epoch = -(-config.n_train // config.batch_size)

    def batch(step: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        epoch, i = divmod(step, steps_per_epoch)
        idx = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(config.n_train)
                               [i * config.batch_size:(i + 1) * config.batch_size])
        n = int(lengths[idx].max())
        return (ids[idx, :n], lengths[idx]), y[idx]

    if progress:
        print(f"training {name}: GRU on {config.n_train} generated reviews, {epochs} epochs, seed {seed}", flush=True)
    loss = fit(Star(model), batch, F.cross_entropy, epochs * steps_per_epoch, asdict(config),
               Path(runs_dir) / "ckpt" / f"{name}.pt", steps_per_epoch, progress, log_every=steps_per_epoch // 2)
    model.eval()
    with torch.no_grad():
        test_ids, test_lengths = encode(test_texts, index)
        accuracy = float((model(test_ids, test_lengths).argmax(1).numpy() == test_labels).mean())
    metrics = {"test_accuracy": accuracy, "train_loss": loss, "epochs": epochs, "seed": seed,
               "vocab": len(vocab), "test_words": f"{min(map(len, map(tokenise, test_texts)))}.."
                                                 f"{max(map(len, map(tokenise, test_texts)))}"}
    with tempfile.TemporaryDirectory(prefix="keel-train-") as tmp:
        artifact = Path(tmp) / "text-gru.pt"
        torch.save({"state_dict": model.state_dict(), "vocab": vocab, "labels": list(LABELS),
                    "sizes": {"dim": config.dim, "hidden": config.hidden}}, artifact)
        manifest = add_model(store_root, name, str(artifact), python=f"{CONTAINER}:TextClassifier", inputs=INPUTS,
                             dataset="generated-reviews", manifest_fields={"metrics": metrics, "arch": "gru"})
    (Path(runs_dir) / "ckpt" / f"{name}.pt").unlink(missing_ok=True)
    if progress:
        print(f"{name}/{manifest.version}: test accuracy {accuracy:.4f}", flush=True)
    return manifest
