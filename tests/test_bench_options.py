"""One table of benchmark options makes both the command-line flags and the sweep keys: every
option round-trips options -> argv -> options, is settable in a sweep, and reaches the argv a
sweep case runs with."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ccbench.bench.options import BENCH_OPTIONS, ENV_AXES, env_name, option_argv
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


def _with_environment(argv: list[str], environ: dict[str, str],
                      monkeypatch: pytest.MonkeyPatch) -> Any:
    from ccbench.cli import _apply_environment

    for name in [k for k in os.environ if k.startswith("CCBENCH_")]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    args = bench_parser().parse_args(argv)
    _apply_environment(args)
    return args


def test_every_option_and_axis_is_settable_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CCBENCH_<NAME> for every option of the table (the names come from it) and the axes."""
    environ = {env_name(name): str(value) for name, value in NON_DEFAULT.items()}
    axes = {"backend": "gloo,mpi", "sizes": "8,1K", "dtype": "int64", "op": "avg"}
    environ.update({env_name(name): value for name, value in axes.items()})
    assert set(ENV_AXES) == set(axes)
    args = _with_environment(["allreduce"], environ, monkeypatch)
    assert {name: getattr(args, name) for name in NON_DEFAULT} == NON_DEFAULT
    assert {name: getattr(args, name) for name in axes} == axes


def test_the_command_line_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"CCBENCH_ITERS": "9", "CCBENCH_SIZES": "8", "CCBENCH_DTYPE": "int8",
               "CCBENCH_TIMEOUT": "40"}
    args = _with_environment(["allreduce", "-n", "3", "--sizes", "1K", "-d", "float"],
                             environ, monkeypatch)
    assert (args.iters, args.sizes, args.dtype, args.timeout) == (3, "1K", "float", 40.0)
    # other tools' flags win too: nccl-tests' -b/-e over CCBENCH_SIZES, OSU's -i over ITERS
    args = _with_environment(["allreduce", "-b", "16", "-e", "32", "-f", "2"], environ,
                             monkeypatch)
    assert args.sizes is None
    cfg = config_from_args(args, [])
    assert (cfg.sizes, cfg.method.iters) == ([16, 32], 9)
    args = _with_environment(["osu_allreduce", "-i", "4", "-m", "8:8"], environ, monkeypatch)
    assert config_from_args(args, []).method.iters == 4


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("CCBENCH_ITERS", "many", "CCBENCH_ITERS='many': expected a number"),
    ("CCBENCH_ITERS", "2.5", "CCBENCH_ITERS='2.5': expected an integer"),
    ("CCBENCH_TIMEOUT", "0", "CCBENCH_TIMEOUT='0': must be > 0"),
    ("CCBENCH_DEVICE", "tpu", "CCBENCH_DEVICE='tpu': 'tpu' is not one of auto, cpu, cuda"),
    ("CCBENCH_SIZES", "1Q", "CCBENCH_SIZES='1Q': malformed size '1Q'"),
    ("CCBENCH_OP", "mean", "CCBENCH_OP='mean': unknown op 'mean'"),
])
def test_a_bad_variable_is_named(variable: str, value: str, message: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(".", r"\.")):
        _with_environment(["allreduce"], {variable: value}, monkeypatch)


def test_the_method_carries_every_method_option() -> None:
    """config_from_args makes the Method from the table: no option is dropped on the way."""
    from ccbench.bench.options import METHOD_OPTIONS

    values = {name: NON_DEFAULT[name] for name in METHOD_OPTIONS}
    args = bench_parser().parse_args(["allreduce", "--backend", "gloo", *option_argv(values)])
    method = config_from_args(args, []).method
    assert {name: getattr(method, name) for name in METHOD_OPTIONS} == values


def test_replay_takes_the_shared_options_with_its_own_defaults_and_the_same_checks() -> None:
    from ccbench.cli import parse_subcommand
    from ccbench.commands.replay import REPLAY_DEFAULTS, SHARED_OPTIONS, launch_plan

    _, args = parse_subcommand("replay", ["t.json"])
    table = {option.name: option.default for option in BENCH_OPTIONS}
    assert {name: getattr(args, name) for name in SHARED_OPTIONS} == \
        {name: REPLAY_DEFAULTS.get(name, table[name]) for name in SHARED_OPTIONS}
    # the benchmark's limits, in the benchmark's words (a NaN timeout was let through)
    for argv, words in ((["--timeout", "nan"], "--timeout must be a finite number of seconds"),
                        (["--iters", "0"], "--iters must be > 0, got 0"),
                        (["--warmup", "-1"], "--warmup must be >= 0, got -1")):
        with pytest.raises(UsageError, match=words):
            launch_plan(["t.json", *argv])


