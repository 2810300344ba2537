"""ccbench: collective-communication benchmarks with verified algorithms and cost models."""

__version__ = "0.1.0"
__all__ = ["__version__"]
