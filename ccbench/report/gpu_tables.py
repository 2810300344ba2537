"""The device tables of a GPU check run (`tests/gpu/check.sh`), as Markdown, from its records.

    python -m ccbench.report.gpu_tables RUN [RUN ...] [-o tables.md]

A RUN is a folder holding check.sh's `records.tar.gz` (or the archive itself, or a folder of
its `records/<step>.jsonl`). The steps are found by check.sh's file names:

- `bandwidth-w1`: every collective through each NCCL path (nccl = torch, nccl-cupy = CuPy's
  binding), float32, pipelined: median time, algbw and busbw per size and placement;
- `algorithms-<native>-w1` and `algorithms-mpi-cupy-<buffers>`: ccbench's ring, tree and
  hypercube beside the library's own collective on the same case (collective, dtype, op,
  placement, size), as the ratio of their median times (above 1: slower than the library).

Every number printed is a field of a record; nothing is computed but ratios and medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ccbench.collectives import IN_PLACE_ONLY, busbw_factor
from ccbench.errors import UsageError, error_line
from ccbench.records import load_records
from ccbench.records.schema import Record
from ccbench.units import format_size

__all__ = ["load_steps", "bandwidth_table", "ratio_tables", "render", "main"]

ALGORITHMS = ("ring", "tree", "hypercube")
Steps = dict[str, list[Record]]
Case = tuple[str, str, str | None, bool, int, int]


def load_steps(runs: Sequence[str | Path]) -> Steps:
    """Each step's records by check.sh's file name (`records/<step>.jsonl`); later runs add."""
    steps: Steps = {}
    for run in runs:
        for name, records in _read_run(Path(run)).items():
            steps.setdefault(name, []).extend(records)
    if not any(steps.values()):
        raise UsageError("no check.sh records (records.tar.gz or records/*.jsonl) in "
                         + ", ".join(map(str, runs)))
    return steps


def _read_run(run: Path) -> Steps:
    archive = run / "records.tar.gz" if run.is_dir() else run
    if run.is_dir() and not archive.exists():
        return {p.name.removesuffix(".jsonl"): load_records(p) for p in sorted(run.glob("**/*.jsonl"))}
    if not archive.is_file():
        raise UsageError(f"{run}: no such run folder or records.tar.gz")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".jsonl")]
                tar.extractall(tmp, members=members, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise UsageError(f"{archive}: not a readable records.tar.gz ({exc})") from exc
        return {Path(m.name).name.removesuffix(".jsonl"): load_records(Path(tmp, m.name))
                for m in members}


def _case(record: Record) -> Case:
    return (record.collective, record.dtype, record.op, record.inplace, record.size_used,
            record.world_size)


def _placement(inplace: bool) -> str:
    return "in place" if inplace else "out of place"


def bandwidth_table(records: Sequence[Record]) -> list[str]:
    """One row per (collective, size, placement): time, algbw and busbw of each backend."""
    backends = sorted({r.backend for r in records})
    by_case = {(r.collective, r.size_used, r.inplace, r.backend): r for r in records}
    head = ["collective", "size (B)", "placement", "busbw factor"]
    for backend in backends:
        head += [f"{backend} time (us)", f"{backend} algbw (GB/s)", f"{backend} busbw (GB/s)"]
    lines = _row(head), _row(["---"] * 3 + ["---:"] * (len(head) - 3))
    rows = []
    for collective, size, inplace in sorted({k[:3] for k in by_case}):
        world = next(r.world_size for r in records if r.collective == collective)
        row = [collective, format_size(size), _placement(inplace), f"{busbw_factor(collective, world):g}"]
        for backend in backends:
            rec = by_case.get((collective, size, inplace, backend))
            row += ([f"{rec.time_us['median']:.2f}", f"{rec.algbw_gbps:.1f}", f"{rec.busbw_gbps:.1f}"]
                    if rec else ["-"] * 3)
        rows.append(_row(row))
    return [*lines, *rows]


def _ratios(native: Sequence[Record], algorithms: Sequence[Record]) -> dict[tuple[str, Case], float]:
    """(algorithm, case) -> the algorithm's median time over the library's on that case."""
    library = {_case(r): r.time_us["median"] for r in native}
    return {(r.algorithm, _case(r)): r.time_us["median"] / library[_case(r)]
            for r in algorithms if r.algorithm in ALGORITHMS and _case(r) in library}


def _headline(case: Case) -> bool:
    """float32, sum (or no op), out of place (broadcast: in place, its only form)."""
    collective, dtype, op, inplace, _, _ = case
    return dtype == "float32" and op in (None, "sum") and inplace == (collective in IN_PLACE_ONLY)


def ratio_tables(native: Sequence[Record], algorithms: Sequence[Record]) -> list[str]:
    """float32 per collective and size; then every matched case summarised per size."""
    ratios = _ratios(native, algorithms)
    library = {_case(r): r.time_us["median"] for r in native}
    head = ["collective", "size (B)", "library (us)", *ALGORITHMS]
    lines = [_row(head), _row(["---", "---"] + ["---:"] * (len(head) - 2))]
    for case in sorted({c for _, c in ratios if _headline(c)}):
        cells = [_x(ratios.get((a, case))) for a in ALGORITHMS]
        lines.append(_row([case[0], format_size(case[4]), f"{library[case]:.1f}", *cells]))
    lines += ["", "Every matched case (each collective, dtype, op and placement): median ratio "
              "[lowest, highest] (cases)", "",
              _row(["size (B)", *ALGORITHMS]), _row(["---"] + ["---:"] * len(ALGORITHMS))]
    for size in sorted({c[4] for _, c in ratios}):
        cells = []
        for algorithm in ALGORITHMS:
            found = [v for (a, c), v in ratios.items() if a == algorithm and c[4] == size]
            cells.append(f"{_x(statistics.median(found))} [{_x(min(found))}, {_x(max(found))}] "
                         f"({len(found)})" if found else "-")
        lines.append(_row([format_size(size), *cells]))
    return lines


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _about(records: Sequence[Record]) -> str:
    """Where and when: the device, library, torch and CUDA of the records, as they say."""
    first = records[0]
    env = first.environment
    stamps = sorted(r.timestamp for r in records)
    version = first.library_version.strip("\x00 ")
    return (f"{len(records)} records, {stamps[0]} to {stamps[-1]}; {env.get('gpu', first.device)}, "
            f"{first.library} {version}, torch {env.get('torch', '-')}, "
            f"CUDA runtime {env.get('cuda_runtime', '-')}, world size {first.world_size}, "
            f"timing {first.timing}{_shared(records)}")


def _shared(records: Sequence[Record]) -> str:
    """The records' own word that their ranks took turns on fewer devices than ranks."""
    if any(r.method.get("oversubscribed") for r in records):
        return " (oversubscribed: the ranks share the device, times include waiting for it)"
    return ""


