"""Command line for training and evaluation; ``deploy/keel.py`` mounts it under ``keel``.

Commands::

    train deployed --dataset {digits,mnist5k} --arch {mlp,lenet5,resnet18} --epochs N
                   [--seed S] [--store DIR] [--name NAME] [--init {parm,torch}]
    train parity   --model NAME --k K --encoder {add,concat} (--epochs N | --steps N)
                   [--seed S] [--store DIR] [--name NAME]
    train recommender | text-classifier | localizer [--store DIR] [--seed S]
                   the seeds' workloads as models with signatures (``training.workloads``)
    evaluate       --parity NAME [--version V] [--seed S] [--store DIR] [--runs DIR]
    evaluate       --table [--store DIR]      markdown table of every evaluated parity model

Every subcommand sets ``func`` on the parsed namespace: ``args.func(args)`` runs it and
returns an exit status.

Example
-------
$ python -m keel.training.cli train deployed --dataset digits --arch mlp --epochs 60
$ python -m keel.training.cli train parity --model digits-mlp --k 2 --encoder add --epochs 200
$ python -m keel.training.cli evaluate --parity digits-mlp-parity-k2-add
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from keel.common.modelstore import DEFAULT_STORE, Manifest, ModelStore

DEFAULT_MODEL = "digits-mlp"  # what ``keel demo`` serves: input_shape [64] float32, output_size 10
DEFAULT_EPOCHS = 60
DEFAULT_PARITY_EPOCHS = 200


def ensure_default_model(store_root: str = DEFAULT_STORE) -> Manifest:
    """Return the latest ``digits-mlp`` manifest, training it first if the store lacks it.

    Parameters
    ----------
    store_root : str
        Model store folder.

    Returns
    -------
    Manifest
        Deployed MLP on digits: input_shape [64] float32, output_size 10.
    """
    store = ModelStore(store_root)
    if store.has(DEFAULT_MODEL):
        return store.manifest(DEFAULT_MODEL)
    from keel.training.train import train_deployed

    return train_deployed("digits", "mlp", DEFAULT_EPOCHS, seed=0, store_root=store_root, name=DEFAULT_MODEL)


def ensure_default_parity(
    store_root: str = DEFAULT_STORE, k: int = 2, encoder: str = "add", epochs: int = DEFAULT_PARITY_EPOCHS
) -> Manifest:
    """Return the parity model for ``digits-mlp`` with this ``k`` and ``encoder``, training what is missing."""
    from keel.training.parity import parity_name, train_parity

    ensure_default_model(store_root)
    store, name = ModelStore(store_root), parity_name(DEFAULT_MODEL, k, encoder)
    if store.has(name):
        return store.manifest(name)
    return train_parity(DEFAULT_MODEL, k, encoder, epochs=epochs, seed=0, store_root=store_root)


def _train_deployed(args: argparse.Namespace) -> int:
    from keel.training.train import train_deployed

    train_deployed(args.dataset, args.arch, args.epochs, args.seed, args.store, args.name, init=args.init)
    return 0


def _train_parity(args: argparse.Namespace) -> int:
    from keel.training.parity import train_parity

    epochs = DEFAULT_PARITY_EPOCHS if args.epochs is None and args.steps is None else args.epochs
    train_parity(
        args.model, args.k, args.encoder, epochs=epochs, steps=args.steps, seed=args.seed,
        store_root=args.store, name=args.name, deployed_version=args.version,
    )
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from keel.training.evaluate import accuracy_table, evaluate

    if args.parity:
        evaluate(args.parity, args.version, args.store, seed=args.seed, runs_dir=args.runs)
    if args.table:
        print(accuracy_table(args.store))
    return 0


#: ``keel.common.architectures.ARCHS`` and ``keel.training.datasets.NAMES``, named here so
#: that ``keel --help`` need not import torch or numpy (tests/unit/test_packaging.py checks
#: that they agree)
ARCH_NAMES = ("mlp", "lenet5", "resnet18", "widemlp")
DATASET_NAMES = ("digits", "mnist5k")


def _architecture(name: str) -> str:
    from keel.common.architectures import ARCHS

    if name not in ARCHS:
        raise argparse.ArgumentTypeError(f"unknown architecture {name!r}; choose from {', '.join(ARCHS)}")
    return name


def add_parser(subparsers: Any) -> None:
    """Add ``train`` (``deployed``, ``parity``) and ``evaluate`` to an argparse subparsers object."""
    train = subparsers.add_parser("train", help="train a deployed or a parity model into the model store")
    what = train.add_subparsers(dest="train_what", required=True)

    d = what.add_parser("deployed", help="train a deployed model")
    d.add_argument("--dataset", choices=DATASET_NAMES, default="digits", help="embedded dataset (default: %(default)s)")
    d.add_argument("--arch", type=_architecture, default="mlp", metavar="ARCH",
                   help=f"model architecture: {', '.join(ARCH_NAMES)} (default: %(default)s)")
    d.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--store", default=DEFAULT_STORE, help="model store folder (default: %(default)s)")
    d.add_argument("--name", default=None, help="store name (default: DATASET-ARCH)")
    d.add_argument("--init", choices=("parm", "torch"), default="parm",
                   help="initial weights: ParM §5.1's or torch's own (default: %(default)s)")
    d.set_defaults(func=_train_deployed)

    p = what.add_parser("parity", help="train a parity model for a deployed model (ParM §4.4)")
    p.add_argument("--model", required=True, help="store name of the deployed model")
    p.add_argument("--version", default=None, help="its version (default: latest)")
    p.add_argument("--k", type=int, default=2, help="coding group size")
    p.add_argument("--encoder", choices=("add", "concat"), default="add")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, default=None, help=f"parity queries / training queries (default {DEFAULT_PARITY_EPOCHS})")
    length.add_argument("--steps", type=int, default=None, help="optimizer steps of 64 parity queries")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store", default=DEFAULT_STORE, help="model store folder (default: %(default)s)")
    p.add_argument("--name", default=None, help="store name (default: MODEL-parity-kK-ENCODER)")
    p.set_defaults(func=_train_parity)

    from keel.training.workloads import add_parsers as add_workloads

    add_workloads(what)  # recommender, text-classifier, localizer: models with signatures

    e = subparsers.add_parser("evaluate", help="A_a, A_d and A_o(f) of a parity model (ParM §5.1)")
    what = e.add_argument_group("what").add_mutually_exclusive_group(required=True)
    what.add_argument("--parity", help="store name of the parity model to evaluate")
    what.add_argument("--table", action="store_true", help="print a markdown table of all evaluated parity models")
    e.add_argument("--version", default=None, help="its version (default: latest)")
    e.add_argument("--seed", type=int, default=0, help="seed for placing test queries in coding groups")
    e.add_argument("--store", default=DEFAULT_STORE, help="model store folder (default: %(default)s)")
    e.add_argument("--runs", default="runs", help="folder for the plot (default: %(default)s)")
    e.set_defaults(func=_evaluate)


def main(argv: list[str] | None = None) -> int:
    """Run one training command; ``python -m keel.training.cli --help``."""
    parser = argparse.ArgumentParser(prog="python -m keel.training.cli", description="Keel training and evaluation")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
