"""A logged failure says what and where: type, message and traceback (not "exc_info": true)."""
from __future__ import annotations

import orjson

from keel.common import logs


def test_exception_lines_carry_type_message_and_traceback(capsys):
    log = logs.setup("svc", json=True)
    try:
        {}["missing-key"]
    except KeyError:
        log.exception("handler failed", role="frontend")
    entry = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert entry["event"] == "handler failed" and entry["service"] == "svc"
    assert "exc_info" not in entry
    assert "KeyError" in entry["exception"] and "missing-key" in entry["exception"]
    assert "test_logs.py" in entry["exception"]  # where
