"""How a rank's process ends.

A rank that ends in failure (an error it said, an interruption) must not wait in MPI_Finalize,
which mpi4py calls at interpreter exit: finalizing is collective, and a peer that is stopped,
gone or itself waiting for this rank would hold it there for ever, and with it mpiexec, its
proxy and `ccbench launch`. So such a rank leaves at once (its output flushed; its records are
already whole on disk, ccbench.records), the way a killed rank would, which every MPI's
mpiexec handles. A rank that succeeded finalizes as usual (bounded by the exit alarm that
ccbench.run.lifecycle arms).
"""

from __future__ import annotations

import os
import sys

__all__ = ["leave", "skip_finalize"]

#: set by a command whose rank ends with 0 while a peer ends in failure on purpose (diagnose:
#: rank 0 ends with the verdict's 1, the others with 0): that peer skips MPI_Finalize, and
#: this rank would wait there for it until the exit alarm (5 minutes, the whole job held)
_SKIP = {"finalize": False}


def skip_finalize() -> None:
    """This rank, too, leaves without MPI_Finalize, whatever its status."""
    _SKIP["finalize"] = True


def _mpi_running() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return False
    try:
        return bool(mpi.Is_initialized() and not mpi.Is_finalized())
    except Exception:  # noqa: BLE001  whatever state MPI is in, exit normally
        return False


def leave(status: str | int | None) -> None:
    """sys.exit(status), except that a failed MPI rank (or one told to: skip_finalize)
    skips MPI_Finalize."""
    code = status if isinstance(status, int) else 0 if status is None else 1
    if (code != 0 or _SKIP["finalize"]) and _mpi_running():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        from ccbench.run.secretfile import remove_written

        remove_written()                      # atexit does not run
        os._exit(code)
    sys.exit(status)
