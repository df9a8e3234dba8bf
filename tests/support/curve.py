"""CURVE keys for the tests: a cluster's folder as ``keel keys generate`` makes it, and a
stranger's (its own keypair and the cluster's public service key, not on the allow-list)."""
from __future__ import annotations

import shutil
from pathlib import Path

from keel.common import curve
from keel.deploy.keel import main as keel


def cluster_and_stranger(root: Path) -> tuple[Path, Path]:
    """-> (the cluster's keys folder, the stranger's)."""
    folder = root / "cluster"
    assert keel(["keys", "generate", str(folder)]) == 0
    stranger = root / "stranger"
    curve.generate(stranger, ("stranger",))
    shutil.copyfile(folder / "service.key", stranger / "service.key")
    return folder, stranger
