"""The benchmark's method options, in one table: the command line's flags (`cli`) and a sweep
file's keys (`sweep`) are both made from it, so an option added here is settable in both and
validated the same way. The case axes (collective, backend, sizes, dtype, op, in-place, timing)
and what only concerns one process's output (--output, --format, --quiet) are not here.

Cluster wrappers set the same options from the environment: CCBENCH_<NAME> for every option
of the table (CCBENCH_ITERS, CCBENCH_TIMEOUT, ...) and for the axes in ENV_AXES
(CCBENCH_SIZES, CCBENCH_BACKEND, CCBENCH_DTYPE, CCBENCH_OP). The command line wins."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["BENCH_OPTIONS", "DEFAULT_TIMEOUT_S", "ENV_AXES", "BenchOption", "GivenStore",
           "env_name", "environment_settings", "given", "option_argv", "option_named"]

#: seconds one operation (and a library's initialisation) may take before the run is stopped
DEFAULT_TIMEOUT_S = 300.0


class GivenStore(argparse.Action):
    """argparse's plain store that also remembers the option was typed (a default is not):
    two flags that set one thing (-n and OSU's -i) are refused only when both were given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        typed = getattr(namespace, "typed_options", None) or {}
        typed[self.dest] = option_string
        namespace.typed_options = typed


def given(args: argparse.Namespace, name: str) -> str | None:
    """The flag that set `name` on the command line, or None when it holds its default."""
    return (getattr(args, "typed_options", None) or {}).get(name)


@dataclass(frozen=True, slots=True)
class BenchOption:
    """One option: its sweep key / argparse dest (`name`), value type, default, limits."""

    name: str
    kind: type                            # int, float or str
    default: int | float | str | None
    help: str
    short: str | None = None
    minimum: float | None = None          # numbers: the smallest valid value
    positive: bool = False                # numbers: must be > 0 (a limit of time)
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        names = [self.flag, *([self.short] if self.short else [])]
        parser.add_argument(*names, dest=self.name, type=self.kind, default=self.default,
                            choices=self.choices, help=self.help, action=GivenStore)

    def check(self, value: Any) -> int | float | str:
        """The value as this option holds it; ValueError (naming the valid form) otherwise."""
        if self.kind is str:
            if not isinstance(value, str) or not value:
                raise ValueError(f"expected text, got {value!r}")
            if self.choices and value not in self.choices:
                raise ValueError(f"{value!r} is not one of {', '.join(self.choices)}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {value!r}")
        if self.kind is int and value != int(value):
            raise ValueError(f"expected an integer, got {value!r}")
        number = self.kind(value)
        if not math.isfinite(number):
            raise ValueError(f"expected a finite number, got {value!r}")
        if self.minimum is not None and number < self.minimum:
            raise ValueError(f"must be >= {self.minimum:g}, got {value!r}")
        if self.positive and number <= 0:
            raise ValueError(f"must be > 0, got {value!r}")
        return number

    def argv(self, value: int | float | str) -> list[str]:
        return [self.flag, f"{value:g}" if isinstance(value, float) else str(value)]


BENCH_OPTIONS: tuple[BenchOption, ...] = (
    BenchOption("iters", int, 20, "timed iterations (default 20)", short="-n", minimum=1),
    BenchOption("warmup", int, 5, "warm-up iterations (default 5)", short="-w", minimum=0),
    BenchOption("combine", str, "max",
                "an iteration's time from its ranks' times: max (default: an operation lasts "
                "until its last rank is done), mean, min, rank0 (nccl-tests: -a 3, 1, 2, 0); "
                "recorded as method.combine", choices=("max", "mean", "min", "rank0")),
    BenchOption("min_time", float, 0.0,
                "raise iterations until the timed part lasts this many seconds", minimum=0),
    BenchOption("max_iters", int, 100000, "at most this many timed iterations (default 100000)",
                minimum=1),
    BenchOption("pipeline", int, 10, "ops per sample with --timing pipelined (default 10)",
                minimum=1),
    BenchOption("check", int, 1, "validation iterations after timing, 0 to skip (default 1)",
                short="-c", minimum=0),
    BenchOption("timeout", float, DEFAULT_TIMEOUT_S,
                f"seconds one operation may take before the run is stopped (default "
                f"{DEFAULT_TIMEOUT_S:g})", positive=True),
    BenchOption("connect_timeout", float, None,
                "seconds a rank may take to reach the control store (default: --timeout, at "
                "most 30)", positive=True),
    BenchOption("root", int, 0, "root rank of broadcast and reduce (default 0)", minimum=0),
    BenchOption("device", str, "auto", "where buffers live (default auto: cuda for nccl, "
                "nccl-cupy and rccl, else cpu)", choices=("auto", "cpu", "cuda")),
    BenchOption("mpi_thread_level", str, "funneled",
                "the thread level MPI is initialised at (default funneled: only the main thread "
                "calls MPI, as in IMB-MPI1 and OSU; mpi4py's own default is multiple, which "
                "slows every call in MPICH and Intel MPI)",
                choices=("single", "funneled", "serialized", "multiple")),
    BenchOption("nccl_algo", str, None, "sets NCCL_ALGO for the run (nccl, nccl-cupy, rccl)"),
    BenchOption("nccl_proto", str, None, "sets NCCL_PROTO for the run"),
)


def option_named(name: str) -> BenchOption:
    return next(option for option in BENCH_OPTIONS if option.name == name)


def option_argv(values: Mapping[str, Any]) -> list[str]:
    """Command-line arguments that set `values` ({name: value}), in the table's order."""
    return [arg for option in BENCH_OPTIONS if option.name in values
            for arg in option.argv(values[option.name])]


#: case axes settable from the environment besides the table (their values are checked where
#: the command line's are, and an error names the variable)
ENV_AXES: tuple[str, ...] = ("backend", "sizes", "dtype", "op")


def env_name(name: str) -> str:
    """The environment variable of an option or axis: CCBENCH_MIN_TIME for min_time."""
    return "CCBENCH_" + name.upper()


def _from_text(option: BenchOption, raw: str) -> int | float | str:
    """A variable's text as the option's kind (check() then applies its limits)."""
    if option.kind is str:
        return raw
    try:
        number = float(raw)
    except ValueError:
        raise ValueError(f"expected a number, got {raw!r}") from None
    return int(number) if option.kind is int and number.is_integer() else number


def environment_settings(environ: Mapping[str, str]) -> dict[str, tuple[str, Any]]:
    """{name: (variable, value)} for every CCBENCH_<NAME> set (non-empty) in `environ`: table
    options converted and checked as their flags are (ValueError naming the variable), axes
    as text."""
    from ccbench.errors import UsageError

    out: dict[str, tuple[str, Any]] = {}
    for option in BENCH_OPTIONS:
        variable = env_name(option.name)
        raw = environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            out[option.name] = (variable, option.check(_from_text(option, raw)))
        except ValueError as exc:
            raise UsageError(f"{variable}={raw!r}: {exc} (it sets {option.flag})") from None
    for name in ENV_AXES:
        variable = env_name(name)
        raw = environ.get(variable, "").strip()
        if raw:
            out[name] = (variable, raw)
    return out
