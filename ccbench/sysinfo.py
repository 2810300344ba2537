"""Facts about this machine that records and `ccbench doctor` both report."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The processor's marketing name from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
