"""The benchmark's options, each declared once: a field of Method (how a case is measured) or
an entry of RUN_OPTIONS (where and how the ranks run), with its default, help, limits and, from
its name, its flag (--min-time), sweep key (min_time) and environment variable
(CCBENCH_MIN_TIME). Made from BENCH_OPTIONS: the command line's flags (`cli`), replay's shared
flags (`commands/replay`), a sweep file's keys (`sweep`), the environment (below) and the
generated option tables (scripts/gen_docs.py); check_flags() and conflict() are the one
validation, limits and cross-option rules (AT_LEAST), for all of them. The case axes
(collective, backend, sizes, dtype, op, in-place, timing) and what only concerns one process's
output (--output, --format, --quiet) are not here.

Cluster wrappers set the same options from the environment: CCBENCH_<NAME> for every option
of the table (CCBENCH_ITERS, CCBENCH_TIMEOUT, ...) and for the axes in ENV_AXES
(CCBENCH_SIZES, CCBENCH_BACKEND, CCBENCH_DTYPE, CCBENCH_OP). The command line wins."""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, cast

from ccbench.errors import UsageError
from ccbench.timeouts import CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S

__all__ = ["AT_LEAST", "BENCH_OPTIONS", "COMBINE_LABELS", "CONNECT_TIMEOUT_S", "DEFAULT_TIMEOUT_S",
           "ENV_AXES", "HELP_WORDS", "METHOD_OPTIONS", "RUN_OPTIONS", "RUN_RECORD_KEYS", "BenchOption",
           "Conflict", "GivenStore", "Method", "add_options", "check_flags", "conflict",
           "connect_timeout", "env_name", "environment_settings", "given", "method_from",
           "method_record", "option_argv", "option_named", "run_method_keys"]



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


#: what an option's help says where it names members of a registry (the collectives that have
#: a root, the backends that read an option): the caller fills them from the registries
#: (cli.option_words; this module may not import the backends), else these generic words
HELP_WORDS: dict[str, str] = {"rooted": "the collectives with a root",
                              "gpu_backends": "the GPU backends",
                              "nccl_readers": "the NCCL backends"}


def _shown(default: object) -> str:
    return f"{default:g}" if isinstance(default, float) else str(default)


