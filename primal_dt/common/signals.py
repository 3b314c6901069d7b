"""SIGINT and SIGTERM as a request to stop, so a long job ends at a point of its choosing."""

from __future__ import annotations

import signal
import threading
from typing import Any


class StopSignals:
    """Turn SIGINT/SIGTERM into a request to stop (`signum` is set), so that training can finish
    its step, save a checkpoint and flush its logs instead of dying halfway through a write. A
    second signal interrupts at once (KeyboardInterrupt). Outside the main thread, where Python
    cannot install handlers, it does nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> StopSignals:
        if not self._previous and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