def test_a_sweep_whose_iters_exceed_the_default_max_iters_is_refused() -> None:
    """The cross-option rules take the table's default for a key not given, as the command
    line does: iters 200000 alone would have been refused by every case's command line."""
    with pytest.raises(UsageError, match="max_iters: 100000 is below iters 200000"):
        sweep_from_dict({"name": "t", "ranks_per_node": [2], "iters": 200000})
    sweep_from_dict({"name": "t", "ranks_per_node": [2], "iters": 200000, "max_iters": 200000})


# a new option, declared once: a Method field (what the harness reads) or a RUN_OPTIONS entry
_NEW_FIELD = ('    knob: int = _method_option(3, "a knob (default {default})", minimum=1)\n'
              '    timing: str = "per-op"')
_SURFACES = """
import os, sys
sys.path.insert(0, "scripts")
from ccbench.bench.options import environment_settings
from ccbench.cli import bench_parser, config_from_args
from ccbench.errors import UsageError
from ccbench.sweep.plan import bench_arguments, plan_runs
from ccbench.sweep.spec import sweep_from_dict
import gen_docs

args = bench_parser().parse_args(["allreduce", "--knob", "4"])
assert config_from_args(args, []).method.knob == 4                       # flag -> Method
assert environment_settings({"CCBENCH_KNOB": "5"})["knob"][1] == 5       # environment
try:
    config_from_args(bench_parser().parse_args(["allreduce", "--knob", "0"]), [])
    raise SystemExit("--knob 0 accepted")
except UsageError as exc:
    assert "--knob must be > 0, got 0" in str(exc), exc                  # limits
sweep = sweep_from_dict({"name": "t", "backends": ["gloo"], "sizes": "1K", "knob": 6})
argv = bench_arguments(sweep, plan_runs(sweep.cases(), {})[0], "out.jsonl")
assert bench_parser().parse_args(argv).knob == 6                          # sweep key -> case
assert "`--knob` | `3` | >= 1 | `CCBENCH_KNOB` | a knob (default 3)" in gen_docs.option_table()
assert "a knob (default 3)" in " ".join(bench_parser().format_help().split())   # --help

import ccbench
from ccbench.cli import main
from ccbench.records import load_records, run_metadata
from ccbench.bench.options import run_method_keys
status = main(["allreduce", "--backend", "gloo", "--sizes", "1K", "-n", "2", "-w", "1",
               "--knob", "4", "-q", "--output", "knob.jsonl"])
assert status == 0, status
records = load_records("knob.jsonl")
assert len(records) == 2 and {r.method["knob"] for r in records} == {4}   # the record
assert {r.warmup for r in records} == {1} and {r.iterations for r in records} == {2}
assert run_metadata(records[0], run_method_keys())["method.knob"] == 4      # identity
assert ccbench.load("knob.jsonl")["method_knob"].tolist() == [4, 4]      # ccbench.load
assert "`knob`" in gen_docs.records_reference()                           # records.md
import dataclasses
from ccbench.report.data import method_notes, series_label
other = [dataclasses.replace(r, method={**r.method, "knob": 7}) for r in records[:1]]
assert method_notes(records + other) == []
assert {series_label(r).rsplit(" ", 1)[-1] for r in records + other} == {
    "[knob=4]", "[knob=7]"}                    # report: each value a series of its own
print("ok")
"""


def test_a_new_option_is_one_declaration(tmp_path: Path) -> None:
    """Adding an option edits bench/options.py alone (then the code that reads it, and
    `python scripts/gen_docs.py` rewrites the generated tables): a copy of the package with one
    new Method field has its flag, help, limits, CCBENCH_ variable, sweep key, the argv of a
    sweep's cases, its row in the generated docs, and its place in a measured run's records
    (record.method), in the run identity (run_metadata) and in ccbench.load's columns."""
    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "ccbench", tmp_path / "ccbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "scripts").mkdir()
    shutil.copy(root / "scripts" / "gen_docs.py", tmp_path / "scripts")
    declared = tmp_path / "ccbench" / "bench" / "options.py"
    text = declared.read_text()
    assert text.count('    timing: str = "per-op"') == 1
    declared.write_text(text.replace('    timing: str = "per-op"', _NEW_FIELD))
    env = {key: value for key, value in os.environ.items() if not key.startswith("CCBENCH_")}
    env["PYTHONPATH"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _SURFACES], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ["ok"], proc.stderr
