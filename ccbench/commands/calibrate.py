"""`ccbench calibrate RESULTS... -o model.json`: fit alpha-beta-gamma cost models to records.

Prints one goodness-of-fit row per group (R^2 in log space, median and max relative
error, held-out error) and writes the model file. `--validate 2,4:3` also fits on the
world sizes before the colon only and prints predicted against measured time at the
ones after it (median and p90 relative error per group).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ccbench.errors import UsageError
from ccbench.records import Record, load_records

if TYPE_CHECKING:
    from ccbench.model.fit import FitEntry, ValidationRow, ValidationSummary

__all__ = ["register", "main", "parse_validate"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("calibrate", help="fit alpha-beta-gamma cost models to results")
    parser.add_argument("results", nargs="+", help="results files (*.jsonl) or folders")
    parser.add_argument("-o", "--output", default="model.json", help="model file (default model.json)")
    parser.add_argument("--bootstrap", type=int, default=200,
                        help="bootstrap replicates for the confidence intervals, 0 to skip (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--backend", default=None, help="only records of this backend")
    parser.add_argument("--collective", default=None, help="only records of this collective")
    parser.add_argument("--validate", default=None, metavar="TRAIN:TEST",
                        help="e.g. 2,4:3 -- fit on world sizes 2 and 4 only, predict 3")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="print the fits as a table or as JSON (default table)")
    parser.set_defaults(func=main)


def parse_validate(text: str) -> tuple[list[int], list[int]]:
    train_text, sep, test_text = text.partition(":")
    try:
        train = [int(x) for x in train_text.split(",") if x.strip()]
        test = [int(x) for x in test_text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"malformed --validate {text!r} (example: 2,4:3)") from None
    if not sep or not train or not test:
        raise UsageError(f"malformed --validate {text!r}: need the training world sizes, a "
                         f"colon and the world sizes to predict (example: 2,4:3)")
    if set(train) & set(test):
        raise UsageError(f"--validate {text!r}: a world size is both fitted and predicted")
    return train, test


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def goodness_table(fits: list[FitEntry]) -> str:
    from ccbench.model.fit import piece_end

    head = ("backend", "library", "collective", "algorithm", "formula", "p", "alpha_us",
            "alpha_ci95_us", "beta_GBps", "beta_ci95_GBps",
            "gamma_GBps", "R2_log", "med_err", "max_err", "holdout", "notes")
    rows = [head]
    for f in fits:
        beta_bw = f"{1e-9 / f['beta']:.3g}" if f["beta"] > 0 else "inf"
        gamma_bw = f"{1e-9 / f['gamma']:.3g}" if f["gamma"] > 0 else "-"
        hold = f["holdout"].get("sizes")
        hold_text = _pct(hold["median_rel_err"]) if isinstance(hold, dict) else "-"
        worlds = f["holdout"].get("world_sizes")
        if worlds:
            errs = [v["median_rel_err"] for v in worlds.values() if isinstance(v, dict)]
            hold_text += f" / p-out {_pct(max(errs))}"
        notes = []
        pieces = f.get("pieces")
        if pieces:
            notes.append(f"break@{piece_end(pieces[0])}B")
        if f["gamma_source"].startswith("not identifiable"):
            notes.append("gamma in beta")
        if f["algorithm"] == "native":
            notes.append("chosen")
        p_text = ",".join(map(str, f["world_sizes"]))
        if f.get("scope") == "all-world-sizes" and len(f["world_sizes"]) == 1:
            # the fit across world sizes, here from one (the others left out): not the
            # per-world-size row above it, though its numbers are the same
            p_text += " (all p)"
        ci = f.get("ci95")
        a_ci = f"{ci['alpha'][0] * 1e6:.3g}-{ci['alpha'][1] * 1e6:.3g}" if ci else "-"
        b_ci = (f"{1e-9 / ci['beta'][1]:.3g}-{1e-9 / ci['beta'][0]:.3g}"
                if ci and ci["beta"][0] > 0 else "-")
        g = f["goodness"]
        rows.append((f["backend"], f["library"][:16], f["collective"], f["algorithm"],
                     f["model_algorithm"], p_text,
                     f"{f['alpha'] * 1e6:.3g}", a_ci, beta_bw, b_ci, gamma_bw, f"{g['r2_log']:.4f}",
                     _pct(g["median_rel_err"]), _pct(g["max_rel_err"]), hold_text,
                     " ".join(notes)))
    return _aligned(rows)


def _aligned(rows: list[tuple[Any, ...]]) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def validation_table(rows: list[ValidationRow], summary: list[ValidationSummary]) -> str:
    """Each predicted record (its dtype and mode tell apart the records of one size), then
    each group's summary; columns aligned."""
    table: list[tuple[Any, ...]] = [("backend", "library", "collective", "algorithm", "p",
                                     "dtype", "mode", "size", "measured_us", "predicted_us",
                                     "rel_err")]
    for r in rows:
        table.append((r["backend"], r["library"], r["collective"], r["algorithm"],
                      r["world_size"], r.get("dtype", "-"),
                      "-" if r.get("inplace") is None else
                      "in-place" if r["inplace"] else "out-of-place",
                      r["size"], f"{r['measured_s'] * 1e6:.2f}", f"{r['predicted_s'] * 1e6:.2f}",
                      _pct(r["rel_err"])))
    groups: list[tuple[Any, ...]] = [("backend", "library", "collective", "algorithm", "p",
                                      "points", "median_rel_err", "p90_rel_err", "max_rel_err")]
    for s in summary:
        groups.append((s["backend"], s["library"], s["collective"], s["algorithm"],
                       s["world_size"], s["sizes"], _pct(s["median_rel_err"]),
                       _pct(s["p90_rel_err"]), _pct(s["max_rel_err"])))
    return _aligned(table) + "\n\n" + _aligned(groups)


