"""Collective schedules as data, their symbolic verifier, and an executor over any transport.

Pure: imports numpy (and cupy, lazily, for GPU buffers); never the harness, torch or mpi4py.
See algorithms/README.md.
"""

from algorithms.registry import ALGORITHMS, COLLECTIVES, REGISTRY, generate, register, supported
from algorithms.schedule import Copy, Recv, Schedule, Send, Span, Step
from algorithms.verify import VerifyResult, verify

__all__ = ["ALGORITHMS", "COLLECTIVES", "REGISTRY", "Copy", "Recv", "Schedule", "Send", "Span",
           "Step", "VerifyResult", "generate", "register", "supported", "verify"]
