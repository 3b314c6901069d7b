"""Progress of training and recording: tqdm's bar where stderr is a terminal; where it is not (output redirected
to a file, a sweep's train.log), a plain line every `interval` seconds, so a log file gets a few
readable lines instead of a bar redrawn at every step."""

from __future__ import annotations

import sys
import time
from typing import IO, Any, TypeAlias

from tqdm.auto import tqdm

LINE_INTERVAL = 30.0  # seconds between progress lines when stderr is not a terminal


class LineProgress:
    """The part of tqdm's interface the training loop uses, printing a line at most every
    `interval` seconds and one at the end: step, percentage, speed, time left and the postfix."""

    def __init__(
        self,
        total: int,
        initial: int,
        desc: str,
        interval: float = LINE_INTERVAL,
        file: IO[str] | None = None,
        unit: str = "step",
    ) -> None:
        self.total, self.n, self.desc, self.interval = total, initial, desc, interval
        self.unit = unit
        self.file = file or sys.stderr
        self.postfix: dict[str, Any] = {}
        self._start_n, self._start = initial, time.monotonic()
        self._printed_n, self._printed = initial, self._start

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._printed >= self.interval:
            self._print()

    def set_postfix(self, refresh: bool = False, **values: Any) -> None:
        self.postfix = values

    def write(self, line: str, file: IO[str] | None = None) -> None:
        print(line, file=file or self.file, flush=True)

    def close(self) -> None:
        if self.n != self._printed_n:
            self._print()

    def _print(self) -> None:
        now = time.monotonic()
        rate = (self.n - self._start_n) / max(now - self._start, 1e-9)
        done = f"{self.unit} {self.n}/{self.total} ({100 * self.n / self.total:.0f}%)"
        parts = [f"{self.desc}: {done}" if self.desc else done]
        if rate > 0:
            parts.append(f"{rate:.2f} {self.unit}s/s, {(self.total - self.n) / rate:.0f} s left")
        parts += [f"{key}={value}" for key, value in self.postfix.items()]
        self.write(", ".join(parts))
        self._printed_n, self._printed = self.n, now


Progress: TypeAlias = tqdm | LineProgress


def progress_bar(
    total: int, initial: int, desc: str, enabled: bool, unit: str = "step"
) -> Progress:
    """A bar on a terminal, progress lines elsewhere, nothing where progress is turned off."""
    if enabled and not sys.stderr.isatty():
        return LineProgress(total, initial, desc, unit=unit)
    return tqdm(
        total=total, initial=initial, disable=not enabled, desc=desc, unit=unit, dynamic_ncols=True
    )
