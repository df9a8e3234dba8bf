"""Plots for reports: matplotlib without a display, from the ``bench`` extra."""
from __future__ import annotations


class PlotsUnavailable(ImportError):
    """matplotlib is not installed: the ``bench`` extra brings it."""


def pyplot():
    """``matplotlib.pyplot`` drawing to files (the Agg backend)."""
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable("plots need matplotlib: pip install 'keel[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
