"""How often `ccbench compare` flags a change between identical back-to-back runs, and
whether it still flags a real slowdown.

    python benchmarks/compare_noise.py --pairs 10 --out /tmp/compare-noise   # measure + judge
    python benchmarks/compare_noise.py --out /tmp/compare-noise --judge-only  # judge again

Measures 2 x PAIRS runs of the same small command back to back (2 ranks, gloo, 1K-64K, every
collective, both modes), then runs `ccbench compare` on each consecutive pair (one run per
side) and on two pooled halves (PAIRS runs per side), and counts the cases each flags and
the exit statuses. For the slowdown check, the NEW side is a copy of a measured run with
every time multiplied by 1.2 (a 20 % slower backend), compared against another run.
Prints the figures; timings depend on the machine's load (printed with them).
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


def _flags(proc: subprocess.CompletedProcess[str]) -> tuple[int, int, int]:
    summary = [line for line in proc.stdout.splitlines() if " compared: " in line][-1]
    words = summary.split()
    total = int(words[1])
    slower = int(words[3])
    faster = int(words[5])
    return total, slower, faster


def judge(out: Path, extra: list[str]) -> None:
    runs = sorted(out.glob("run-*.jsonl"))
    print(f"# {len(runs)} runs in {out}; compare {' '.join(extra) or '(defaults)'}; "
          f"load now {os.getloadavg()[0]:.1f}")
    cases = flagged = exit1 = 0
    for base, new in zip(runs[0::2], runs[1::2], strict=False):
        proc = _ccbench("compare", str(base), str(new), *extra)
        total, slower, faster = _flags(proc)
        cases += total
        flagged += slower + faster
        exit1 += proc.returncode == 1
        print(f"{base.name} -> {new.name}: {total} cases, {slower} slower, {faster} faster, "
              f"exit {proc.returncode}")
    print(f"one run per side: {flagged} of {cases} cases flagged "
          f"({100 * flagged / max(cases, 1):.2f} %), {exit1} exits with status 1")
    half = len(runs) // 2
    if half >= 2:
        a, b = out / "pooled-a", out / "pooled-b"
        for folder, part in ((a, runs[:half]), (b, runs[half:])):
            folder.mkdir(exist_ok=True)
            for run in part:
                (folder / run.name).write_text(run.read_text())
        proc = _ccbench("compare", str(a), str(b), *extra)
        total, slower, faster = _flags(proc)
        print(f"{half} runs per side: {slower + faster} of {total} cases flagged, "
              f"exit {proc.returncode}")
    slow = out / "slowed-20pct.jsonl"
    slowed(runs[1], slow, 1.2)
    proc = _ccbench("compare", str(runs[0]), str(slow), *extra)
    total, slower, faster = _flags(proc)
    print(f"20 % slowdown, one run per side: {slower} of {total} cases flagged slower, "
          f"exit {proc.returncode}")
    if half >= 2:
        sb = out / "pooled-slow"
        sb.mkdir(exist_ok=True)
        for run in runs[half:]:
            slowed(run, sb / run.name, 1.2)
        proc = _ccbench("compare", str(out / "pooled-a"), str(sb), *extra)
        total, slower, faster = _flags(proc)
        print(f"20 % slowdown, {half} runs per side: {slower} of {total} cases flagged slower, "
              f"exit {proc.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("/tmp/compare-noise"))
    parser.add_argument("--judge-only", action="store_true")
    args, extra = parser.parse_known_args()
    if not args.judge_only:
        measure(args.out, args.pairs)
    judge(args.out, extra)


if __name__ == "__main__":
    main()