@dataclass(frozen=True, slots=True)
class BenchOption:
    """One option: its sweep key / argparse dest (`name`), value type, default, limits. Its
    flag is --<name> (dashes), its environment variable CCBENCH_<NAME>; `help` may say
    {default}, filled with the default of the parser it is added to."""

    name: str
    kind: type                            # int, float or str
    default: int | float | str | None
    help: str
    short: str | None = None
    minimum: float | None = None          # numbers: the smallest valid value
    positive: bool = False                # numbers: must be > 0 (a limit of time)
    choices: tuple[str, ...] | None = None
    maximum: float | None = None          # numbers: the largest valid value

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def variable(self) -> str:
        return env_name(self.name)

    def help_for(self, default: int | float | str | None,
                 words: Mapping[str, str] | None = None) -> str:
        """The help with {default} and the registries' {words} filled in (HELP_WORDS' own
        words where the caller gives none)."""
        return self.help.format(default=_shown(default), **{**HELP_WORDS, **(words or {})})

    @property
    def limits(self) -> str:
        """The valid values in a few words (the generated option table's `valid` column)."""
        if self.choices:
            return ", ".join(self.choices)
        low = "> 0" if self.positive else (
            "" if self.minimum is None else f">= {self.minimum:g}")
        high = "" if self.maximum is None else f"<= {self.maximum:g}"
        return ", ".join(part for part in (low, high) if part)

    def add_to(self, parser: argparse.ArgumentParser, default: Any = ...,
               words: Mapping[str, str] | None = None) -> None:
        """Add the flag(s); `default` replaces the table's for a command of its own (replay);
        `words` fill the help's names from the registries (cli.option_words)."""
        default = self.default if default is ... else default
        names = [self.flag, *([self.short] if self.short else [])]
        parser.add_argument(*names, dest=self.name, type=self.kind, default=default,
                            choices=self.choices, help=self.help_for(default, words),
                            action=GivenStore)

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
        if self.maximum is not None and number > self.maximum:
            raise ValueError(f"must be <= {self.maximum:g}, got {value!r}")
        return number

    def check_flag(self, value: Any) -> None:
        """A number the flag's type accepted but the limits do not: UsageError in the command
        line's words (`--iters must be > 0, got 0`); argparse already checked types and
        choices."""
        if self.kind is str or value is None:
            return
        if not math.isfinite(value):
            unit = "seconds" if self.kind is float else "iterations"
            raise UsageError(f"{self.flag} must be a finite number of {unit}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise UsageError(f"{self.flag} must be <= {self.maximum:g}, got {value:g}")
        floor = 0.0 if self.positive else self.minimum
        if floor is None:
            return
        # an integer at least 1 is one above 0, and the command line has always said so
        above_zero = self.positive or (self.kind is int and floor == 1)
        too_small = value <= 0 if above_zero else value < floor
        if too_small:
            bound = "> 0" if above_zero else f">= {floor:g}"
            raise UsageError(f"{self.flag} must be {bound}, got {value:g}")

    def argv(self, value: int | float | str) -> list[str]:
        return [self.flag, _shown(value)]


def _method_option(default: int | float | str, help: str, *, recorded_as: str | None = None,
                   labels: Mapping[str, str] | None = None, precision_only: bool = False,
                   **limits: Any) -> Any:
    """A Method field that is also a flag, a sweep key and a CCBENCH_ variable, and an entry
    of every record's method block (method_record): under its own name unless `recorded_as`
    names it (a unit: `min_time_s`), its value or, with `labels`, its value's label.
    `precision_only`: it changes how long or how often a case is measured, not what is
    measured, so runs that differ in it are one series of a report; an option that changes
    the measurement (the default) gives each of its values other than the default a series of
    its own (measured_variant)."""
    return field(default=default, metadata={"option": {"help": help, **limits},
                                            "record": {"as": recorded_as, "labels": labels,
                                                       "precision_only": precision_only}})


#: the longest --timeout: a week (sockets and timers refuse far larger numbers of seconds)
MAX_TIMEOUT_S = 7 * 24 * 3600.0

#: rank-time combinations (--combine): name -> what records say in method.combine
COMBINE_LABELS = {"max": "max over ranks", "mean": "mean over ranks", "min": "min over ranks",
                  "rank0": "rank 0"}


@dataclass(frozen=True, slots=True)
class Method:
    """How each case is measured (docs/design/method.md). Every field but `timing` (a case
    axis, with a flag of its own) is declared here once as an option: its default, help and
    limits make the flag, the sweep key and the CCBENCH_ variable (BENCH_OPTIONS)."""

    iters: int = _method_option(
        20, "timed iterations (default {default}; launch -n, before the collective, counts "
        "ranks)", short="-n", minimum=1, precision_only=True)
    warmup: int = _method_option(5, "warm-up iterations (default {default})", short="-w",
                                 minimum=0, precision_only=True)
    combine: str = _method_option(
        "max", "an iteration's time from its ranks' times: max (default: an operation lasts "
        "until its last rank is done), mean, min, rank0 (nccl-tests: -a 3, 1, 2, 0); "
        "recorded as method.combine", choices=tuple(COMBINE_LABELS), labels=COMBINE_LABELS)
    min_time: float = _method_option(
        0.0, "raise iterations until the timed part lasts this many seconds (default 0: "
        "--iters decides)", minimum=0,
        recorded_as="min_time_s", precision_only=True)
    max_iters: int = _method_option(
        100000, "at most this many timed iterations (default {default})", minimum=1, precision_only=True)
    pipeline: int = _method_option(
        10, "ops per sample with --timing pipelined (default {default})", minimum=1)
    check: int = _method_option(
        1, "validation iterations after timing, 0 to skip (default {default})", short="-c",
        minimum=0, precision_only=True)
    timeout: float = _method_option(
        DEFAULT_TIMEOUT_S, "seconds one operation may take before the run is stopped "
        "(default {default})", positive=True, maximum=MAX_TIMEOUT_S,
        recorded_as="timeout_s", precision_only=True)
    timing: str = "per-op"      # per-op | pipelined


#: the options that are not the method's: where and how the ranks run
RUN_OPTIONS: tuple[BenchOption, ...] = (
    BenchOption("connect_timeout", float, None,
                "seconds a rank may take to reach the control store (default: --timeout, at "
                "most 30)", positive=True),
    BenchOption("root", int, 0, "root rank of {rooted} (default {default})", minimum=0),
    BenchOption("device", str, "auto", "where buffers live (default auto: cuda for "
                "{gpu_backends}, else cpu)", choices=("auto", "cpu", "cuda")),
    BenchOption("mpi_thread_level", str, "funneled",
                "the thread level MPI is initialised at (default funneled: only the main thread "
                "calls MPI, as in IMB-MPI1 and OSU; mpi4py's own default is multiple, which "
                "slows every call in MPICH and Intel MPI)",
                choices=("single", "funneled", "serialized", "multiple")),
    BenchOption("nccl_algo", str, None, "sets NCCL_ALGO for the run ({nccl_readers})"),
    BenchOption("nccl_proto", str, None, "sets NCCL_PROTO for the run"),
)

#: every option, in the order of --help and of the generated tables: Method's, then the run's
BENCH_OPTIONS: tuple[BenchOption, ...] = (
    *(BenchOption(f.name, type(f.default), cast(int | float | str, f.default),
                  **f.metadata["option"])
      for f in fields(Method) if "option" in f.metadata),
    *RUN_OPTIONS,
)

METHOD_OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(Method) if "option" in f.metadata)

#: what record.method says about the run besides its Method, alike in every record of one run:
#: how its ranks were started (`launcher`) and, under `ccbench launch --repeat`, which launch
#: it was (ccbench.bench.repeats.repeat_from_env)
RUN_RECORD_KEYS: tuple[str, ...] = ("launcher", "repeat", "repeats", "repeat_group")


