"""ccbench: collective-communication benchmarks with verified algorithms and cost models.

    import ccbench
    df = ccbench.load("results/")      # every record as a pandas DataFrame, one row each
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["__version__", "load"]

if TYPE_CHECKING:
    import pandas as pd


def load(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """Every record in results files or folders (.jsonl, .jsonl.gz, .parquet) as a pandas
    DataFrame: one row per record, flat typed columns (`time_median_us`, `busbw_gbps`,
    `method_timing`, `env_cpu`, ...). See ccbench/records/table.py."""
    from ccbench.records.table import load as load_frame

    return load_frame(paths)
