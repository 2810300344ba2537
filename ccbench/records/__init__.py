"""Results records: the schema, the case identity, and the one reader and writer.

    records, report = read_records(["results/"])   # .jsonl, .jsonl.gz, folders
    report.skipped                                  # lines that were not records, with file:line
"""

from ccbench.records.identity import CASE_ID_FIELDS, CaseId, RecordKey, run_metadata
from ccbench.records.reader import (
    RESULT_SUFFIXES,
    ReadReport,
    Skipped,
    iter_result_files,
    load_records,
    read_records,
)
from ccbench.records.schema import (
    SCHEMA,
    SCHEMA_VERSION,
    SUPPORTED_VERSIONS,
    BadRecord,
    Record,
    record_from_dict,
)
from ccbench.records.writer import append_record, cut_torn_tail, write_records

__all__ = [
    "CASE_ID_FIELDS", "CaseId", "RecordKey", "run_metadata", "RESULT_SUFFIXES", "ReadReport", "Skipped",
    "iter_result_files", "load_records", "read_records", "SCHEMA", "SCHEMA_VERSION",
    "SUPPORTED_VERSIONS", "BadRecord", "Record", "record_from_dict", "append_record",
    "cut_torn_tail", "write_records",
]