# open-shaped: {option name: value}, keyed by the registry of options
def method_record(method: Method, run: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The entries of record.method that every record of one run shares: each Method field
    (as its option declares: `min_time_s`, combine's label; the configured counts, beside the
    record's own `iterations` and `warmup`, which say what ran), then the run's (`run`: keys of
    RUN_RECORD_KEYS). The one place a record learns how it was measured; the run identity
    (records.identity.run_metadata) takes its keys from run_method_keys()."""
    out: dict[str, Any] = {}
    for f in fields(Method):
        recorded = f.metadata.get("record", {})
        value = getattr(method, f.name)
        labels = recorded.get("labels")
        out[recorded.get("as") or f.name] = labels[value] if labels else value
    unknown = set(run or {}) - set(RUN_RECORD_KEYS)
    if unknown:
        raise ValueError(f"not run record keys: {sorted(unknown)}")
    return {**out, **(run or {})}


@functools.cache
def _default_record() -> dict[str, Any]:
    """The method block of the defaults, once: measured_variant runs per record in reports."""
    return method_record(Method())


# open-shaped: record.method, keyed by the registry of options
def measured_variant(method: Mapping[str, Any]) -> str:
    """`buffer_offset=1, combine=mean over ranks`: the options of a record's method block that
    change what is measured (not precision_only) and differ from their defaults; "" for a
    record measured as the defaults measure (or from before those options)."""
    labelled = _default_record()
    shown = []
    for f in fields(Method):
        recorded = f.metadata.get("record", {})
        key = recorded.get("as") or f.name
        if "option" not in f.metadata or recorded.get("precision_only") or key not in method:
            continue
        # the default as records say it, or as older ones did (combine's `max`, not its label)
        if str(method[key]) not in (str(labelled[key]), str(f.default)):
            shown.append(f"{key}={method[key]}")
    return ", ".join(shown)


def run_method_keys() -> tuple[str, ...]:
    """The keys of record.method that every record of one run shares (method_record's)."""
    return (*method_record(Method()), *RUN_RECORD_KEYS)


# open-shaped: {option name: value}, keyed by the registry of options
def method_from(values: Mapping[str, Any]) -> Method:
    """The Method of {name: value} (an argparse namespace's vars(), a sweep's options): the
    Method fields it has, the defaults for the rest."""
    return Method(**{f.name: values[f.name] for f in fields(Method) if f.name in values})


# open-shaped: {option name: value}, keyed by the registry of options
def add_options(parser: argparse.ArgumentParser, names: Iterable[str] | None = None,
                defaults: Mapping[str, Any] | None = None,
                words: Mapping[str, str] | None = None) -> None:
    """The flags of the options `names` (all of them by default), in the table's order;
    `defaults` replaces the table's defaults for a command of its own; `words` fill the
    registries' names into the help (HELP_WORDS)."""
    wanted = None if names is None else set(names)
    for option in BENCH_OPTIONS:
        if wanted is None or option.name in wanted:
            option.add_to(parser, (defaults or {}).get(option.name, option.default), words)


# open-shaped: {option name: value}, keyed by the registry of options
def check_flags(values: Mapping[str, Any]) -> None:
    """Every option in {name: value} within its limits and the cross-option rules, in the
    command line's words (UsageError)."""
    for option in BENCH_OPTIONS:
        if option.name in values:
            option.check_flag(values[option.name])
    found = conflict(values)
    if found is not None:
        flag = _flag_of
        raise UsageError(f"{flag(found.option)} {found.message(flag)} (valid: "
                         f"{flag(found.option)} >= {flag(found.other)})")


#: the cross-option rules, checked by conflict(): (option, other) where option >= other
AT_LEAST: tuple[tuple[str, str], ...] = (("max_iters", "iters"),)


@dataclass(frozen=True, slots=True)
class Conflict:
    """A cross-option rule broken: `option` (value) is below `other` (other_value)."""

    option: str
    value: Any
    other: str
    other_value: Any

    def message(self, name: Callable[[str], str]) -> str:
        """`<value> is below <other> <value>`, naming the other option by `name`."""
        return f"{self.value} is below {name(self.other)} {self.other_value}"


# open-shaped: {option name: value}, keyed by the registry of options
def conflict(values: Mapping[str, Any]) -> Conflict | None:
    """The first cross-option rule that {name: value} breaks (an absent name holds its
    default), or None."""
    for name, other in AT_LEAST:
        value = values.get(name, option_named(name).default)
        floor = values.get(other, option_named(other).default)
        if value is not None and floor is not None and value < floor:
            return Conflict(name, value, other, floor)
    return None


def _flag_of(name: str) -> str:
    return option_named(name).flag


def connect_timeout(timeout: float, given: float | None = None) -> float:
    """How long a rank may take to reach the control store: `given` (--connect-timeout), else
    --timeout, at most CONNECT_TIMEOUT_S."""
    if given is not None:
        return given
    return min(CONNECT_TIMEOUT_S, timeout)


def option_named(name: str) -> BenchOption:
    return next(option for option in BENCH_OPTIONS if option.name == name)


# open-shaped: {option name: value}, keyed by the registry of options
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
    out: dict[str, tuple[str, Any]] = {}
    for option in BENCH_OPTIONS:
        variable = option.variable
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
