"""One table of benchmark options makes both the command-line flags and the sweep keys: every
option round-trips options -> argv -> options, is settable in a sweep, and reaches the argv a
sweep case runs with."""

from __future__ import annotations

import pytest

from ccbench.bench_options import BENCH_OPTIONS, option_argv
from ccbench.cli import bench_parser, config_from_args
from ccbench.errors import UsageError
from ccbench.sweep.plan import bench_arguments, plan_runs
from ccbench.sweep.spec import sweep_from_dict

# a value other than the default for every option (valid on a CPU-only machine)
NON_DEFAULT = {"iters": 7, "warmup": 2, "min_time": 0.25, "max_iters": 9, "pipeline": 4,
               "check": 0, "timeout": 12.5, "connect_timeout": 3.0, "root": 1, "device": "cpu",
               "mpi_thread_level": "single", "nccl_algo": "Ring", "nccl_proto": "Simple",
               "combine": "mean"}


def test_every_option_has_a_non_default_example() -> None:
    assert set(NON_DEFAULT) == {option.name for option in BENCH_OPTIONS}
    assert all(NON_DEFAULT[o.name] != o.default for o in BENCH_OPTIONS)


def test_options_round_trip_through_the_command_line() -> None:
    args = bench_parser().parse_args(["allreduce", *option_argv(NON_DEFAULT)])
    assert {name: getattr(args, name) for name in NON_DEFAULT} == NON_DEFAULT
    defaults = bench_parser().parse_args(["allreduce"])
    assert {o.name: getattr(defaults, o.name) for o in BENCH_OPTIONS} == \
        {o.name: o.default for o in BENCH_OPTIONS}


def test_every_option_is_settable_in_a_sweep_and_reaches_the_case_command() -> None:
    sweep = sweep_from_dict({"name": "t", "backends": ["nccl"], "ranks_per_node": [2],
                             "sizes": "1K", **NON_DEFAULT})
    assert sweep.bench == NON_DEFAULT
    runs = plan_runs(sweep.cases(), {})
    argv = bench_arguments(sweep, runs[0], "out.jsonl")
    args = bench_parser().parse_args(argv)
    assert {name: getattr(args, name) for name in NON_DEFAULT} == NON_DEFAULT
    assert {case.identity.root for case in sweep.cases()} == {1}   # records carry the root


@pytest.mark.parametrize(("key", "value", "words"), [
    ("iters", 0, "must be >= 1"), ("iters", 2.5, "expected an integer"), ("timeout", 0, "must be > 0"),
    ("timeout", float("nan"), "finite"), ("device", "tpu", "auto, cpu, cuda"),
    ("mpi_thread_level", "many", "single"), ("root", 2, "not a rank"),
    ("max_iters", 3, "below iters"), ("pipeline", "ten", "expected a number")])
def test_sweep_refuses_a_bad_option_naming_the_key(key: str, value: object, words: str) -> None:
    data = {"name": "t", "ranks_per_node": [2], key: value}
    if key == "max_iters":
        data["iters"] = 5
    with pytest.raises(UsageError) as info:
        sweep_from_dict(data, where="s.yaml")
    assert key in str(info.value) and words in str(info.value)


def test_the_command_line_checks_the_same_options() -> None:
    with pytest.raises(UsageError):
        config_from_args(bench_parser().parse_args(["allreduce", "--timeout", "nan"]), [])
