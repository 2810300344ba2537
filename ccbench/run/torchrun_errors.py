"""Under torchrun, ccbench's error line is what torchrun reports.

torchrun ends a failed run with its `ChildFailedError` report, whose "Root Cause" entry is a
worker's error file (TORCHELASTIC_ERROR_FILE, one path per worker; torch's `@record` writes a
Python traceback there). A rank of ccbench writes its one `ccbench: error: ...` line there
instead, as soon as it prints it, so the report's root cause is that line, not "To enable
traceback see ...". torchrun names as the root cause the failure with the earliest whole-second
timestamp (ties: the lowest rank), and stamps a worker that left no file (a rank that died
without a word) when it noticed it, after the rank that speaks did; the line is stamped one
second before it was said, so that it wins such a tie: it names the failure that came first.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from ccbench.errors import ERROR_PREFIX

__all__ = ["ERROR_FILE_VAR", "install", "record_line"]

ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"


def record_line(line: str, path: str) -> None:
    """Write `line` as a worker's error, in the format torchrun's report reads."""
    stamp = str(int(time.time()) - 1)
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                       "timestamp": stamp}}}
    try:
        with open(path, "w") as handle:
            json.dump(data, handle)
    except OSError:
        pass                              # torchrun then reports as it would have


class _ErrorLineTee:
    """sys.stderr as it was, which also records the first error line that goes through it."""

    def __init__(self, stream: Any, path: str) -> None:
        self._stream, self._path = stream, path
        self._pending = ""
        self._recorded = False

    def write(self, text: str) -> int:
        written = int(self._stream.write(text))
        if not self._recorded:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            self._pending = self._pending[-4096:]
            for line in lines:
                if line.startswith(ERROR_PREFIX):
                    record_line(line, self._path)
                    self._recorded = True
                    break
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def install() -> None:
    """Under torchrun (its error file named in the environment), record the error line."""
    path = os.environ.get(ERROR_FILE_VAR)
    if path and "TORCHELASTIC_RUN_ID" in os.environ and not isinstance(sys.stderr, _ErrorLineTee):
        sys.stderr = _ErrorLineTee(sys.stderr, path)
