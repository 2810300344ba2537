"""ccbench's timed region against a bare loop in the same two processes (prints; no asserts).

    python benchmarks/bench_timed_region.py --backend gloo [--launches 5]
    python benchmarks/bench_timed_region.py --backend mpi  [--launches 5]   (any MPI's Python)

Comparing separate launches measures the state each process lands in as much as the harness:
on a VM whose idle vCPU must be woken by its host, gloo's small operations take about 0.3 ms
in one launch and 4 ms in the next (benchmarks/bench_wakeup.py shows the wakeups). Here both
loops run in the same processes, on the same buffers, in alternating blocks (the order flips
every block), so whatever state a launch is in, both see it. Every variant's sample is combined
over ranks as ccbench combines it (max over ranks per sample), its median is taken per block,
and the ratio is formed within each block; a launch's figure is the median over its blocks,
and the table gives the median over launches with the spread between them.

gloo: ccbench's per-op loop (ccbench.bench.harness's own sampling function, its watchdog running, the
backend's bound call) against `dist.barrier(); t = clock(); dist.all_reduce(x); clock() - t`.

mpi: ccbench per-op against the same mpi4py call in a bare Python loop; ccbench pipelined
(--pipeline calls per sample from its C loop) against two loops in C with the clock in C:
IMB's structure (the clock around the calls back to back) and OSU's (each call timed alone,
a barrier after it), so the in-process ratio says how much of ccbench / OSU is the harness and
how much is the structure of the loop.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = [8, 64, 512, 4096, 32768, 65536, 262144, 1 << 20, 4 << 20]
PIPELINE = 50

# the two loops of the references, in C, timed in C (clock_gettime: what MPI_Wtime reads)
C_SOURCE = r"""
#include <time.h>
typedef HANDLE H;
typedef int (*allreduce_t)(const void *, void *, int, H, H, H);
typedef int (*barrier_t)(H);
static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
/* IMB-MPI1: the clock around `times` calls back to back; seconds per call */
double imb_style(void *ar, void *bar, const void *s, void *r, int n, H t, H op, H c, long times) {
    ((barrier_t)bar)(c);
    double start = now();
    for (long i = 0; i < times; i++) ((allreduce_t)ar)(s, r, n, t, op, c);
    return (now() - start) / times;
}
/* osu_allreduce: each call timed alone, a barrier after it; seconds per call */
double osu_style(void *ar, void *bar, const void *s, void *r, int n, H t, H op, H c, long times) {
    double total = 0;
    ((barrier_t)bar)(c);
    for (long i = 0; i < times; i++) {
        double start = now();
        ((allreduce_t)ar)(s, r, n, t, op, c);
        total += now() - start;
        ((barrier_t)bar)(c);
    }
    return total / times;
}
"""


# -- rank side -------------------------------------------------------------------------------
def _rank_main(args: argparse.Namespace) -> None:
    from ccbench.backends.mpi import DEFAULT_THREAD_LEVEL, set_thread_level

    if args.backend == "mpi":
        set_thread_level(DEFAULT_THREAD_LEVEL)       # as ccbench runs it (funneled)
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.Get_rank()
    else:
        rank = args.rank
    from ccbench.backends.base import RankContext
    from ccbench.run.control import ControlClient, ControlServer, secret_from_env
    from ccbench.run.watchdog import Watchdog

    server = ControlServer("127.0.0.1", args.port, secret_from_env()) if rank == 0 else None
    store = ControlClient("127.0.0.1", args.port, rank)
    watchdog = Watchdog(store, rank, 2, 600.0)        # running, as in a ccbench rank
    watchdog.start()
    ctx = RankContext(rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                      launcher="mpiexec" if args.backend == "mpi" else "local", store=store,
                      hostname=socket.gethostname())
    if args.backend == "mpi":
        from ccbench.backends.mpi import MPIBackend
        backend: Any = MPIBackend(ctx)
        variants = _mpi_variants(backend, Path(args.out))
    else:
        from ccbench.backends.gloo import GlooBackend
        backend = GlooBackend(ctx)
        variants = _gloo_variants(backend)
    results = {size: _measure(backend, watchdog, variants, size, args) for size in args.sizes}
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(results))
    backend.barrier()
    watchdog.stop()
    backend.finalize()
    store.barrier("done", 2, 60)
    store.close()
    if server is not None:
        time.sleep(0.2)
        server.close()


Variant = Callable[[Any, Any, Any, int], list[float]]   # (bufs, case, method, n) -> seconds


def _ccbench_loop() -> Callable[..., Variant]:
    """ccbench.bench.harness's own sampling loop (per-op or pipelined, by the Method given)."""
    def make(backend: Any, watchdog: Any) -> Variant:
        from ccbench.bench.harness import Method, _timed_samples

        def run(bufs: Any, case: Any, method: Method, n: int) -> list[float]:
            return _timed_samples(backend, case, bufs, method, watchdog, n)[0]
        return run
    return make


