"""`ccbench report RESULTS... -o DIR [--model model.json]`: figures and a report.

Writes, into DIR: one figure per collective (bus bandwidth and latency against size),
overview figures, per-rank spread figures, with --model prediction-against-measurement
figures, each laid out for the --paper width, as PNG (and SVG/PDF with --formats), drawn in
parallel processes; report.md and report.html with the figures, their captions and tables
of key numbers; key-numbers.csv.
"""

from __future__ import annotations

import argparse

from ccbench.errors import UsageError
from ccbench.records import iter_result_files, load_records
from ccbench.report.data import RUN_VIEWS

__all__ = ["register", "main"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="figures (PNG, SVG, PDF) and a Markdown/HTML report from results",
        description="Bus bandwidth and latency against size per collective, per-rank spread, "
                    "key numbers; with --model, prediction against measurement.")
    parser.add_argument("results", nargs="+", help="results files (*.jsonl) or folders")
    parser.add_argument("-o", "--output", required=True,
                        help="folder for the figures and report (made if missing)")
    parser.add_argument("--model", default=None, help="model.json from `ccbench calibrate`")
    parser.add_argument("--title", default="ccbench results", help="report title (default 'ccbench results')")
    parser.add_argument("--collective", default=None,
                        help="only these collectives (comma list)")
    parser.add_argument("--backend", default=None, help="only these backends (comma list)")
    parser.add_argument("--runs", choices=RUN_VIEWS, default="pooled",
                        help="a case measured in several runs: pool their iterations "
                             "(default), show each run as a series, or only the latest")
    parser.add_argument("--formats", default="png",
                        help="figure formats, a comma list of png, svg, pdf (default png; png "
                             "always)")
    parser.add_argument("--paper", choices=("single", "double", "slides"), default="double",
                        help="the width every figure is laid out for: a single column "
                             "(3.3 in), a double column (7 in, the default) or a slide (10 in)")


def main(args: argparse.Namespace) -> int:
    from ccbench.bench.output.files import check_output_folder

    check_output_folder(args.output)
    _refuse_file_name(args.output)
    sources = [str(p) for p in iter_result_files(args.results)]
    records = load_records(*args.results, require=True)
    if args.collective:
        wanted = {c.strip() for c in args.collective.split(",") if c.strip()}
        records = [r for r in records if r.collective in wanted]
    if args.backend:
        wanted = {b.strip() for b in args.backend.split(",") if b.strip()}
        records = [r for r in records if r.backend in wanted]
    from ccbench.report.diagnose import diagnose_figures, split_diagnose
    from ccbench.report.predictions import prediction_figures, split_predictions
    from ccbench.report.traces import split_traces, trace_figures

    records, predicted = split_predictions(records)     # from `simulate -o`: own figures
    records, replayed = split_traces(records)           # from `replay -O`: own figures
    records, diagnosed = split_diagnose(records)        # from `diagnose -O`: heat maps
    if not records and not predicted and not replayed and not diagnosed:
        raise UsageError(f"no records in {', '.join(args.results)}"
                         + (" after filtering" if args.collective or args.backend else ""))
    model = None
    if args.model:
        from ccbench.report.model import load

        model = load(args.model)
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"ccbench report needs matplotlib and pandas "
                         f"(pip install 'ccbench[plot]'): {exc.name} is missing") from None
    from ccbench.report import build_report, output_directory

    formats = tuple(f.strip().lower() for f in args.formats.split(",") if f.strip())
    output_directory(args.output, formats)
    if replayed:
        for path in trace_figures(replayed, args.output, formats, args.paper):
            print(f"ccbench report: trace {path}")
    if diagnosed:
        for path in diagnose_figures(diagnosed, args.output, formats, args.paper):
            print(f"ccbench report: diagnose {path}")
    if predicted:
        for path in prediction_figures(records, predicted, args.output, formats, args.paper):
            print(f"ccbench report: predictions {path}")
    if not records:
        return 0
    report = build_report(records, args.output, model=model, sources=sources, title=args.title,
                          formats=formats, runs=args.runs, paper=args.paper)
    print(f"ccbench report: {len(report.figures)} figures ({', '.join(formats)}), "
          f"{report.markdown}, "
          f"{report.html}")
    for note in report.notes:
        print(f"ccbench report: note: {note}")
    return 0


#: names that say a file, not the folder a report is
_FILE_SUFFIXES = (".html", ".htm", ".md", ".png", ".svg", ".pdf", ".csv", ".json", ".jsonl")


def _refuse_file_name(path: str) -> None:
    """`-o r.html` would make a folder named r.html: refused, saying what -o is."""
    from pathlib import Path

    target = Path(path)
    if not target.is_dir() and target.suffix.lower() in _FILE_SUFFIXES:
        raise UsageError(f"-o {path!r} names a file; -o is the folder the figures, report.md "
                         f"and report.html are written into (e.g. -o {str(target.with_suffix(''))!r})")
