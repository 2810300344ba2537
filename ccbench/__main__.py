"""`python -m ccbench ...` and the `ccbench` console script: what every rank and launcher
runs. Ctrl-C (or a launcher passing SIGINT on) can come while the interpreter still imports
ccbench's commands and libraries, before cli.main handles it: that too ends with one line and
status 130, not a traceback. An error that is a defect of ccbench prints its traceback and
ends the process as a failed rank does (ccbench.run.exit: an MPI rank does not then wait in
MPI_Finalize for peers that are gone)."""

import sys


def _interrupted() -> None:
    try:
        print("ccbench: interrupted", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    sys.exit(130)


def entry() -> None:
    """Run the command line; the imports are inside so that an interrupt during them is
    answered as one during the run is."""
    try:
        from ccbench.run import late_interrupt

        late_interrupt.arm()    # first, so that its exit handler runs last
        from ccbench.run.terminated import Terminated
        from ccbench.run.terminated import install as catch_sigterm

        catch_sigterm()         # under torchrun, SIGTERM before the watchdog runs is one line
    except KeyboardInterrupt:
        _interrupted()
    try:
        from ccbench.cli import main
        from ccbench.run.exit import leave
        from ccbench.run.torchrun_errors import install

        install()               # under torchrun, its report names ccbench's error line
        status: str | int | None
        try:
            status = main()
        except SystemExit as end:
            status = end.code
        except Exception:  # noqa: BLE001  a defect: its traceback, then no MPI_Finalize wait
            import traceback

            traceback.print_exc()
            status = 1
    except KeyboardInterrupt:
        _interrupted()
    except Terminated:
        from ccbench.run.terminated import leave as leave_terminated

        leave_terminated()
    late_interrupt.held_status(status)
    leave(status)


if __name__ == "__main__":
    entry()
