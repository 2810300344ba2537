"""How far a run is, on rank 0: a tqdm bar of sizes on a terminal, a status line on stderr
every CCBENCH_STATUS_INTERVAL seconds otherwise."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO, cast

__all__ = ["Progress"]


def _is_terminal(stream: TextIO, variable: str) -> bool:
    """Under `ccbench launch` (and its mpiexec) a rank's streams may be pipes to the launcher,
    which says in `variable` whether its own stream is a terminal."""
    try:
        return stream.isatty() or os.environ.get(variable) == "1"
    except ValueError:                    # a closed stream
        return False


class _BarSafeStream:
    """Table rows on the terminal the bar is drawn on: each whole line is written with the bar
    cleared and redrawn after it, so a row and the bar never share a line."""

    def __init__(self, stream: TextIO, bar: Any) -> None:
        self._stream, self._bar, self._partial = stream, bar, ""

    def write(self, text: str) -> int:
        self._partial += text
        if "\n" in self._partial:
            whole, _, self._partial = self._partial.rpartition("\n")
            self._bar.clear()
            self._stream.write(whole + "\n")
            self._stream.flush()
            self._bar.refresh()
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return True


class Progress:
    """How far the run is, on rank 0 unless --quiet.

    On a terminal: a tqdm bar of sizes drawn on the terminal the table goes to (rows pass
    through `rows()`, which clears the bar for each row), with the iteration inside the current
    size shown when a size takes a while. Without a terminal: one short status line on stderr
    every CCBENCH_STATUS_INTERVAL seconds (default 30) while the run lasts."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar: Any = None
        self._total, self._done, self._label = total, 0, ""
        self._inner: tuple[int, int] | None = None
        self._start = self._shown = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not enabled:
            return
        stdout_tty = _is_terminal(sys.stdout, "CCBENCH_STDOUT_TTY")
        if stdout_tty or _is_terminal(sys.stderr, "CCBENCH_STDERR_TTY"):
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, unit="size", file=sys.stdout if stdout_tty
                             else sys.stderr, leave=False, dynamic_ncols=True)
            self._bar_on_stdout = stdout_tty
            return
        interval = float(os.environ.get("CCBENCH_STATUS_INTERVAL", "30"))
        self._thread = threading.Thread(target=self._report, args=(interval,), daemon=True,
                                        name="ccbench-status")
        self._thread.start()

    def rows(self, stream: TextIO) -> TextIO:
        """The stream the table should print to: bar-safe when the bar shares it."""
        if self._bar is not None and self._bar_on_stdout and stream is sys.stdout:
            return cast(TextIO, _BarSafeStream(stream, self._bar))
        return stream

    def step(self, label: str) -> None:
        """One size finished; `label` names it."""
        self._done += 1
        self._inner = None
        self._label = label
        if self._bar is not None:
            self._bar.set_description(label, refresh=False)
            self._bar.set_postfix_str("", refresh=False)
            self._bar.update(1)

    def sample(self, label: str, done: int, total: int) -> None:
        """Inside a size: `done` of `total` iterations (shown at most twice a second)."""
        self._label, self._inner = label, (done, total)
        now = time.monotonic()
        if self._bar is not None and now - self._shown > 0.5:
            self._shown = now
            self._bar.set_description(label, refresh=False)
            self._bar.set_postfix_str(f"iteration {done}/{total}")

    def status_line(self) -> str:
        elapsed = time.monotonic() - self._start
        inner = f", iteration {self._inner[0]}/{self._inner[1]}" if self._inner else ""
        now = f"; now {self._label}{inner}" if self._label else ""
        return (f"ccbench: {self._done}/{self._total} sizes done{now} "
                f"({int(elapsed // 60)}m{int(elapsed % 60):02d}s)")

    def _report(self, interval: float) -> None:
        while not self._stop.wait(interval):
            print(self.status_line(), file=sys.stderr, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._bar is not None:
            self._bar.close()
