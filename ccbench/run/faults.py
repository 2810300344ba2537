"""Fault points: `CCBENCH_FAULT=PHASE:RANK:ACTION`
makes one rank really die, stop or exit at a chosen point, so every phase can be hit on time.

Phases: before-connect (start-up, while the rank has not connected to the control store yet:
the victim first waits CCBENCH_FAULT_LATE_S seconds, default 12, so that the other ranks have
connected and wait for it, as when a rank dies while its interpreter starts on a loaded
machine), start-up (before the control store and MPI_Init; where the store is up before any
rank starts, between connecting and MPI_Init), init (the backend's initialisation), mid-run
(the third measured size), shutdown (after the last record, before the closing barrier).
Actions: kill (SIGKILL), stop (SIGSTOP), exit (status 1, silent),
unreachable (start-up only: the control store address becomes one that does not resolve),
and, outside the fault matrix, raise (mid-run: a library error on this rank alone, a
RuntimeError as a library raises one).
Outside the fault matrix too: done:RANK:interrupt (SIGINT to the rank itself once its run is
done: records written, the control store closed, its backend and MPI still to be torn down).
Not a fault but the same hook: late (start-up or init: sleep CCBENCH_FAULT_LATE_S seconds, default
12, as a rank on a loaded machine may take to start; the run must not fail for it).
Unset, every call is a dictionary lookup that does nothing.
"""

from __future__ import annotations

import os
import signal
import time

from ccbench.errors import UsageError

__all__ = ["ACTIONS", "DONE", "INTERRUPT", "LATE", "MID_RUN_STEP", "PHASES", "RAISE",
           "UNREACHABLE_HOST", "inject", "planned"]

PHASES = ("before-connect", "start-up", "init", "mid-run", "shutdown")
ACTIONS = ("kill", "stop", "exit", "unreachable")
LATE = "late"                                  # not a fault: a rank that starts late
RAISE = "raise"                                # a library error on one rank (not in the matrix)
DONE = "done"                                  # the run done, its teardown ahead (not in the matrix)
INTERRUPT = "interrupt"                        # SIGINT to the rank itself (not in the matrix)
UNREACHABLE_HOST = "control-store.invalid"     # .invalid never resolves (RFC 2606)
MID_RUN_STEP = 3


def planned(rank: int) -> tuple[str, str] | None:
    """(phase, action) planned for this rank, or None."""
    spec = os.environ.get("CCBENCH_FAULT")
    if not spec:
        return None
    try:
        phase, victim, action = spec.split(":")
        victim_rank = int(victim)
    except ValueError:
        raise UsageError(f"CCBENCH_FAULT={spec!r} (valid: PHASE:RANK:ACTION)") from None
    if phase not in (*PHASES, DONE) or action not in (*ACTIONS, LATE, RAISE, INTERRUPT):
        raise UsageError(f"CCBENCH_FAULT={spec!r} (valid phases: {', '.join((*PHASES, DONE))}; "
                         f"actions: {', '.join((*ACTIONS, LATE, RAISE, INTERRUPT))})")
    return (phase, action) if victim_rank == rank else None


def inject(phase: str, rank: int) -> None:
    """Carry out the planned fault if it is for this phase and rank."""
    plan = planned(rank)
    if plan is None or plan[0] != phase:
        return
    action = plan[1]
    if action == LATE or phase == "before-connect":
        time.sleep(float(os.environ.get("CCBENCH_FAULT_LATE_S", "12")))
    if action == LATE:
        return
    log = os.environ.get("CCBENCH_FAULT_LOG")
    if log:                              # when the fault happened, for the stop-time figures
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{time.time()}\n")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "exit":
        os._exit(1)
    elif action == INTERRUPT:
        os.kill(os.getpid(), signal.SIGINT)
    elif action == RAISE:
        raise RuntimeError(f"injected library error on rank {rank} ({phase})")
