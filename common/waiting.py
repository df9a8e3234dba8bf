"""Wait for a condition with a deadline: the one polling loop of Keel's tools and tests.

A condition is a callable returning something truthy when it holds; ``wait_until``
returns that value, or the last (falsy) value once the time is up. Nothing sleeps
blindly: the condition is asked every ``interval_s`` until it holds.

Example
-------
>>> wait_until(lambda: 42, timeout_s=1.0)
42
>>> wait_until(lambda: None, timeout_s=0.05) is None
True
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout_s: float | None = None, interval_s: float = 0.01,
               deadline: float | None = None) -> Any:
    """``condition()`` once truthy, or its last value at the deadline.

    Give ``timeout_s`` (seconds from now) or ``deadline`` (a ``time.monotonic()`` value).
    The condition is always asked at least once, and once more at the deadline.
    """
    if deadline is None:
        if timeout_s is None:
            raise ValueError("wait_until needs timeout_s or deadline")
        deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            return value
        time.sleep(min(interval_s, left))
