"""The benchmark: ccbench's own measurement of collectives, on every rank.

- `options.py` -- every benchmark option, declared once (`Method`, `RUN_OPTIONS`,
  `BENCH_OPTIONS`): flags, sweep keys, CCBENCH_ variables, limits, record.method;
- `runner.py` -- one run: backends in turn, a record per finished size;
- `harness.py` -- one (case, size): buffers, warm-up, timed iterations, checks;
- `validation.py` -- the inputs and the expected outputs, compared bit for bit;
- `stats.py` -- the statistics of a sample and of two (bootstrap, Welch);
- `repeats.py` -- `ccbench launch --repeat`: the launches and their spread;
- `familiar.py` -- other tools' flags (nccl-tests, OSU, PARAM) and the combine labels;
- `output/` -- by job: `files.py` (the output-file policy), the writers of --format
  (`table.py`, `json_lines.py`, `csv_rows.py`, `osu.py`; `writers.py` picks one) and
  `progress.py` (the bar).

Importing this package imports none of its modules: `ccbench.bench.options` and
`ccbench.bench.stats` are read by sweeps, reports and commands without a backend loading.
"""
