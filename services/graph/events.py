"""A graph process's event log: what it did, as JSON lines for the invariant checker (``chaos.invariants``):
``release`` (frontend: a reply left, with its lineage), ``apply`` (backup: a state applied,
with the lineage it depended on and ``requests``, the [request key, seq] the state applied:
the checker's "each request changes each state at most once"), ``output`` (an operator's
output per seq, with its request key; ``duplicate`` when answered from the table of applied
requests, not applied), ``takeover`` (a promoted backup or a roll-back: the state goes on
from ``max_seq``). Times are
``time.monotonic()``, one clock for every process of a host. Off unless a path is given.
Opening a log writes a ``process`` line (its pid) first: a process started again on
the same path (a joiner) appends after its own, so every later line is known to be its."""
from __future__ import annotations

import os
import time
from pathlib import Path

import orjson


class EventLog:
    def __init__(self, path: str | None):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "ab") if path else None
        self.write("process", pid=os.getpid())

    def __bool__(self) -> bool:
        return self.file is not None

    def write(self, stream: str, **record) -> None:
        if self.file is not None:
            record.update(stream=stream, t=time.monotonic())
            self.file.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def flush(self, _=None) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
