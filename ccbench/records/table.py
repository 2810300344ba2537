"""Records as a flat table: `ccbench.load(paths) -> DataFrame`, CSV rows, and Parquet files.

One row per record. Nested blocks become prefixed scalar columns (`time_median_us`,
`method_timing`, `env_cpu` ...); the per-iteration and per-rank lists stay list columns;
`hosts` is a comma list. A Parquet file also keeps each record's JSON line (column `record`),
so reading it back gives exactly the records that were written.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ccbench.errors import UsageError
from ccbench.records.schema import Record, record_from_dict
from ccbench.safeio import MAX_JSON_DEPTH, json_too_deep

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PARQUET_SUFFIX", "TIME_STATS", "finish_parquet", "flat_row", "journal_path", "load",
           "read_parquet", "to_frame", "write_parquet"]

PARQUET_SUFFIX = ".parquet"
TIME_STATS = ("median", "mean", "min", "p5", "p95", "max", "stdev")
_LISTS = ("samples_us", "rank_median_us")
_INTS = ("world_size", "nodes", "ranks_per_node", "root", "size_asked", "size_used", "count",
         "iterations", "warmup", "schema_version")


def _scalar(value: Any) -> Any:
    """Nested values that are not plain scalars become JSON text, so every column is flat."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True)


# open-shaped: the columns come from the records (their method and environment keys)
def flat_row(record: Record, lists: bool = True) -> dict[str, Any]:
    """The record as one flat mapping (the CSV row; the DataFrame row with `lists`)."""
    data = asdict(record)
    row: dict[str, Any] = {}
    for name, value in data.items():
        if name == "time_us":
            row.update({f"time_{stat}_us": value.get(stat) for stat in TIME_STATS})
        elif name in ("method", "environment"):
            prefix = "method" if name == "method" else "env"
            row.update({f"{prefix}_{key}": _scalar(v) for key, v in sorted(value.items())})
        elif name == "hosts":
            row["hosts"] = ",".join(value)
        elif name in _LISTS:
            if lists:
                row[name] = list(value or [])
        else:
            row[name] = value
    return row


def to_frame(records: Sequence[Record]) -> pd.DataFrame:
    """One typed row per record, in the order given."""
    import pandas as pd

    frame = pd.DataFrame([flat_row(r) for r in records])
    if frame.empty:
        return frame
    for name in _INTS:
        frame[name] = frame[name].astype("int64")
    frame["inplace"] = frame["inplace"].astype(bool)
    frame["wrong"] = frame["wrong"].astype("Int64")        # None: not checked
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    # `size`: the bytes the table's size column shows (size_used), the name a reader looks for
    frame.insert(int(frame.columns.get_loc("size_used")) + 1, "size", frame["size_used"])
    for name in [c for c in frame.columns if c.startswith("time_") or c.endswith("_gbps")]:
        frame[name] = frame[name].astype("float64")
    return frame


def load(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """Every record in the given results files and folders (.jsonl, .jsonl.gz, .parquet) as a
    pandas DataFrame, one row per record::

        import ccbench
        df = ccbench.load("results/")
        df.groupby(["backend", "size"]).time_median_us.median()

    `size` is `size_used`, the bytes of the table's size column (`size_asked`: as requested).
    """
    from ccbench.records.reader import load_records

    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return to_frame(load_records(*items))


def write_parquet(path: str | os.PathLike[str], records: Sequence[Record]) -> int:
    """Write the records as a Parquet file (atomically), with each record's JSON line kept."""
    frame = to_frame(records)
    if not frame.empty:
        frame["record"] = [r.to_json() for r in records]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    from ccbench.safeio import write_atomic

    def write(handle: IO[bytes]) -> None:
        try:
            frame.to_parquet(handle, index=False)
        except ImportError as exc:
            raise UsageError(f"writing {str(out)!r} needs pyarrow (pip install pyarrow): {exc}"
                             ) from None

    write_atomic(out, write)
    return len(records)


def read_parquet(path: str | os.PathLike[str]) -> list[Record]:
    """The records a ccbench Parquet file holds (its `record` column)."""
    import pandas as pd

    try:
        frame = pd.read_parquet(path, columns=["record"])
    except ImportError as exc:
        raise UsageError(f"reading {str(path)!r} needs pyarrow (pip install pyarrow): {exc}"
                         ) from None
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"{str(path)!r} is not a ccbench Parquet file ({exc})") from None
    records = []
    for row, text in enumerate(frame["record"], start=1):
        try:
            if json_too_deep(text.encode("utf-8")) is not None:
                raise UsageError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
            records.append(record_from_dict(json.loads(text)))
        except UsageError as exc:
            raise UsageError(f"{path}: row {row}: {exc}") from None
        except (ValueError, TypeError, AttributeError) as exc:   # BadRecord is a ValueError
            raise UsageError(f"{str(path)!r}: a row is not a ccbench record ({exc})") from None
    return records


def journal_path(output: str | os.PathLike[str]) -> str:
    """Where a run appends its records, each fsynced as its size finishes: the output itself,
    or for a Parquet output (which cannot be appended to) a JSON-lines journal beside it."""
    text = os.fspath(output)
    return text + ".partial.jsonl" if text.endswith(PARQUET_SUFFIX) else text


def finish_parquet(output: str | os.PathLike[str]) -> int:
    """Fold the journal of a finished run into the Parquet output (after what it held before)
    and remove the journal. Done under the journal's append lock (and the output's, as merge
    takes it), so runs that share one output and end together fold each record once: one
    finds the journal gone (another folded it: 0), and one still appending waits, then starts
    a journal of its own. A run that dies leaves the journal: `ccbench merge` reads it."""
    from ccbench.records.reader import load_records
    from ccbench.records.writer import _locked, rewriting

    if not os.fspath(output).endswith(PARQUET_SUFFIX):
        return 0
    journal = journal_path(output)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_locked(journal, create=False))
        except FileNotFoundError:
            return 0
        with rewriting(output):
            before = read_parquet(output) if Path(output).exists() else []
            new = load_records(journal)
            write_parquet(output, [*before, *new])
        os.unlink(journal)
    return len(new)