def render(steps: Steps) -> str:
    """The Markdown of every table the steps allow (a step that is missing is said so)."""
    out: list[str] = ["# GPU check tables", "",
                      "Generated by `python -m ccbench.report.gpu_tables` from the records of "
                      "`tests/gpu/check.sh`. Times are medians (us); ratio = algorithm time / "
                      "library time on the same case (above 1: slower than the library).", ""]
    band = steps.get("bandwidth-w1")
    out += ["## Bandwidth of every collective (step `bandwidth of every collective`)", ""]
    out += [_about(band), "", *bandwidth_table(band), ""] if band else ["(no bandwidth-w1 records)", ""]
    # check.sh names each algorithms step after the library step it runs beside:
    # algorithms-<library>-w1 beside <library>-w1, algorithms-mpi-cupy-<buffers> beside
    # mpi-cupy-<buffers>-per-op
    pairs = [(name.removeprefix("algorithms-") + ("" if name.endswith("-w1") else "-per-op"), name)
             for name in sorted(steps) if name.startswith("algorithms-")]
    for native, algorithms in pairs:
        if algorithms not in steps:
            continue
        library = [r for r in [*steps.get(native, []), *steps[algorithms]] if r.algorithm == "native"]
        out += [f"## ccbench's algorithms beside the library (`{algorithms}`)", ""]
        if not library:
            out += [f"(no library records beside them: {native} missing)", ""]
            continue
        out += [_about(steps[algorithms]), "", *ratio_tables(library, steps[algorithms]), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ccbench.report.gpu_tables",
                                     description="Markdown tables of a tests/gpu/check.sh run")
    parser.add_argument("runs", nargs="+", help="run folders (holding records.tar.gz) or archives")
    parser.add_argument("-o", "--output", help="write the Markdown here (default: stdout)")
    args = parser.parse_args(argv)
    try:
        text = render(load_steps(args.runs))
    except UsageError as exc:
        print(error_line(exc), file=sys.stderr)
        return exc.exit_code
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
