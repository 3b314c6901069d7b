"""How primal-dt's long jobs take SIGINT and SIGTERM: training as a request to stop at the end of
its step (StopSignals), a sweep, which only waits for its runs, as Ctrl-C at once
(sigterm_interrupts); both then stop their work with a checkpoint saved."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler stopping the job) raises KeyboardInterrupt, as Ctrl-C does, wherever
    the job is waiting. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
