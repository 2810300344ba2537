"""The former home of the record schema; `ccbench.records` is the one place now.

Kept so that `from ccbench.record import Record, load_records` goes on working."""

from ccbench.records import (
    SCHEMA,
    SCHEMA_VERSION,
    Record,
    append_record,
    iter_result_files,
    load_records,
    read_records,
    record_from_dict,
)

__all__ = ["SCHEMA", "SCHEMA_VERSION", "Record", "append_record", "iter_result_files",
           "load_records", "read_records", "record_from_dict"]
