"""SIGINT to a rank after its run is done: the work, the closing barrier and the control store
are behind it, but the process still writes, closes its backend, finalizes MPI and runs its
exit handlers. Raised there, the interrupt cut that teardown short: a bare `ccbench:
interrupted` (or an `Exception ignored in atexit callback` traceback and exit status 0), MPI
peers left waiting in MPI_Finalize until their exit alarm, a store host gone before the others
said bye. Instead, from the end of the run until the process exits, SIGINT is noted and the
teardown goes on; the last exit handler (registered first, so it runs last) finalizes MPI while
Python can still note a signal, and, if one came, says it in one line and ends the process with
status 130. Every record is already whole on disk by then. Without one, the rank ends there too
(status 0): what is left, the interpreter's and the libraries' own teardown, would run with
the default SIGINT action back in place."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["arm", "hold", "held_status"]

_UNSET = object()
_state: dict[str, Any] = {"armed": False, "label": None, "rank": None, "noted": None,
                          "status": _UNSET}


def arm() -> None:
    """At the start of the process, before any library registers its own exit handlers."""
    if not _state["armed"]:
        _state["armed"] = True
        atexit.register(_at_exit)


def hold(label: Callable[[], str], rank: int) -> bool:
    """From here until the process exits, SIGINT is noted instead of raised (where `arm` ran:
    a process that goes on to other work keeps its handler). Returns whether it holds."""
    if not _state["armed"]:
        return False
    _state["label"], _state["rank"] = label, rank

    def noted(_signum: int, _frame: object) -> None:
        if _state["noted"] is None:
            try:
                _state["noted"] = _state["label"]()
            except Exception:  # noqa: BLE001  the line only needs a label
                _state["noted"] = "the end of the run"

    try:
        signal.signal(signal.SIGINT, noted)
    except ValueError:                      # not the main thread: leave it as it is
        return False
    return True


def held_status(status: str | int | None) -> None:
    """The run's own exit status: a late interrupt is said only when the run succeeded (a
    failed rank has said why already)."""
    _state["status"] = status


def _at_exit() -> None:
    status = _state["status"]
    if _state["label"] is None or status is _UNSET or status not in (0, None):
        return
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:                     # while a signal can still be noted
        with contextlib.suppress(Exception):
            if mpi.Is_initialized() and not mpi.Is_finalized():
                mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    from ccbench.errors import error_line
    from ccbench.run.secretfile import remove_written

    remove_written()
    label = _state["noted"]
    if label is None:
        # what is left (the interpreter's own teardown, the libraries' destructors: seconds for
        # torch on a loaded machine) would run with Python's handlers reset to the default, a
        # SIGINT then killing the rank without a word: the run is whole, the rank ends here
        os._exit(0)
    with contextlib.suppress(OSError, ValueError):
        print(error_line(f"{label}: rank {_state['rank']} was interrupted (SIGINT) after the "
                         f"run was done; every record is kept"), file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGINT)
