"""The seeds' workloads as models with signatures: ``keel train recommender | text-classifier
| localizer``.

Three models of the kinds the papers serve and one fixed-shape input cannot (Kairos's
recommendation models, Clipper's text containers, ParM's object localization), each
trained in well under two minutes on this machine from generated or bundled data and
added to the store the way ``keel model add`` adds a user's model (checked by its check
batches, written with its signature):

- ``recommender``      DLRM-style: dense float32[13] + three int64 id bags of 1..40 ids
                       (each with a mask) -> click probability (``training.recommender``);
- ``text-classifier``  a Python class fed bytes: it tokenises them, runs int64 ids of the
                       text's length through a GRU, answers a label string and a score
                       (``training.text_classifier``, ``training.text_container``);
- ``localizer``        a CNN on MNIST digits placed on a 64x64 canvas -> class logits[10]
                       and box[4], and its ParM parity model for k = 2 (add encoder),
                       with A_a, A_d and the boxes' mean IoU (``training.localizer``).

Example
-------
$ keel train recommender --store store
$ keel train text-classifier --store store
$ keel train localizer --store store --k 2
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from keel.common.modelstore import DEFAULT_STORE, Manifest


def _timed(what: str, run: Any) -> int:
    start = time.perf_counter()
    manifest = run()
    print(f"{what}: {manifest.name}/{manifest.version} in {time.perf_counter() - start:.1f} s; "
          f"metrics {manifest.metrics}", flush=True)
    return 0


def _recommender(args: argparse.Namespace) -> int:
    from keel.training.recommender import train_recommender

    return _timed("recommender", lambda: train_recommender(args.store, seed=args.seed, epochs=args.epochs,
                                                           name=args.name or "rec-dlrm"))


def _text(args: argparse.Namespace) -> int:
    from keel.training.text_classifier import train_text_classifier

    return _timed("text classifier", lambda: train_text_classifier(args.store, seed=args.seed, epochs=args.epochs,
                                                                   name=args.name or "text-gru"))


def _localizer(args: argparse.Namespace) -> int:
    from keel.training.localizer import train_localizer

    def run() -> Manifest:
        deployed, parity = train_localizer(args.store, seed=args.seed, steps=args.steps, k=args.k,
                                           parity_steps=args.parity_steps, name=args.name or "mnist-loc")
        print(f"parity model {parity.name}/{parity.version}: {parity.metrics}", flush=True)
        return deployed

    return _timed("localizer", run)


def add_parsers(what: Any) -> None:
    """``train recommender``, ``train text-classifier``, ``train localizer`` under ``keel train``."""
    for command, func, helptext, length in (
            ("recommender", _recommender, "a DLRM-style recommender: dense features + three id bags -> click "
             "probability (generated data)", ("--epochs", 6)),
            ("text-classifier", _text, "a text classifier fed bytes: a Python class tokenises, a GRU classifies "
             "(generated text)", ("--epochs", 3)),
            ("localizer", _localizer, "a CNN locating MNIST digits on a 64x64 canvas (class and box) and its "
             "ParM parity model", ("--steps", 1000))):
        p = what.add_parser(command, help=helptext)
        flag, default = length
        p.add_argument(flag, type=int, default=default, help="training length (default: %(default)s)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--store", default=DEFAULT_STORE, help="model store folder (default: %(default)s)")
        p.add_argument("--name", default=None, help="store name")
        if command == "localizer":
            p.add_argument("--k", type=int, default=2, help="the parity model's coding group size (default 2)")
            p.add_argument("--parity-steps", type=int, default=800, help="the parity model's (default: %(default)s)")
        p.set_defaults(func=func)
