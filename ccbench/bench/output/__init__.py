"""What a benchmark run writes, by job: `files.py` (the output-file policy: which records file a
run may append to, checked before any rank starts, and where it keeps them when none is named),
the writers of --format (`table.py`, nccl-tests' table and the interface of every writer;
`json_lines.py`, `csv_rows.py`, `osu.py`; `writers.py` picks one) and `progress.py` (the bar
and the status line)."""