def _gloo_variants(backend: Any) -> dict[str, Callable[..., Variant]]:
    dist, clock = backend.dist, time.perf_counter

    def bare(backend: Any, watchdog: Any) -> Variant:
        def run(bufs: Any, case: Any, method: Any, n: int) -> list[float]:
            tensor, samples = bufs.recv, []
            for _ in range(n):
                dist.barrier()
                start = clock()
                dist.all_reduce(tensor)
                samples.append(clock() - start)
            return samples
        return run
    return {"ccbench per-op": _ccbench_loop(), "bare loop": bare}


def _mpi_variants(backend: Any, folder: Path) -> dict[str, Callable[..., Variant]]:
    from ccbench.backends.mpi_loop import loaded_libmpi, predefined_datatype

    mpi, comm, clock = backend.MPI, backend.comm, time.perf_counter
    handle_bytes = mpi._sizeof(mpi.Comm)
    loops = ctypes.CDLL(str(folder / f"loops{handle_bytes}.so"))
    for fn in (loops.imb_style, loops.osu_style):
        fn.restype = ctypes.c_double
    lib = ctypes.CDLL(loaded_libmpi() or "libmpi.so")
    handle_type = ctypes.c_int32 if handle_bytes == 4 else ctypes.c_void_p

    def h(obj: Any) -> Any:
        value = mpi._handleof(obj)
        return handle_type(value & 0xFFFFFFFF if handle_bytes == 4 else value)

    def address(fn: Any) -> ctypes.c_void_p:
        return ctypes.c_void_p(ctypes.cast(fn, ctypes.c_void_p).value)

    def bare(backend: Any, watchdog: Any) -> Variant:
        def run(bufs: Any, case: Any, method: Any, n: int) -> list[float]:
            typed = [bufs.send, predefined_datatype(mpi, bufs.send.dtype)]
            out = [bufs.recv, predefined_datatype(mpi, bufs.recv.dtype)]
            samples = []
            for _ in range(n):
                comm.Barrier()
                start = clock()
                comm.Allreduce(typed, out, mpi.SUM)
                samples.append(clock() - start)
            return samples
        return run

    def in_c(fn: Any) -> Callable[..., Variant]:
        def make(backend: Any, watchdog: Any) -> Variant:
            def run(bufs: Any, case: Any, method: Any, n: int) -> list[float]:
                args = (address(lib.MPI_Allreduce), address(lib.MPI_Barrier),
                        ctypes.c_void_p(bufs.send.ctypes.data),
                        ctypes.c_void_p(bufs.recv.ctypes.data), ctypes.c_int(bufs.recv.size),
                        h(predefined_datatype(mpi, bufs.recv.dtype)), h(mpi.SUM), h(comm),
                        ctypes.c_long(method.pipeline))
                return [fn(*args) for _ in range(n)]
            return run
        return make
    return {"ccbench per-op": _ccbench_loop(), "bare mpi4py per-op": bare,
            "ccbench pipelined": _ccbench_loop(),
            "C, IMB's loop": in_c(loops.imb_style), "C, OSU's loop": in_c(loops.osu_style)}


