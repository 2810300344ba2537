"""How long `ccbench report` takes, phase by phase, in wall-clock and CPU time.

    python benchmarks/bench_report.py results            # what `ccbench report results` does
    python benchmarks/bench_report.py results --paper single --formats png,svg

Phases: loading the records, the tidy frame, the sweep figures (drawn in worker processes:
their CPU time is the children's), the diagnose/trace figures, and the whole command as
`ccbench report` runs it (a subprocess). The machine is shared: each line gives the load
average beside the times, and CPU time is the number that does not depend on the others'
load (wall >= CPU / cores on an idle machine).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Phase:
    def __init__(self, name: str, rows: list[tuple[str, float, float, str]]) -> None:
        self.name, self.rows = name, rows

    def __enter__(self) -> Phase:
        self.wall, self.cpu = time.perf_counter(), _cpu()
        return self

    def __exit__(self, *_: object) -> None:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        self.rows.append((self.name, time.perf_counter() - self.wall, _cpu() - self.cpu, load))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--paper", default="double")
    parser.add_argument("--formats", default="png")
    args = parser.parse_args()
    formats = tuple(args.formats.split(","))
    rows: list[tuple[str, float, float, str]] = []
    from ccbench.records import load_records
    from ccbench.report import build_report
    from ccbench.report.data import to_frame
    from ccbench.report.diagnose import split_diagnose
    from ccbench.report.predictions import split_predictions
    from ccbench.report.traces import split_traces

    with Phase("load the records", rows):
        records = load_records(*args.results, require=True)
    records, _ = split_predictions(records)
    records, _ = split_traces(records)
    records, diagnosed = split_diagnose(records)
    with Phase("the tidy frame", rows):
        to_frame(records)
    with tempfile.TemporaryDirectory() as out:
        with Phase("report of the sweep records (frame, figures, documents)", rows):
            report = build_report(records, Path(out) / "r", formats=formats, paper=args.paper)
        if diagnosed:
            from ccbench.report.diagnose import diagnose_figures

            with Phase(f"diagnose figures ({len({r.run_id for r in diagnosed})} runs)", rows):
                diagnose_figures(diagnosed, Path(out) / "d", formats, args.paper)
        with Phase("`ccbench report` (the whole command)", rows):
            subprocess.run([sys.executable, "-m", "ccbench", "report", *args.results, "-o",
                            str(Path(out) / "c"), "--paper", args.paper, "--formats",
                            args.formats], check=True, stdout=subprocess.DEVNULL)
    print(f"{len(records)} sweep records, {len(diagnosed)} diagnose records, "
          f"{len(report.figures)} sweep figure pages; {os.cpu_count()} cores; "
          f"paper {args.paper}, formats {args.formats}")
    print("| phase | wall s | CPU s | load average (1, 5, 15 min) at its end |")
    print("|---|---:|---:|---|")
    for name, wall, cpu, load in rows:
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {load} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
