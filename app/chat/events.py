"""Plain-Python events, as napari's models have: a view subscribes a callback, the model emits.
Emitted on the thread of the controller's asyncio loop (in the window, Qt's own thread)."""
from __future__ import annotations

from collections.abc import Callable


class Event:
    def __init__(self) -> None:
        self._listeners: list[Callable] = []

    def connect(self, listener: Callable) -> None:
        self._listeners.append(listener)

    def emit(self, *args) -> None:
        for listener in list(self._listeners):
            listener(*args)