def _measure(backend: Any, watchdog: Any, variants: dict[str, Callable[..., Variant]],
             size: int, args: argparse.Namespace) -> dict[str, list[list[float]]]:
    """{variant: [block samples ...]} for one size, blocks alternating in order."""
    from ccbench.bench.harness import Case, Method, _Buffers
    from ccbench.collectives import layout

    case = Case("allreduce", "float32", "sum", inplace=args.backend == "gloo")
    lay = layout("allreduce", size, 4, 2)
    bufs = _Buffers(backend, case, lay, backend.ctx.rank)
    made = {name: make(backend, watchdog) for name, make in variants.items()}
    methods = {name: Method(timing="pipelined" if "pipelined" in name or "C," in name
                            else "per-op", pipeline=PIPELINE, check=0) for name in variants}
    # fewer samples where one takes milliseconds, the same number on every rank
    big = size >= (1 << 20)
    counts = {name: max(4, (args.pipelined_samples if methods[name].timing == "pipelined"
                            else args.samples) // (4 if big else 1)) for name in variants}
    for name, run in made.items():                   # warm-up, untimed
        run(bufs, case, methods[name], 3)
    blocks: dict[str, list[list[float]]] = {name: [] for name in variants}
    order = list(made)
    for block in range(args.blocks):
        for name in order if block % 2 == 0 else order[::-1]:
            blocks[name].append(made[name](bufs, case, methods[name], counts[name]))
    return blocks


# -- launcher side ---------------------------------------------------------------------------
def _compile(folder: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        sys.exit("bench_timed_region: the mpi comparison needs a C compiler (cc)")
    source = folder / "loops.c"
    source.write_text(C_SOURCE, encoding="utf-8")
    for handle_bytes, handle in ((4, "int"), (8, "void *")):
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", f"-DHANDLE={handle}", "-o",
                        str(folder / f"loops{handle_bytes}.so"), str(source)], check=True)


def _launch(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    from ccbench.run.addresses import free_port

    port = str(free_port("127.0.0.1"))
    me = [sys.executable, str(Path(__file__).resolve()), "--backend", args.backend, "--as-rank",
          "--port", port, "--out", str(folder), "--blocks", str(args.blocks), "--samples",
          str(args.samples), "--pipelined-samples", str(args.pipelined_samples),
          "--sizes", ",".join(map(str, args.sizes))]
    from ccbench.run.control import SECRET_VAR, new_secret

    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
           SECRET_VAR: new_secret()}                  # shared by the two ranks' store
    env.pop("I_MPI_WAIT_MODE", None)              # busy polling, as IMB and OSU run
    if args.backend == "mpi":
        mpiexec = Path(sys.executable).parent / "mpiexec"
        subprocess.run([str(mpiexec), "-n", "2", *me], env=env, check=True, timeout=1800)
    else:
        procs = [subprocess.Popen([*me, "--rank", str(r)], env=env) for r in (0, 1)]
        for proc in procs:
            if proc.wait(timeout=1800):
                sys.exit(f"bench_timed_region: a rank failed ({proc.returncode})")
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


def _block_medians(ranks: list[dict[str, Any]], size: int, name: str,
                   combine: Callable[[tuple[float, ...]], float] = max) -> list[float]:
    """Per block: the median over samples of the max over ranks (ccbench's combination), us;
    with `combine` the mean, OSU's combination (its average latency is the mean over ranks)."""
    per_rank = [r[str(size)][name] for r in ranks]
    return [statistics.median(combine(pair) for pair in zip(*(blocks[b] for blocks in per_rank),
                                                            strict=True))
            * 1e6 for b in range(len(per_rank[0]))]


def _fmt(values: list[float], digits: int = 2) -> str:
    middle = statistics.median(values)
    return f"{middle:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


PAIRS = {"gloo": [("ccbench per-op", "bare loop")],
         "mpi": [("ccbench per-op", "bare mpi4py per-op"), ("ccbench pipelined", "C, IMB's loop"),
                 ("ccbench pipelined", "C, OSU's loop")]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--launches", type=int, default=5, help="separate process launches")
    parser.add_argument("--blocks", type=int, default=6, help="alternating blocks per size")
    parser.add_argument("--samples", type=int, default=40, help="per-op samples per block")
    parser.add_argument("--pipelined-samples", type=int, default=20,
                        help=f"pipelined samples ({PIPELINE} calls each) per block")
    parser.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=SIZES)
    parser.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_rank:
        _rank_main(args)
        return
    launches: list[list[dict[str, Any]]] = []
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        if args.backend == "mpi":
            _compile(Path(tmp))
        for number in range(args.launches):
            folder = Path(tmp, f"launch{number}")
            folder.mkdir()
            for so in Path(tmp).glob("loops*.so"):
                shutil.copy(so, folder)
            launches.append(_launch(args, folder))
            loads.append(os.getloadavg()[0])
            print(f"# launch {number + 1}/{args.launches} done, load {loads[-1]:.1f}",
                  file=sys.stderr, flush=True)
    library = ""
    if args.backend == "mpi":
        library = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI."
                                  "Get_library_version().splitlines()[0])"], capture_output=True,
                                 text=True, check=False).stdout.replace("\0", "").strip()
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  "
          f"{platform.node()}  {os.cpu_count()} cores  2 ranks  {args.backend} {library}")
    print(f"# load average {min(loads):.1f}-{max(loads):.1f} during the run; {args.launches} "
          f"launches x {args.blocks} alternating blocks; medians over launches (min-max "
          "between launches); times in us, max over ranks per sample")
    for first, second in PAIRS[args.backend]:
        osu = "OSU" in second       # also against OSU's own statistic, the mean over ranks
        extra = " | its mean over ranks | ratio to that |" if osu else " |"
        print(f"\n| bytes | {first} | {second} | ratio | ratio per launch{extra}")
        print("|---|---|---|---|---|" + ("---|---|" if osu else ""))
        for size in args.sizes:
            ours, theirs, ratios, means, to_means = [], [], [], [], []
            for ranks in launches:
                a, b = _block_medians(ranks, size, first), _block_medians(ranks, size, second)
                ours.append(statistics.median(a))
                theirs.append(statistics.median(b))
                ratios.append(statistics.median(x / y for x, y in zip(a, b, strict=True)))
                m = _block_medians(ranks, size, second, statistics.fmean)
                means.append(statistics.median(m))
                to_means.append(statistics.median(x / y for x, y in zip(a, m, strict=True)))
            per_launch = " ".join(f"{r:.2f}" for r in ratios)
            tail = f" | {_fmt(means)} | {_fmt(to_means)} |" if osu else " |"
            print(f"| {size} | {_fmt(ours)} | {_fmt(theirs)} | {_fmt(ratios)} | {per_launch}{tail}")


if __name__ == "__main__":
    main()
