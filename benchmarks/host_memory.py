"""Peak resident memory per rank of one collective at a large size, for every dtype.

    python benchmarks/host_memory.py --sizes 256M --dtypes all
    python benchmarks/host_memory.py --sizes 1G --dtypes float32

Each measurement runs `ccbench launch -n RANKS COLLECTIVE --sizes S --dtype D --iters 2
--warmup 1` inside a fresh helper process and reads the largest peak RSS of its descendants
(getrusage RUSAGE_CHILDREN: ru_maxrss of the largest waited-for process, which is a rank).
A baseline run at 1 KiB gives what a rank holds before any buffer. Prints one line per
(dtype, size): peak RSS, peak minus baseline as a multiple of the buffer size S.
Refuses a run that would not fit in the memory available now.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_HELPER = r"""
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": proc.returncode, "err": proc.stderr[-400:],
                  "maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int8")


def _available() -> int:
    with open("/proc/meminfo", encoding="utf-8") as handle:
        fields = dict(line.split(":", 1) for line in handle)
    return int(fields["MemAvailable"].split()[0]) * 1024


def peak_rss(ranks: int, collective: str, size: str, dtype: str, backend: str) -> int:
    argv = [sys.executable, "-m", "ccbench", "launch", "-n", str(ranks), collective,
            "--backend", backend, "--sizes", size, "--dtype", dtype, "--iters", "2",
            "--warmup", "1", "-q"]
    out = subprocess.run([sys.executable, "-c", _HELPER, *argv], capture_output=True,
                         text=True, check=True)
    result = json.loads(out.stdout)
    if result["rc"] != 0:
        sys.exit(f"{' '.join(argv)} failed ({result['rc']}): {result['err']}")
    return int(result["maxrss"])


def _bytes(size: str) -> int:
    from ccbench.units import parse_sizes

    (value,) = parse_sizes(size)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256M")
    parser.add_argument("--dtypes", default="all")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--collective", default="allreduce")
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    dtypes = DTYPES if args.dtypes == "all" else tuple(args.dtypes.split(","))
    base = peak_rss(args.ranks, args.collective, "1K", "float32", args.backend)
    print(f"# {args.ranks} ranks, {args.collective}, {args.backend}; baseline peak RSS per rank "
          f"(1 KiB) {base / 2**20:.0f} MiB")
    print(f"{'dtype':<10}{'size':>6}{'peak MiB':>10}{'(peak-base)/S':>15}{'peak/S':>8}")
    for size in args.sizes.split(","):
        buffer = _bytes(size)
        for dtype in dtypes:
            # send + recv per rank and the baseline, with a margin: refuse what cannot fit
            need = args.ranks * (3 * buffer + base)
            if need > _available():
                print(f"{dtype:<10}{size:>6}  skipped: needs ~{need / 2**30:.1f} GiB, "
                      f"{_available() / 2**30:.1f} GiB available")
                continue
            peak = peak_rss(args.ranks, args.collective, size, dtype, args.backend)
            print(f"{dtype:<10}{size:>6}{peak / 2**20:>10.0f}{(peak - base) / buffer:>15.2f}"
                  f"{peak / buffer:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
