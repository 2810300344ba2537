"""What a benchmark run writes: the output-file policy, the writers of --format and the
progress bar (`files.py`)."""
