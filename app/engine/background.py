"""The engine's blocking work (a load, an answer, a read-ahead) on threads of its own, awaited from
an asyncio loop: the window's (qasync, the Qt loop itself) or a server's. Each thread is named
`specchat-...`, so an exit that finds one still running can tell (ui/app.leave_work_behind)."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

Result = TypeVar("Result")
_DONE = object()


def in_thread(name: str, work: Callable[[], Result]) -> asyncio.Future[Result]:
    """work() on a new thread; its result (or exception) resolves the future on the running loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Result] = loop.create_future()

    def settle(outcome, failed: bool) -> None:
        if not future.done():  # cancelled meanwhile: nobody waits for it any more
            future.set_exception(outcome) if failed else future.set_result(outcome)

    def run() -> None:
        try:
            outcome, failed = work(), False
        except BaseException as error:  # handed to whoever awaits
            outcome, failed = error, True
        call_soon(loop, settle, outcome, failed)

    threading.Thread(target=run, name=f"specchat-{name}", daemon=True).start()
    return future


class steps_of:  # noqa: N801 (used as a function: `async for step in steps_of(...)`)
    """The items of the iterator steps() makes, computed on a thread of its own, which starts now,
    and handed to the running loop as they come (an error of the iterator is raised here).

    A consumer that leaves early (a closed window, a client gone) sets `cancel`, and the iterator
    stops at its next check. on_end() runs on the loop once the thread has ended, whatever the
    consumer did meanwhile: what frees the engine for the next request belongs there, not in a
    coroutine's `finally`, which a cancellation may cut short."""

    def __init__(self, name: str, steps: Callable[[], Iterator], cancel: threading.Event,
                 on_end: Callable[[], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._items: asyncio.Queue = asyncio.Queue()

        def run() -> None:
            last = _DONE
            try:
                for item in steps():
                    call_soon(loop, self._items.put_nowait, item)
            except BaseException as error:
                last = error
            finally:
                # on_end first: a consumer that sees the end finds the engine already free
                if on_end is not None:
                    call_soon(loop, on_end)
                call_soon(loop, self._items.put_nowait, last)

        threading.Thread(target=run, name=f"specchat-{name}", daemon=True).start()

    def __aiter__(self) -> AsyncIterator:
        return self

    async def __anext__(self):
        item = await self._items.get()
        if item is _DONE:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item


def call_soon(loop: asyncio.AbstractEventLoop, callback: Callable, *args) -> None:
    """callback(*args) on `loop`'s thread; nothing when the loop has closed (the app is exiting)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass
