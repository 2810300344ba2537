"""Collective schedules as data, their symbolic verifier, and an executor over any transport.

Pure: imports numpy (and cupy, lazily, for GPU buffers); never the harness, torch or mpi4py.
See algorithms/README.md.
"""

from algorithms.registry import ALGORITHMS, REGISTRY, generate, register, supported
from algorithms.schedule import PATTERNS, Copy, Pattern, Recv, Schedule, Send, Span, Step
from algorithms.verify import VerifyResult, verify

__all__ = ["ALGORITHMS", "PATTERNS", "REGISTRY", "Copy", "Pattern", "Recv", "Schedule", "Send",
           "Span", "Step", "VerifyResult", "generate", "register", "supported", "verify"]
