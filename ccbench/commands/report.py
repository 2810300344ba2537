"""`ccbench report RESULTS... -o DIR [--model model.json]`: figures and a report.

Writes, into DIR: one figure per collective (bus bandwidth and latency against size),
overview figures, per-rank spread figures, with --model prediction-against-measurement
figures, each as PNG and SVG; report.md and report.html with the figures and tables of
key numbers; key-numbers.csv.
"""

from __future__ import annotations

import argparse

from ccbench.errors import UsageError
from ccbench.records import iter_result_files, load_records
from ccbench.report.data import RUN_VIEWS

__all__ = ["register", "main"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="figures (PNG, SVG) and a Markdown/HTML report from results",
        description="Bus bandwidth and latency against size per collective, per-rank spread, "
                    "key numbers; with --model, prediction against measurement.")
    parser.add_argument("results", nargs="+", help="results files (*.jsonl) or folders")
    parser.add_argument("-o", "--output", required=True, help="folder for the figures and report")
    parser.add_argument("--model", default=None, help="model.json from `ccbench calibrate`")
    parser.add_argument("--title", default="ccbench results", help="report title (default 'ccbench results')")
    parser.add_argument("--collective", default=None,
                        help="only these collectives (comma list)")
    parser.add_argument("--backend", default=None, help="only these backends (comma list)")
    parser.add_argument("--runs", choices=RUN_VIEWS, default="pooled",
                        help="a case measured in several runs: pool their iterations "
                             "(default), show each run as a series, or only the latest")
    parser.add_argument("--formats", default="png,svg",
                        help="figure formats: png,svg (default) or png")


def main(args: argparse.Namespace) -> int:
    from ccbench.output import check_output_folder

    check_output_folder(args.output)
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
    from ccbench.report import build_report

    formats = tuple(f.strip().lower() for f in args.formats.split(",") if f.strip())
    if replayed:
        for path in trace_figures(replayed, args.output, formats):
            print(f"ccbench report: trace {path}")
    if diagnosed:
        for path in diagnose_figures(diagnosed, args.output, formats):
            print(f"ccbench report: diagnose {path}")
    if predicted:
        for path in prediction_figures(records, predicted, args.output, formats):
            print(f"ccbench report: predictions {path}")
    if not records:
        return 0
    report = build_report(records, args.output, model=model, sources=sources, title=args.title,
                          formats=formats, runs=args.runs)
    print(f"ccbench report: {len(report.figures)} figures ({', '.join(formats)}), "
          f"{report.markdown}, "
          f"{report.html}")
    for note in report.notes:
        print(f"ccbench report: note: {note}")
    return 0
