"""A client for threaded code: every call returns a ``concurrent.futures.Future``.

``FuturesClient`` runs an ``AsyncClient`` on an event loop in a thread of its own, so any
thread may call it (a ``Client`` belongs to the thread that uses it). Cancelling a future
(``future.cancel()``, or an executor shut down with ``cancel_futures=True``) cancels the
call: its frontend is told to stop the request's work, as when an ``asyncio`` task awaiting
``AsyncClient.predict`` is cancelled (docs/guide/client.md).

Example
-------
>>> with FuturesClient(["tcp://127.0.0.1:7000"]) as client:      # doctest: +SKIP
...     futures = [client.predict("digits-mlp", x) for x in rows]
...     futures[-1].cancel()                                    # the frontend drops it
...     results = [f.result() for f in futures[:-1]]
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import numpy as np

from keel.common.async_client import AsyncClient
from keel.common.results import Result

__all__ = ["FuturesClient"]


class FuturesClient:
    """``AsyncClient``'s calls (same options) as futures, from any thread."""

    def __init__(self, frontends: list[str] | str, **options):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="keel-client", daemon=True)
        self.thread.start()
        try:
            self.client: AsyncClient = self._run(self._make(frontends, options)).result()
        except BaseException:  # bad options: no thread left behind
            self._stop()
            raise

    @staticmethod
    async def _make(frontends: list[str] | str, options: dict) -> AsyncClient:
        return AsyncClient(frontends, **options)  # made on its loop's thread: its sockets live there

    def _run(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def predict(self, name: str, x: np.ndarray | dict, **options) -> concurrent.futures.Future[Result]:
        """One query (as ``AsyncClient.predict``); cancelling the future cancels the request."""
        return self._run(self.client.predict(name, x, **options))

    def feedback(self, request_id: str, y: int, timeout_ms: float | None = None) -> concurrent.futures.Future:
        return self._run(self.client.feedback(request_id, y, timeout_ms))

    def close(self) -> None:
        """Close the client (calls still in flight end cancelled) and stop its thread."""
        if self.loop.is_closed():
            return
        self._run(self._close()).result()
        self._stop()

    def _stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    async def _close(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # their Cancels leave before the sockets close
        await self.client.close()

    def __enter__(self) -> FuturesClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
