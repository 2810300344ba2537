"""Progress of long replays on stderr, apart from the table or JSON on stdout.

Silent for the first second (short replays print nothing); then, on a terminal, one line
rewritten in place at most every half second; into a file or pipe, one line every
`every` seconds. `close` ends the line so that what follows starts on its own line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["StderrProgress"]


class StderrProgress:
    def __init__(self, stream: TextIO | None = None, delay: float = 1.0, every: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stderr
        self.delay = delay
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = 0.5 if self.tty else every
        self.clock = clock
        self.label: str | None = None
        self.started = 0.0
        self.shown = 0.0
        self.open_line = False

    def __call__(self, label: str, done: int, total: int) -> None:
        now = self.clock()
        if label != self.label:
            self.close()
            self.label, self.started, self.shown = label, now, float("-inf")
        elapsed = now - self.started
        if elapsed < self.delay or (now - self.shown < self.every and done < total):
            return
        self.shown = now
        pct = 100.0 * done / total if total else 100.0
        text = f"replay {label}: round {done}/{total} ({pct:.0f}%), {elapsed:.0f} s"
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
            self.open_line = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.open_line:
            self.stream.write("\n")
            self.stream.flush()
            self.open_line = False
