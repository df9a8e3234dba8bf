"""One selection state per (application, context), kept across restarts (Clipper §5.3).

Clipper kept context states in Redis; Keel keeps them in an embedded SQLite database (the
standard library's ``sqlite3``), one file per frontend, so there is no server to run.

Durability: every ``put`` commits at once, in WAL mode with ``synchronous=NORMAL``: a
state survives the frontend process's crash or SIGKILL (the write-ahead log is in the OS
page cache); a power loss may take back the last commits (the database stays consistent).
Bounds: a state unused for ``ttl_s`` is forgotten (it starts again from ``init``); past
``cap`` states the least recently used go first.

Example
-------
>>> store = ContextStore(":memory:", ttl_s=60, cap=2)
>>> store.put("app", "alice", {"log_w": [0.0, -1.0]}, now=0.0)
>>> store.get("app", "alice", now=1.0)
{'log_w': [0.0, -1.0]}
>>> store.get("app", "alice", now=100.0) is None  # older than the TTL
True
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson


class ContextStore:
    def __init__(self, path: str | Path, ttl_s: float = 7 * 24 * 3600.0, cap: int = 100_000):
        if not ttl_s > 0 or cap < 1:
            raise ValueError(f"ttl_s must be > 0 and cap >= 1, got {ttl_s}, {cap}")
        self.ttl_s, self.cap = float(ttl_s), int(cap)
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None)  # autocommit: each put is its own commit
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS states (app TEXT, context TEXT, state BLOB, used REAL, "
                        "PRIMARY KEY (app, context))")
        self.db.execute("CREATE INDEX IF NOT EXISTS by_use ON states (used)")

    def get(self, app: str, context: str, now: float) -> dict | None:
        """The state of ``context`` in ``app``; None if it has none (or it expired)."""
        row = self.db.execute("SELECT state, used FROM states WHERE app = ? AND context = ?", (app, context)).fetchone()
        if row is None or now - row[1] > self.ttl_s:
            return None
        return orjson.loads(row[0])

    def put(self, app: str, context: str, state: dict, now: float) -> None:
        """Store (commit) ``state``; then drop expired states and, over the cap, the least
        recently used."""
        self.db.execute("INSERT OR REPLACE INTO states VALUES (?, ?, ?, ?)", (app, context, orjson.dumps(state), now))
        self.db.execute("DELETE FROM states WHERE used < ?", (now - self.ttl_s,))
        over = self.db.execute("SELECT COUNT(*) FROM states").fetchone()[0] - self.cap
        if over > 0:
            self.db.execute("DELETE FROM states WHERE rowid IN (SELECT rowid FROM states ORDER BY used LIMIT ?)", (over,))

    def contexts(self, app: str) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT context FROM states WHERE app = ? ORDER BY context", (app,))]

    def close(self) -> None:
        self.db.close()
