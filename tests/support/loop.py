"""An asyncio event loop that is watched: ``Ticker`` counts its turns, so a test can see a
call that blocked it (a blocking send holds every other task up)."""
from __future__ import annotations

import asyncio


class Ticker:
    """``async with Ticker() as t``: ``t.ticks`` grows every 10 ms while the loop runs."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Future | None = None

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.ensure_future(self._tick())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
