#!/usr/bin/env python3
"""The whole fault-injection matrix: backend x fault x phase x victim at 2 and 3 ranks.

Each cell launches a small allreduce run with `ccbench launch`, makes one rank really die,
stop or exit at the chosen phase (CCBENCH_FAULT, see ccbench/run/faults.py; one cell is
tests/fault_cells.py), and checks what a user would: non-zero exit, exactly one
`ccbench: error:` line naming the phase and the rank that did not arrive, no process of the
run left, every record on disk whole. It prints one row per cell with the stop time (fault to
launcher exit) and a summary of stop times.

    python scripts/fault_matrix.py                       # everything (about an hour, loaded)
    python scripts/fault_matrix.py --backends gloo --worlds 2 --json faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ccbench.run.faults import ACTIONS, PHASES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fault_cells import Cell, run_cell  # noqa: E402  (the harness lives beside the tests)

BACKENDS = ("gloo", "mpi", "oneccl", "ring@mpi")


def cells(backends: list[str], worlds: list[int], phases: tuple[str, ...] = PHASES,
          actions: tuple[str, ...] = ACTIONS) -> list[Cell]:
    out = []
    for backend in backends:
        for world in worlds:
            victims = sorted({0, world // 2, world - 1})
            for phase in phases:
                for action in actions:
                    if action == "unreachable" and phase != "start-up":
                        continue          # only connecting to the store can be unreachable
                    out.extend(Cell(backend, world, v, action, phase) for v in victims)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--worlds", default="2,3")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--actions", default=",".join(ACTIONS))
    parser.add_argument("--timeout", type=float, default=5.0, help="--timeout of each run")
    parser.add_argument("--json", default=None, help="also write every outcome here")
    args = parser.parse_args()
    todo = cells(args.backends.split(","), [int(w) for w in args.worlds.split(",")],
                 tuple(args.phases.split(",")), tuple(args.actions.split(",")))
    load = os.getloadavg()
    print(f"# {len(todo)} cells, --timeout {args.timeout:g} s, load average at start "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs", flush=True)
    print(f"{'cell':<44} {'ok':<4} {'exit':>4} {'stop s':>7}  error line / problems", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ccbench-faults-") as work:
        for cell in todo:
            started = time.monotonic()
            outcome = run_cell(cell, Path(work), timeout=args.timeout,
                               bound=args.timeout + 240)
            stop = f"{outcome.stop_s:7.1f}" if outcome.stop_s is not None else "      -"
            said = "; ".join(outcome.problems) if outcome.problems else outcome.error_lines[0]
            print(f"{cell.name:<44} {'yes' if outcome.ok else 'NO':<4} "
                  f"{outcome.status if outcome.status is not None else '-':>4} {stop}  "
                  f"{said[:160]}", flush=True)
            rows.append({"cell": cell.name, "backend": cell.backend, "world": cell.world_size,
                         "victim": cell.victim, "action": cell.action, "phase": cell.phase,
                         "ok": outcome.ok, "status": outcome.status, "stop_s": outcome.stop_s,
                         "wall_s": time.monotonic() - started, "problems": outcome.problems,
                         "error_lines": outcome.error_lines})
    _summary(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(row["ok"] for row in rows) else 1


def _summary(rows: list[dict[str, object]]) -> None:
    passed = sum(1 for row in rows if row["ok"])
    print(f"\n# {passed}/{len(rows)} cells as required", flush=True)
    load = os.getloadavg()
    print(f"# load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    groups: dict[str, list[float]] = {}
    for row in rows:
        if isinstance(row["stop_s"], float):
            groups.setdefault(f"{row['action']:<12} {row['phase']}", []).append(row["stop_s"])
    print(f"# {'fault':<12} {'phase':<10} {'cells':>5} {'median s':>9} {'max s':>7}")
    for key in sorted(groups):
        times = groups[key]
        print(f"# {key:<23} {len(times):>5} {statistics.median(times):>9.1f} {max(times):>7.1f}")


if __name__ == "__main__":
    sys.exit(main())
