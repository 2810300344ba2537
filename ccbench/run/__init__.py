"""The rank lifecycle and its control plane: how ranks were started (launchers, addresses), the
control store (control, storehost), start-up waits (arrivals, guard, lifeline; SIGTERM while
a torchrun worker starts: terminated), the watchdog,
how rank processes ended (rankexits, procfs), the fault points ranks call (faults), one rank's
life around its work (lifecycle), and the supervisor `ccbench launch` runs its ranks under.

run/ sits below the benchmark (ccbench.bench.runner), the trace replay and diagnose, and above
records/: it never imports a backend, the harness or a command."""
