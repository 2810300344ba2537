"""The flags of nccl-tests, the OSU micro-benchmarks and PARAM: each one's meaning (argv ->
config, in process), the rank combination they select, and real 2-rank runs of their command
lines with `ccbench launch -n 2` in front. Their bad values are in tests/test_cli_errors.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_ccbench

from ccbench.bench.familiar import resolve_familiar
from ccbench.bench.harness import _summarize, combine_ranks
from ccbench.cli import bench_parser, config_from_args
from ccbench.collectives import layout
from ccbench.records import load_records


def config(*argv: str) -> Any:
    args = list(argv)
    return config_from_args(bench_parser().parse_args(args), args)


def _pow2(low: int, high: int, factor: int = 2) -> list[int]:
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= factor
    return out


# (argv, {dotted attribute of BenchConfig: expected value})
MEANINGS: dict[str, tuple[list[str], dict[str, object]]] = {
    "nccl-tests -b -e -f": (["allreduce", "-b", "8", "-e", "128M", "-f", "2"],
                            {"sizes": _pow2(8, 128 << 20)}),
    "nccl-tests -f 4": (["allreduce", "-b", "1K", "-e", "1M", "-f", "4"],
                        {"sizes": _pow2(1 << 10, 1 << 20, 4)}),
    "nccl-tests -b alone": (["allreduce", "-b", "4M"], {"sizes": _pow2(4 << 20, 16 << 20)}),
    "nccl-tests -e alone, below the default start": (["allreduce", "-e", "512"], {"sizes": [512]}),
    "nccl-tests -f alone": (["allreduce", "-f", "4"], {"sizes": _pow2(1 << 10, 16 << 20, 4)}),
    "nccl-tests -g 1": (["allreduce", "-g", "1"], {"sizes": _pow2(1 << 10, 16 << 20)}),
    "nccl-tests -c": (["allreduce", "-c", "0"], {"method.check": 0}),
    "nccl-tests -n -w": (["allreduce", "-n", "7", "-w", "3"],
                         {"method.iters": 7, "method.warmup": 3}),
    "nccl-tests -o": (["allreduce", "-o", "max"], {"ops": ["max"]}),
    "nccl-tests -o all": (["allreduce", "-o", "all"],
                          {"ops": ["sum", "max", "min", "prod", "avg"]}),
    "nccl-tests -o avg": (["allreduce", "-o", "avg"], {"ops": ["avg"]}),
    "nccl-tests -d int64,uint8": (["allreduce", "-d", "int64,uint8"],
                                  {"dtypes": ["int64", "uint8"]}),
    "nccl-tests -d float": (["allreduce", "-d", "float"], {"dtypes": ["float32"]}),
    "nccl-tests -d half,double,bfloat16": (["allreduce", "-d", "half,double,bfloat16"],
                                           {"dtypes": ["float16", "float64", "bfloat16"]}),
    "nccl-tests -d int8,int32": (["allreduce", "-d", "int8,int32"], {"dtypes": ["int8", "int32"]}),
    "nccl-tests -a 0": (["allreduce", "-a", "0"], {"method.combine": "rank0"}),
    "nccl-tests -a 1": (["allreduce", "-a", "1"], {"method.combine": "mean"}),
    "nccl-tests -a 2": (["allreduce", "-a", "2"], {"method.combine": "min"}),
    "nccl-tests -a 3": (["allreduce", "-a", "3"], {"method.combine": "max"}),
    "default combination": (["allreduce"], {"method.combine": "max"}),
    "--combine": (["allreduce", "--combine", "mean"], {"method.combine": "mean"}),
    "-a agreeing with --combine": (["allreduce", "-a", "2", "--combine", "min"],
                                   {"method.combine": "min"}),
    "nccl-tests -z 0": (["allreduce", "-z", "0"], {"method.timing": "per-op"}),
    "nccl-tests -z 0 pipelined": (["allreduce", "-z", "0", "--timing", "pipelined"],
                                  {"method.timing": "pipelined"}),
    "nccl-tests -z 1": (["allreduce", "-z", "1"], {"method.timing": "per-op"}),
    "nccl-tests -G 0": (["allreduce", "-G", "0"], {"method.timing": "per-op",
                                                  "options": {"nccl_algo": None,
                                                              "nccl_proto": None,
                                                              "cuda_graph": False,
                                                              "mpi_thread_level": "funneled"}}),
    "nccl-tests -J": (["allreduce", "-J", "/tmp/x.json"], {"output": "/tmp/x.json"}),
    "nccl-tests -r -T": (["broadcast", "-r", "1", "-T", "60"],
                         {"root": 1, "method.timeout": 60.0}),
    "nccl-tests program name": (["all_reduce_perf"], {"collectives": ["allreduce"]}),
    "nccl-tests reduce_perf -r": (["reduce_perf", "-r", "1", "-o", "sum,max"],
                                  {"collectives": ["reduce"], "root": 1, "ops": ["sum", "max"]}),
    "OSU osu_reduce": (["osu_reduce"], {"collectives": ["reduce"]}),
    "nccl-tests sendrecv_perf": (["sendrecv_perf"], {"collectives": ["sendrecv"]}),
    "nccl-tests program path": (["./build/reduce_scatter_perf"],
                                {"collectives": ["reduce-scatter"]}),
    "OSU -m": (["allreduce", "-m", "8:1048576"], {"sizes": _pow2(8, 1 << 20)}),
    "OSU -m MAX": (["allreduce", "-m", "4K"], {"sizes": _pow2(1 << 10, 4 << 10)}),
    "OSU -m MIN:": (["allreduce", "-m", "1M:"], {"sizes": _pow2(1 << 20, 16 << 20)}),
    "OSU -i -x": (["osu_allreduce", "-i", "1000", "-x", "100"],
                  {"method.iters": 1000, "method.warmup": 100}),
    "OSU -f": (["osu_allreduce", "-f"], {"full": True, "sizes": _pow2(1 << 10, 16 << 20)}),
    "OSU -f then a flag": (["osu_bcast", "-f", "-m", "8:64"],
                           {"full": True, "sizes": [8, 16, 32, 64], "collectives": ["broadcast"]}),
    "nccl-tests -f N is not --full": (["allreduce", "-f", "2"], {"full": False}),
    "PARAM --b --e --f": (["--collective", "all_reduce", "--b", "8", "--e", "1M", "--f", "4"],
                          {"sizes": _pow2(8, 1 << 20, 4), "collectives": ["allreduce"]}),
    "PARAM --n --w": (["--collective", "all_gather,all_to_all", "--n", "9", "--w", "1"],
                      {"method.iters": 9, "method.warmup": 1,
                       "collectives": ["allgather", "alltoall"]}),
    "defaults unchanged": (["allreduce"], {"sizes": _pow2(1 << 10, 16 << 20), "method.iters": 20,
                                           "method.warmup": 5, "output": None, "full": False}),
}


def _get(obj: object, dotted: str) -> object:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_nccl_tests_float8_names() -> None:
    """nccl-tests' -d f8e4m3 / f8e5m2 (asked of a collective that moves them)."""
    cfg = config("allgather", "-d", "f8e4m3,f8e5m2", "--backend", "mpi")
    assert cfg.dtypes == ["float8_e4m3fn", "float8_e5m2"]


