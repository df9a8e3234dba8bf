"""Progress bars (common.progress) show on a terminal only: logs and CI stay plain lines."""
from __future__ import annotations

import io

from keel.common import progress


def test_bar_is_off_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(progress, "on_terminal", lambda: False)
    with progress.bar(10, "x") as b:
        assert b.disable


def test_bar_is_on_on_a_terminal_unless_disabled(monkeypatch):
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    out = io.StringIO()
    with progress.bar(10, "train", file=out, mininterval=0) as b:
        assert not b.disable
        b.update(5)
        b.refresh()
    assert "train" in out.getvalue() and "5/10" in out.getvalue()
    with progress.bar(10, "x", enabled=False, file=out) as b:
        assert b.disable
