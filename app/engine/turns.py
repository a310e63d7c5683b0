"""Who runs on the engine next: one request at a time (the engine has one KV cache per model),
the others waiting in order of arrival, at most `limit` of them. The window's chat and the API's
requests share one Turns, so neither finds the engine busy."""
from __future__ import annotations

import asyncio


class QueueFull(Exception):
    """More requests wait than the queue holds: come back shortly."""


class Turns:
    def __init__(self, limit: int = 16) -> None:
        self.limit = limit
        self.waiting = 0  # places reserved, turns not yet taken
        self._lock = asyncio.Lock()  # fair: waiters get it in order

    def reserve(self, always: bool = False) -> None:
        """A place in the queue, taken when the request arrives (so that a full queue is refused
        before anything is sent); always: the window's own chat, which waits however long."""
        if self.waiting >= self.limit and not always:
            raise QueueFull(f"{self.waiting} requests are waiting for the model")
        self.waiting += 1

    def give_back(self) -> None:
        """A reserved place not taken after all."""
        self.waiting -= 1

    async def take(self) -> None:
        """Waits for the turn a reservation holds a place for (a cancelled wait gives it up)."""
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1

    def release(self) -> None:
        """The engine is free again: call when the work's thread has ended (steps_of's on_end)."""
        self._lock.release()

    @property
    def busy(self) -> bool:
        return self._lock.locked()