@pytest.mark.parametrize("name", sorted(MEANINGS))
def test_flag_meaning(name: str) -> None:
    argv, expected = MEANINGS[name]
    cfg = config(*argv, "--backend", "gloo")
    for attribute, value in expected.items():
        assert _get(cfg, attribute) == value, (attribute, _get(cfg, attribute))


def test_nccl_tests_G_turns_on_cuda_graphs_for_nccl_cupy() -> None:
    args = bench_parser().parse_args(["all_reduce_perf", "-G", "10", "--backend", "nccl-cupy"])
    resolve_familiar(args)
    assert args.cuda_graph is True


def test_full_nccl_tests_command_line() -> None:
    cfg = config(*("all_reduce_perf -b 8 -e 128M -f 2 -g 1 -c 1 -n 20 -w 5 -o sum -d float -a 3 "
                   "-z 0 -G 0 -J /tmp/out.json --backend gloo").split())
    assert cfg.collectives == ["allreduce"] and cfg.sizes == _pow2(8, 128 << 20)
    assert (cfg.method.iters, cfg.method.warmup, cfg.method.check) == (20, 5, 1)
    assert (cfg.ops, cfg.dtypes, cfg.method.combine) == (["sum"], ["float32"], "max")
    assert cfg.output == "/tmp/out.json" and cfg.method.timing == "per-op"


def test_combinations_match_the_option_table() -> None:
    from ccbench.bench.familiar import COMBINE_LABELS
    from ccbench.bench.options import option_named

    assert option_named("combine").choices == tuple(COMBINE_LABELS)


