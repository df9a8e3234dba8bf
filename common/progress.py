"""Progress bars for long work (training, profiling, experiments): tqdm on a terminal, off
otherwise, so logs and CI output stay plain lines.

Example
-------
>>> with bar(100, "train", unit="step") as b:              # doctest: +SKIP
...     for _ in range(100):
...         b.update(1)
"""
from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def on_terminal() -> bool:
    return sys.stderr.isatty()


def bar(total: int | None, desc: str, *, enabled: bool = True, **options: Any) -> tqdm:
    """A tqdm bar on stderr, disabled (a no-op) when stderr is not a terminal or ``enabled`` is false."""
    return tqdm(total=total, desc=desc, disable=not (enabled and on_terminal()), leave=False, dynamic_ncols=True,
                **options)
