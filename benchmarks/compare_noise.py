"""How often `ccbench compare` flags a change between identical back-to-back runs, and
whether it still flags a real slowdown.

    python benchmarks/compare_noise.py --pairs 10 --out /tmp/compare-noise   # measure + judge
    python benchmarks/compare_noise.py --out /tmp/compare-noise --judge-only  # judge again

--judge-only judges the runs a measuring call left in --out (the same folder): without them it
says so and exits 2.

Measures 2 x PAIRS runs of the same small command back to back (2 ranks, gloo, 1K-64K, every
collective, both modes), then runs `ccbench compare --format json` on each consecutive pair
(one run per side) and on disjoint groups of K runs per side (--runs-per-side, default 3, 5
and PAIRS), and counts, per size row and per case (a collective's geometric mean over sizes),
the verdicts that count, the indicative one-run marks, and the exit statuses. For the
slowdown check, the NEW side is a copy of measured runs with every time multiplied by 1.2 (a
20 % slower backend), compared against other runs. Prints the figures; timings depend on
the machine's load (printed with them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

COMMAND = ["launch", "-n", "2", "all", "--backend", "gloo", "--sizes", "1K-64K", "-q"]


def _ccbench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ccbench", *args], capture_output=True,
                          text=True, timeout=900)


def measure(out: Path, pairs: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i in range(2 * pairs):
        path = out / f"run-{i:02d}.jsonl"
        if path.exists():
            continue
        proc = _ccbench(*COMMAND, "--output", str(path))
        if proc.returncode != 0:
            sys.exit(f"run {i} failed: {proc.stderr[-500:]}")
        print(f"run {i}: load {os.getloadavg()[0]:.1f}", flush=True)


def slowed(src: Path, dst: Path, factor: float) -> None:
    lines = []
    for line in src.read_text().splitlines():
        data = json.loads(line)
        data["samples_us"] = [t * factor for t in data["samples_us"]]
        data["time_us"] = {k: v * factor for k, v in data["time_us"].items()}
        data["run_id"] = data["run_id"] + "-slow"
        lines.append(json.dumps(data))
    dst.write_text("\n".join(lines) + "\n")


Tally = dict[str, int]


def _compare(base: Path, new: Path, extra: list[str]) -> tuple[Tally, Tally, int]:
    """(size-row tally, case tally, exit status) of one `ccbench compare`."""
    proc = _ccbench("compare", str(base), str(new), "--format", "json", *extra)
    if proc.returncode not in (0, 1):
        sys.exit(f"compare failed: {proc.stderr.strip()}")
    tallies: dict[str, Tally] = {"size": {}, "case": {}}
    for line in proc.stdout.splitlines():
        row = json.loads(line)
        tally = tallies[row["level"]]
        kind = row["verdict"] if row["verdict"] in ("regression", "improvement") else "same"
        if kind != "same" and row["indicative"]:
            kind += "?"
        tally[kind] = tally.get(kind, 0) + 1
        tally["total"] = tally.get("total", 0) + 1
    return tallies["size"], tallies["case"], proc.returncode


def _add(total: Tally, part: Tally) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0) + value


def _line(label: str, tally: Tally) -> str:
    flagged = tally.get("regression", 0) + tally.get("improvement", 0)
    marked = tally.get("regression?", 0) + tally.get("improvement?", 0)
    total = max(tally.get("total", 0), 1)
    return (f"{label}: {flagged} of {tally.get('total', 0)} flagged ({100 * flagged / total:.1f} "
            f"%; {tally.get('regression', 0)} slower), {marked} indicative marks")


def _folder(out: Path, name: str, runs: list[Path], factor: float) -> Path:
    folder = out / name
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.jsonl"):
        old.unlink()
    for run in runs:
        if factor == 1.0:
            (folder / run.name).write_text(run.read_text())
        else:
            slowed(run, folder / run.name, factor)
    return folder


def judge(out: Path, extra: list[str], per_side: list[int]) -> None:
    runs = sorted(out.glob("run-*.jsonl"))
    print(f"# {len(runs)} runs in {out}; compare {' '.join(extra) or '(defaults)'}; "
          f"load now {os.getloadavg()[0]:.1f}")
    for k in [1, *per_side]:
        groups = len(runs) // (2 * k)
        if groups == 0:
            continue
        for factor in (1.0, 1.2):
            sizes: Tally = {}
            cases: Tally = {}
            exits = 0
            for g in range(groups):
                a = runs[2 * k * g:2 * k * g + k]
                b = runs[2 * k * g + k:2 * k * (g + 1)]
                if k == 1 and factor == 1.0:
                    base, new = a[0], b[0]
                else:
                    base = _folder(out, "side-a", a, 1.0)
                    new = _folder(out, "side-b", b, factor)
                size_tally, case_tally, status = _compare(base, new, extra)
                _add(sizes, size_tally)
                _add(cases, case_tally)
                exits += status == 1
            what = "identical" if factor == 1.0 else "20 % slowdown"
            print(f"{what}, {k} run(s) per side, {groups} comparison(s), {exits} exit(s) with "
                  f"status 1")
            print("  " + _line("sizes", sizes))
            print("  " + _line("cases", cases))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("/tmp/compare-noise"))
    parser.add_argument("--judge-only", action="store_true")
    parser.add_argument("--runs-per-side", type=int, nargs="*", default=None,
                        help="group sizes for the several-runs comparisons (default 3 5 PAIRS)")
    args, extra = parser.parse_known_args()
    if not args.judge_only:
        measure(args.out, args.pairs)
    elif len(list(args.out.glob("run-*.jsonl"))) < 2:
        print(f"compare_noise: error: --judge-only judges the runs a measuring call left in "
              f"--out, and {args.out} holds {len(list(args.out.glob('run-*.jsonl')))}: "
              f"measure them first (python benchmarks/compare_noise.py --pairs 10 --out "
              f"{args.out}), then --judge-only judges them again", file=sys.stderr)
        sys.exit(2)
    judge(args.out, extra, args.runs_per_side or [3, 5, args.pairs])


if __name__ == "__main__":
    main()
