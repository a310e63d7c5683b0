"""Who runs on the engine next: one request at a time (the engine has one KV cache per model),
the others waiting in order of arrival, at most `limit` of them. The window's chat and the API's
requests share one Turns, so neither finds the engine busy."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

Result = TypeVar("Result")


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
        # while the engine is free the first place is a turn, not a wait
        if not always and self.waiting - (0 if self.busy else 1) >= self.limit:
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

    async def take_unless(self, stop: asyncio.Event) -> bool:
        """take(), unless `stop` is set first: then the place goes back and this returns False
        (a Stop, or a client that left, while waiting)."""
        taking = asyncio.ensure_future(self.take())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({taking, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            taking.cancel()
            if taking.done() and not taking.cancelled():
                self.release()  # the turn came just as this coroutine was cancelled
            raise
        finally:
            stopping.cancel()
        if not taking.done():
            taking.cancel()
        try:
            await taking
        except asyncio.CancelledError:
            if stop.is_set():
                return False
            raise
        if stop.is_set():  # both at once: the turn passes on
            self.release()
            return False
        return True

    async def hold(self, work: Callable[[], Awaitable[Result]]) -> Result:
        """Awaits work() in a turn of its own, after the jobs queued before it: a model load,
        forgetting a chat, anything else that needs the engine to itself."""
        self.reserve(always=True)
        await self.take()
        try:
            return await work()
        finally:
            self.release()

    def release(self) -> None:
        """The engine is free again: call when the work's thread has ended (steps_of's on_end)."""
        self._lock.release()

    @property
    def busy(self) -> bool:
        return self._lock.locked()
