"""Bad input: one line `ccbench: error: ...`, exit status 2, no traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, run_ccbench, run_ccbench_forked

CASES = {
    "unknown collective": (["allsum", "--sizes", "1K"], "unknown collective 'allsum'"),
    "output named for CSV": (["allreduce", "-O", "x.csv"], "for CSV use --format csv"),
    "output named for gzip": (["allreduce", "-O", "x.jsonl.gz"], "not '.jsonl.gz'"),
    "unknown backend": (["allreduce", "--backend", "foo"], "unknown backend 'foo'"),
    "unknown dtype": (["allreduce", "--dtype", "float8"], "unknown dtype 'float8'"),
    "unknown op": (["allreduce", "--op", "mean"], "unknown op 'mean'"),
    "avg on mpi": (["allreduce", "--backend", "mpi", "--op", "avg"],
                   "unsupported by mpi: avg (MPI has no MPI_AVG reduction)"),
    "avg on mpi, every dtype": (["all", "--backend", "gloo,mpi", "--op", "avg", "-d", "all"],
                                "unsupported by mpi: avg"),
    "integer avg on gloo": (["allreduce", "--backend", "gloo", "--op", "avg", "-d", "int64"],
                            "unsupported by gloo: avg on int64"),
    "float8 sums on gloo": (["allreduce", "--backend", "gloo", "--dtype", "f8e5m2"],
                            "unsupported by gloo: sum on float8_e5m2 (gloo has no float8"),
    "float8 sums in the algorithms": (["allreduce", "--backend", "ring", "-d", "fp8_e4m3"],
                                      "unsupported by the algorithm backends: sum on "
                                      "float8_e4m3fn"),
    "launch avg on mpi": (["launch", "-n", "2", "allreduce", "--backend", "mpi", "-o", "avg"],
                          "unsupported by mpi: avg"),
    "malformed sizes": (["allreduce", "--sizes", "1Q"], "malformed size '1Q'"),
    "empty sizes": (["allreduce", "--sizes", ""], "empty --sizes"),
    "zero size": (["allreduce", "--sizes", "0"], "size must be positive"),
    "negative size": (["allreduce", "--sizes", "-8"], "is negative"),
    "too large": (["allreduce", "--sizes", "4T"], "GiB is free"),
    "bad iters": (["allreduce", "--iters", "0"], "--iters must be > 0"),
    "unknown flag": (["allreduce", "--bogus"], "unrecognized arguments"),
    "bad timing": (["allreduce", "--timing", "fast"], "invalid choice"),
    "launch without a benchmark": (["launch", "-n", "2"], "launch needs a benchmark"),
    "launch zero ranks": (["launch", "-n", "0", "allreduce"], "-n must be >= 1, got 0"),
    "launch bad collective": (["launch", "-n", "2", "nope"], "unknown collective 'nope'"),
    "negative size without range": (["allreduce", "--sizes=-5"], "'-5' is negative"),
    "timeout nan": (["allreduce", "--timeout", "nan"], "--timeout must be a finite number"),
    "timeout inf": (["allreduce", "--timeout", "inf"], "--timeout must be a finite number"),
    "min-time nan": (["allreduce", "--min-time", "nan"], "--min-time must be a finite number"),
    "connect-timeout zero": (["allreduce", "--connect-timeout", "0"], "--connect-timeout must"),
    "root beyond ranks": (["launch", "-n", "2", "broadcast", "--backend", "gloo", "--root", "5"],
                          "--root 5 is not a rank of -n 2 (valid: 0 to 1)"),
    "negative root": (["broadcast", "--root", "-1"], "--root must be >= 0"),
    "too many ranks": (["launch", "-n", "100000", "allreduce", "--backend", "gloo"],
                       "-n 100000 is more ranks than this machine can run: at most"),
    "mpiexec missing": (["launch", "-n", "2", "--mpiexec", "/nonexistent/mpiexec", "allreduce",
                         "--backend", "mpi"], "--mpiexec '/nonexistent/mpiexec': no such"),
    "mpiexec false": (["launch", "-n", "2", "--mpiexec", "/bin/false", "allreduce",
                       "--backend", "mpi"], "is not a working mpiexec"),
    "nothing to measure": (["launch", "-n", "4", "alltoall", "--backend", "gloo", "--dtype",
                            "int8", "--sizes", "3"], "nothing to measure"),
    "max-iters below iters": (["allreduce", "--max-iters", "2", "--iters", "5"],
                              "--max-iters 2 is below --iters 5"),
    "empty backend item": (["allreduce", "--backend", "gloo,"], "malformed --backend 'gloo,'"),
    "nccl-algo with gloo": (["allreduce", "--backend", "gloo", "--nccl-algo", "Ring"],
                            "--nccl-algo 'Ring' only applies to the nccl, nccl-cupy and rccl backends"),
    "cuda-graph with gloo": (["allreduce", "--backend", "gloo", "--cuda-graph"],
                             "--cuda-graph only applies to backend nccl-cupy"),
    "abbreviated option": (["allreduce", "--time", "1"], "unrecognized arguments: --time"),
    "abbreviated launch option": (["launch", "-n", "2", "--mpi", "x", "allreduce"],
                                  "unknown option --mpi (`ccbench launch` takes --nprocs, --mpiexec"),
    "output folder missing": (["allreduce", "--output", "/nonexistent/dir/x.jsonl"],
                              "folder '/nonexistent/dir' does not exist"),
    # the flags of nccl-tests, OSU and PARAM (ccbench/bench/familiar.py): refused, never guessed
    "nccl-tests -g 2": (["all_reduce_perf", "-g", "2"], "-g 2: ccbench runs one rank per process"),
    "nccl-tests -t 4": (["allreduce", "-t", "4"], "-t 4: ccbench runs one rank per process"),
    "nccl-tests -G 10 with gloo": (["all_reduce_perf", "-G", "10", "--backend", "gloo"],
                                   "-G 10 (CUDA graphs) only applies to backend nccl-cupy"),
    "nccl-tests -G -1": (["all_reduce_perf", "-G", "-1"], "-G -1: nccl-tests' CUDA-graph"),
    "nccl-tests -a 4": (["allreduce", "-a", "4"], "-a 4: nccl-tests' average mode is 0"),
    "-a against --combine": (["allreduce", "-a", "1", "--combine", "max"],
                             "-a 1 (mean) contradicts --combine max"),
    "nccl-tests -z 2": (["allreduce", "-z", "2"], "-z 2: nccl-tests' blocking flag is 0 or 1"),
    "-z 1 with pipelined": (["allreduce", "-z", "1", "--timing", "pipelined"],
                            "-z 1 (wait for every operation) contradicts --timing pipelined"),
    "nccl-tests -f 1": (["allreduce", "-b", "8", "-e", "1K", "-f", "1"],
                        "-f takes an integer step factor >= 2"),
    "-f swallowing the collective": (["-f", "allreduce"], "got 'allreduce'"),
    "nccl-tests -b above -e": (["allreduce", "-b", "1M", "-e", "8K"], "-b 1M is above -e 8K"),
    "nccl-tests bad -b": (["allreduce", "-b", "8Q"], "malformed size '8Q'"),
    "-b with --sizes": (["allreduce", "-b", "8", "--sizes", "1K"],
                        "sizes given twice: --sizes and -b/-e (nccl-tests)"),
    "-m with -e": (["allreduce", "-m", "8:64", "-e", "1K"], "sizes given twice"),
    "-f N with --sizes": (["allreduce", "-f", "4", "--sizes", "1K-1M"],
                          "with --sizes write the factor in it"),
    "nccl-tests -i (step bytes)": (["all_reduce_perf", "-b", "8", "-e", "8M", "-i", "1048576"],
                                   "in nccl-tests -i is the step in bytes"),
    "OSU -i with -n": (["osu_allreduce", "-i", "100", "-n", "20"], "iterations given twice"),
    "OSU -i not a number": (["osu_allreduce", "-i", "1K"], "-i is OSU's iteration count"),
    "-J with --output": (["allreduce", "-J", "a.json", "--output", "b.jsonl"],
                         "output given twice"),
    "PARAM collective twice": (["allreduce", "--collective", "all_gather"],
                               "two collectives given"),
    "no collective": (["--b", "8"], "a collective is needed"),
    "nccl-tests program without counterpart": (["hypercube_perf"], "nccl-tests' hypercube_perf has"),
    "launch -n twice before the collective": (["launch", "-n", "2", "-n", "20", "allreduce"],
                                              "-n given twice before the benchmark (2 and 20)"),
    "replay timeout nan": (["replay", "t.json", "--timeout", "nan"],
                           "--timeout must be a finite number of seconds, got nan"),
    "launch --repeat 0": (["launch", "-n", "2", "--repeat", "0", "allreduce", "--backend", "gloo"],
                          "--repeat must be >= 1, got 0"),
    "subcommand typo": (["simulat", "model.json", "--ranks", "4"],
                        "unknown command 'simulat' (did you mean simulate?)"),
    "collective typo": (["allreduc", "--sizes", "1K"],
                        "unknown command 'allreduc' (did you mean allreduce?)"),
    "launch, a benchmark option before the collective": (
        ["launch", "-n", "3", "--backend", "gloo", "allreduce"],
        "--backend is the benchmark's option: put it after the collective "
        "(`ccbench launch -n 3 COLLECTIVE --backend ...`)"),
    "launch, an unknown option": (["launch", "--bogus", "allreduce"],
                                  "unknown option --bogus (`ccbench launch` takes --nprocs"),
    "launch collective typo": (["launch", "-n", "2", "allgathr"],
                               "unknown command 'allgathr' (did you mean allgather?)"),
    "records given to simulate": (["simulate", "tests/fixtures/records-v1.jsonl", "--ranks",
                                   "4", "allreduce"],
                                  "is a records file (what a run writes), not a model: "
                                  "calibrate it first"),
    "calibrate into missing folder": (["calibrate", "tests/fixtures/records-v1.jsonl", "-o",
                                       "/nonexistent/dir/model.json"],
                                      "folder '/nonexistent/dir' does not exist"),
}


def assert_one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ccbench: error: "), lines
    assert needle in lines[0], lines
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(name: str) -> None:
    args, needle = CASES[name]
    assert_one_line_error(run_ccbench_forked(*args, timeout=120), needle)


# cases whose argument is an existing file or folder, which must be left byte-identical
FILE_CASES = {
    "output is a directory": (lambda d: ["allreduce", "--output", str(d)], "is a directory"),
    "output holds a CSV": (lambda d: ["allreduce", "--output", str(d / "table.csv")],
                           "not '.csv' (valid suffixes: .jsonl, .json, .parquet"),
    "output holds other JSON lines": (lambda d: ["allreduce", "--output", str(d / "other.jsonl")],
                                      "not ccbench records"),
    "launch output holds a CSV": (lambda d: ["launch", "-n", "2", "allreduce", "--backend", "gloo",
                                             "--output", str(d / "table.csv")],
                                  "records are written as JSON lines or Parquet, not '.csv'"),
    "report into an existing file": (lambda d: ["report", "tests/fixtures/records-v1.jsonl", "-o",
                                                str(d / "table.csv")], "is an existing file"),
}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("name", sorted(FILE_CASES))
def test_bad_output_leaves_files_alone(name: str, tmp_path: Path) -> None:
    (tmp_path / "table.csv").write_text("size,time\n1024,3.5\n")
    (tmp_path / "other.jsonl").write_text('{"event": "login", "user": 7}\n')
    before = _snapshot(tmp_path)
    make_args, needle = FILE_CASES[name]
    assert_one_line_error(run_ccbench_forked(*make_args(tmp_path), timeout=120), needle)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("args", [["allreduce", "--op", "mean"], ["launch", "-n", "0", "x"],
                                  ["allreduce", "--help"]])
def test_a_forked_run_is_what_a_started_python_gives(args: list[str]) -> None:
    """run_ccbench_forked (the error cases above) answers what `python -m ccbench` answers."""
    forked, started = run_ccbench_forked(*args), run_ccbench(*args)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (started.returncode, started.stdout, started.stderr)


def test_device_cuda_without_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_one_line_error(run_ccbench_forked("allreduce", "--device", "cuda", "--backend", "gloo"),
                          "--device cuda: no CUDA GPU is visible here")


def test_check_0_does_not_say_ok(tmp_path: Path) -> None:
    proc = run_ccbench("allreduce", "--backend", "gloo", "--sizes", "1K", "--iters", "2",
                       "--warmup", "0", "--check", "0", "-q", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "0 OK" not in proc.stdout and "not checked (--check 0)" in proc.stdout


def test_valid_choices_are_listed() -> None:
    proc = run_ccbench_forked("allreduce", "--dtype", "float8")
    assert "float32" in proc.stderr and "bfloat16" in proc.stderr
    proc = run_ccbench_forked("allreduce", "--backend", "foo")
    assert "gloo" in proc.stderr and "mpi" in proc.stderr


def test_missing_library_is_unavailable(tmp_path: Path) -> None:
    """An mpi4py whose libmpi cannot load: 'unavailable: <why>', exit 2."""
    fake = tmp_path / "fake" / "mpi4py"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ImportError('libmpi.so.12: cannot open shared object file')\n")
    env = {"PYTHONPATH": str(tmp_path / "fake")}
    proc = run_ccbench("allreduce", "--backend", "mpi", "--sizes", "1K", env=env)
    assert_one_line_error(proc, "backend 'mpi' unavailable")
    proc = run_ccbench("launch", "-n", "2", "allreduce", "--backend", "mpi", env=env)
    assert_one_line_error(proc, "cannot load an MPI library")


def test_a_torch_without_gloo_is_refused_by_the_ranks_in_one_line(tmp_path: Path) -> None:
    """`ccbench launch` does not import torch to probe gloo (GlooBackend.unavailable_before_launch):
    the ranks' own probe refuses it, in one line, exit 2."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import torch.distributed\ntorch.distributed.is_gloo_available = lambda: False\n")
    proc = run_ccbench("launch", "-n", "2", "allreduce", "--backend", "gloo", "--sizes", "1K",
                       env={"PYTHONPATH": str(site)}, timeout=120)
    assert_one_line_error(proc, "backend 'gloo' unavailable: this torch build has no gloo")


def test_ranks_with_different_arguments(tmp_path: Path) -> None:
    """Two ranks started by hand with different --sizes are refused at start."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank, sizes in ((0, "1K"), (1, "2K")):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "CCBENCH_CONTROL": f"127.0.0.1:{port}", "CCBENCH_CONTROL_SECRET": "by-hand"}
        procs.append(subprocess.Popen(
            [PYTHON, "-m", "ccbench", "allreduce", "--backend", "gloo", "--sizes", sizes, "-q"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2]
    rank0_err = results[0][1]
    assert_one_line_error(subprocess.CompletedProcess([], 2, results[0][0], rank0_err),
                          "ranks launched with different arguments")
    assert results[1][1].strip() == ""          # only rank 0 speaks