def one_measurement(records: list[Record], skipped: list[str]) -> list[Record]:
    """Per (backend, collective, algorithm), the records of one measurement: those measured
    with the options' defaults where there are some, else the most common setting of the
    options that change what is measured (--combine, --pipeline ...); the others are left
    out, each setting said once in `skipped` (one fit of unlike times would fit neither)."""
    from collections import Counter, defaultdict

    from ccbench.bench.options import measured_variant

    groups: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
    for rec in records:
        groups[(rec.backend, rec.collective, rec.algorithm)].append(rec)
    kept: list[Record] = []
    for (backend, collective, algorithm), group in groups.items():
        counts = Counter(measured_variant(r.method or {}) for r in group)
        chosen = "" if "" in counts else counts.most_common(1)[0][0]
        kept.extend(r for r in group if measured_variant(r.method or {}) == chosen)
        for variant, n in counts.items():
            if variant != chosen:
                skipped.append(f"{backend} {collective} {algorithm}: {n} record(s) measured with "
                               f"{variant or 'the default options'} left out, another "
                               f"measurement than the {counts[chosen]} fitted"
                               f"{' (' + chosen + ')' if chosen else ''}; calibrate them "
                               f"on their own")
    return kept


def main(args: argparse.Namespace) -> int:
    from ccbench.bench.output.files import check_writable_file
    from ccbench.model.fit import calibrate, summarize_validation, validate_world_sizes
    from ccbench.model.modelfile import build_model, save_model

    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    check_writable_file(args.output)                 # before the fit, not after it
    records = load_records(*args.results, require=True)
    if args.backend:
        records = [r for r in records if r.backend == args.backend]
    if args.collective:
        from ccbench.collectives import canonical_collective
        coll = canonical_collective(args.collective)
        records = [r for r in records if r.collective == coll]
    if not records:
        raise UsageError(f"no records in {', '.join(args.results)}"
                         + (" after the filters" if args.backend or args.collective else ""))
    skipped: list[str] = []
    records = one_measurement(records, skipped)
    fits = calibrate(records, bootstrap=args.bootstrap, seed=args.seed, skipped=skipped)
    for line in skipped:
        print(f"ccbench: skipped: {line}", file=sys.stderr)
    model = build_model(fits, records, [str(p) for p in args.results])
    save_model(model, args.output)
    out: dict[str, Any] = {"model": args.output, "fits": model["fits"]}
    validation = None
    if args.validate:
        train, test = parse_validate(args.validate)
        rows = validate_world_sizes(records, train, test)
        if not rows:
            raise UsageError(f"--validate: no records at world sizes {test} for a group "
                             f"measured at {train}")
        validation = (rows, summarize_validation(rows))
        out["validation"] = {"train": train, "test": test, "rows": rows,
                             "summary": validation[1]}
    if args.format == "json":
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(goodness_table(model["fits"]))
        for f in model["fits"]:
            worlds = ",".join(map(str, f["world_sizes"]))
            for note in f["notes"]:
                if "breakpoint" in note or note.startswith(("native: kept", "piecewise: the upper")):
                    print(f"{f['backend']} ({f['library']}) {f['collective']} p={worlds}: {note}")
            for flag in f.get("flags") or []:
                print(f"{f['backend']} ({f['library']}) {f['collective']} p={worlds}: "
                      f"flagged: {flag}")
        if validation:
            print()
            print(f"validation: fitted on world sizes {args.validate.split(':')[0]}, "
                  f"predicted {args.validate.split(':')[1]}")
            print(validation_table(*validation))
        print(f"\nwrote {args.output} ({len(fits)} fits from {len(records)} records)")
    return 0