def test_help_names_each_tool() -> None:
    text = bench_parser().format_help()
    for heading in ("nccl-tests flags", "OSU micro-benchmark flags", "PARAM comms flags",
                    "under `ccbench launch`, a -n before the collective"):
        assert heading in text


# a (ranks x iterations) matrix with a different answer for every combination
_TIMES = [[1.0, 9.0, 5.0], [3.0, 2.0, 8.0], [2.0, 4.0, 2.0]]   # seconds, 3 ranks


@pytest.mark.parametrize("combine, expected", [
    ("max", [3.0, 9.0, 8.0]), ("min", [1.0, 2.0, 2.0]), ("rank0", [1.0, 9.0, 5.0]),
    ("mean", [2.0, 5.0, 5.0])])
def test_rank_times_combine_as_asked(combine: str, expected: list[float]) -> None:
    assert combine_ranks(np.asarray(_TIMES), combine).tolist() == expected
    per_rank = [{"samples": row, "wrong": 0, "copy_us": None} for row in _TIMES]
    result = _summarize(layout("allreduce", 1024, 4, 3), per_rank, 3, True, combine)
    assert result.samples_us == [v * 1e6 for v in expected]
    assert result.time_us["median"] == float(np.median(expected)) * 1e6
    # each rank's own median does not depend on the combination
    assert result.rank_median_us == [5e6, 3e6, 2e6]


def _records(path: Path) -> list[Any]:
    records = load_records(str(path))
    assert records, "no records"
    return records


def test_nccl_tests_command_line_runs_at_2_ranks(tmp_path: Path) -> None:
    """The nccl-tests command line as typed (sizes kept small), `ccbench launch -n 2` in
    front; -n after the program name is the iteration count, not the rank count."""
    out = tmp_path / "out.json"
    proc = run_ccbench("launch", "-n", "2", "all_reduce_perf", "-b", "8", "-e", "1K", "-f", "2",
                       "-g", "1", "-c", "1", "-n", "20", "-w", "5", "-o", "sum", "-d", "float",
                       "-a", "3", "-z", "0", "-G", "0", "-J", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "time max over ranks" in proc.stdout
    records = _records(out)
    assert sorted({r.size_asked for r in records}) == _pow2(8, 1024)
    for rec in records:
        assert (rec.collective, rec.dtype, rec.op, rec.world_size) == ("allreduce", "float32",
                                                                       "sum", 2)
        assert (rec.iterations, rec.warmup, rec.wrong) == (20, 5, 0)
        assert rec.method["combine"] == "max over ranks"
        assert rec.method["check"] == 1
        assert len(rec.samples_us) == 20 and len(rec.rank_median_us) == 2
    assert all(json.loads(line)["schema"] == "ccbench.record" for line in
               out.read_text().splitlines())


def test_osu_command_line_runs_at_2_ranks(tmp_path: Path) -> None:
    """osu_allreduce's command line (small sizes) with the mean over ranks prints OSU's
    columns; -f adds Min, Max (over ranks, of each rank's median) and Iterations."""
    out = tmp_path / "osu.jsonl"
    proc = run_ccbench("launch", "-n", "2", "osu_allreduce", "-m", "8:64", "-i", "12", "-x",
                       "2", "-f", "--combine", "mean", "-O", str(out), "--backend", "gloo",
                       timeout=600)
    assert proc.returncode == 0, proc.stderr
    header = "# Size         Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations"
    assert header in proc.stdout, proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line[:1].isdigit()]
    assert [int(row[0]) for row in rows] == [8, 16, 32, 64]
    for _, avg, low, high, iterations in rows:      # one statistic: min <= avg <= max
        assert float(low) <= float(avg) <= float(high) and iterations == "12"
    records = _records(out)
    assert sorted({r.size_asked for r in records}) == [8, 16, 32, 64]
    assert {(r.iterations, r.warmup) for r in records} == {(12, 2)}
    assert {r.method["combine"] for r in records} == {"mean over ranks"}


def test_an_osu_program_defaults_to_mpi_and_osu_columns() -> None:
    args = bench_parser().parse_args(["osu_allreduce", "-m", "8:64"])
    resolve_familiar(args)
    assert (args.backend, args.format) == ("mpi", "osu")
    args = bench_parser().parse_args(["osu_allreduce", "--backend", "gloo", "--format", "csv"])
    resolve_familiar(args)
    assert (args.backend, args.format) == ("gloo", "csv")
    args = bench_parser().parse_args(["all_reduce_perf"])
    resolve_familiar(args)
    assert (args.backend, args.format) == (None, "table")
