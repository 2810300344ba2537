"""The two timeouts every layer shares: the defaults of --timeout and --connect-timeout
(declared as options in ccbench/bench/options.py). Plain numbers that import nothing, so that
the control plane (ccbench.run) and the backends use them without importing the benchmark."""

from __future__ import annotations

__all__ = ["CONNECT_TIMEOUT_S", "DEFAULT_TIMEOUT_S"]

#: seconds one operation (and a library's initialisation) may take before the run is stopped
DEFAULT_TIMEOUT_S = 300.0
#: seconds a rank may take to reach the control store (at most --timeout)
CONNECT_TIMEOUT_S = 30.0
