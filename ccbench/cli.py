"""Command line: `ccbench COLLECTIVE [options]` measures; `ccbench SUBCOMMAND ...` does the rest.

Subcommands live in ccbench/commands/<name>.py, each with `register(subparsers)` and
`main(args) -> int`, imported only when used.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ccbench import __version__
from ccbench.bench.familiar import add_familiar_arguments, resolve_familiar
from ccbench.bench.options import (
    GivenStore,
    add_options,
    check_flags,
    connect_timeout,
    environment_settings,
    given,
    method_from,
)
from ccbench.collectives import COLLECTIVES, OPS, parse_collectives, parse_ops
from ccbench.dtypes import DTYPES, parse_dtypes
from ccbench.errors import RunFailure, UsageError, error_line
from ccbench.units import parse_sizes

SUBCOMMANDS = ("launch", "doctor", "algorithms", "calibrate", "simulate", "export", "sweep",
               "merge", "report", "compare", "testbed", "replay", "diagnose")

__all__ = ["bench_parser", "config_from_args", "main"]

FAMILIAR_EPILOG = """\
environment: CCBENCH_<OPTION> sets any method option above (CCBENCH_ITERS, CCBENCH_TIMEOUT, ...)
  and CCBENCH_SIZES, CCBENCH_BACKEND, CCBENCH_DTYPE, CCBENCH_OP; the command line wins

flags of other tools, and the letters they share:
  -n      iterations, as in nccl-tests; under `ccbench launch`, a -n before the collective
          is the rank count (as mpiexec -n) and one after it the iteration count
  -f N    nccl-tests' step factor; a bare -f is OSU's full statistics (--full)
  -i      OSU's iteration count; refused next to -b/-e or an nccl-tests program name, where
          it would be nccl-tests' step in bytes
  -a      nccl-tests' rank combination (0 rank 0, 1 mean, 2 min, 3 max); the default stays
          max, where nccl-tests' default is 1 (mean)
  two flags that set the same thing (--sizes and -b, -n and -i, --output and -J) are refused
  together; examples:
    ccbench launch -n 2 all_reduce_perf -b 8 -e 128M -f 2 -g 1 -c 1 -n 20 -w 5 -o sum -d float
    ccbench launch -n 2 osu_allreduce -m 8:1048576 -i 1000 -x 100 -f
    ccbench launch -n 2 -- --collective all_reduce --b 8 --e 1M --f 2
"""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line `ccbench: error: ...` and exit 2, and a long
    option is never guessed from a prefix (`--time 1` is not `--timeout 1`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        return parse_anywhere(self, list(sys.argv[1:] if args is None else args), namespace)


def parse_anywhere(parser: argparse.ArgumentParser, argv: list[str],
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
    """argparse with positionals anywhere among the options (`simulate model.json --ranks 16
    allreduce`), through nested subcommands; a parser that takes the rest of the line as it
    is (`launch ... COLLECTIVE ...`) parses as argparse does."""
    namespace = namespace if namespace is not None else argparse.Namespace()
    subcommands = next((a for a in parser._actions
                        if isinstance(a, argparse._SubParsersAction)), None)
    if subcommands is None:
        try:
            return parser.parse_intermixed_args(argv, namespace)
        except TypeError:           # argparse.REMAINDER or a positional in an exclusive group
            return _parse_with_remainder(parser, argv, namespace)
    at = next((i for i, arg in enumerate(argv) if arg in subcommands.choices), None)
    if at is None:                  # no subcommand named: argparse says what is missing
        return argparse.ArgumentParser.parse_args(parser, argv, namespace)
    required, subcommands.required = subcommands.required, False
    try:
        argparse.ArgumentParser.parse_args(parser, argv[:at], namespace)
    finally:
        subcommands.required = required
    if subcommands.dest is not argparse.SUPPRESS:
        setattr(namespace, subcommands.dest, argv[at])
    return parse_anywhere(subcommands.choices[argv[at]], argv[at + 1:], namespace)


def _parse_with_remainder(parser: argparse.ArgumentParser, argv: list[str],
                          namespace: argparse.Namespace) -> argparse.Namespace:
    """argparse's own parse; an option it does not know, before the words it passes on as
    they are (`launch -n 3 --backend gloo allreduce`), is one line saying where it goes."""
    try:
        return argparse.ArgumentParser.parse_args(parser, argv, namespace)
    except UsageError as err:
        passes_on = any(a.nargs == argparse.REMAINDER for a in parser._actions)
        words = str(err).split(": ", 1)[-1].split()
        if not passes_on or not str(err).startswith("unrecognized arguments") or not words:
            raise
        first = words[0]
        head = " ".join([parser.prog, *argv[:argv.index(first)]]) if first in argv \
            else parser.prog
        if first.split("=", 1)[0] in bench_parser()._option_string_actions:
            raise UsageError(f"{first} is the benchmark's option: put it after the collective "
                             f"(`{head} COLLECTIVE {first} ...`)") from None
        own = ", ".join(s for a in parser._actions for s in a.option_strings
                        if s.startswith("--") and s != "--help")
        raise UsageError(f"unknown option {first} (`{parser.prog}` takes {own} before the "
                         f"collective; the benchmark's options go after it)") from None


def check_command_word(word: str) -> None:
    """A first word that is neither a collective, another tool's program name nor a subcommand,
    but close to one (`allreduc`, `simulat`): one line naming the nearest, rather than argparse's
    "unrecognized arguments" about the words after it."""
    import difflib

    from ccbench.collectives import canonical_collective

    if not word or word.startswith("-") or "," in word or word in SUBCOMMANDS:
        return
    if word.lower() == "all" or word.endswith("_perf") or word.startswith("osu_"):
        return
    try:
        canonical_collective(word)
        return
    except UsageError:
        pass
    near = difflib.get_close_matches(word.lower(), [*SUBCOMMANDS, *COLLECTIVES], n=1,
                                     cutoff=0.75)
    if near:
        raise UsageError(f"unknown command {word!r} (did you mean {near[0]}?)")


def _quiet_rank() -> bool:
    """Only one rank speaks about bad input; the others just exit 2."""
    from ccbench.run.launcher_env import RANK_VARS

    for name in RANK_VARS:
        if os.environ.get(name, "0") not in ("0", ""):
            return True
    return False


def _listed(names: Sequence[str], last: str = "and") -> str:
    """`a, b and c`."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)


def option_words() -> dict[str, str]:
    """The registries' names that option help texts show (bench.options.HELP_WORDS)."""
    from ccbench.backends import device_backends, reading
    from ccbench.collectives import ROOTED

    return {"rooted": _listed([name for name in COLLECTIVES if name in ROOTED]),
            "gpu_backends": _listed(device_backends()),
            "nccl_readers": ", ".join(reading("nccl_algo"))}


def backend_help() -> str:
    """--backend's help: every registered backend and the default, from the registry."""
    from ccbench.backends import DEVICE_DEFAULTS, HOST_BACKEND, backend_names

    return (f"comma list: {', '.join(backend_names())}, <algorithm>@<transport> (default: "
            f"{_listed(list(DEVICE_DEFAULTS), 'or')} where torch sees a GPU, else "
            f"{HOST_BACKEND})")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from ccbench.backends import reading

    parser.add_argument("collective", nargs="?", default=None,
                        help=f"{', '.join(COLLECTIVES)}, a comma list, or all; also an nccl-tests "
                             f"or OSU program name (all_reduce_perf, osu_allreduce, ...)")
    parser.add_argument("--backend", "-B", default=None, action=GivenStore,
                        help=backend_help())
    parser.add_argument("--sizes", "-s", default=None, action=GivenStore,
                        help="bytes: 1K-1G (powers of 2), 1K-1G:4 (factor 4), 8,1K,1M (default "
                             "1K-16M; or -b/-e/-f, -m, --b/--e/--f below)")
    parser.add_argument("--dtype", "-d", default="float32", action=GivenStore,
                        help=f"{', '.join(DTYPES)}, a comma list or all (default float32); "
                             f"nccl-tests' names float, double, half, f8e4m3, f8e5m2 also")
    parser.add_argument("--op", "-o", default="sum", action=GivenStore,
                        help=f"{', '.join(OPS)}, a comma list or all (default sum); "
                             f"a backend without the op or --dtype refuses before any rank "
                             f"starts")
    parser.add_argument("--inplace", action="store_true", help="only in-place")
    parser.add_argument("--outofplace", action="store_true", help="only out-of-place")
    parser.add_argument("--timing", choices=("per-op", "pipelined"), default="per-op",
                        help="per-op: time each call and wait for it (default); pipelined: "
                             "time a batch of calls back to back, as nccl-tests' loop")
    add_options(parser, words=option_words())   # the same table makes the sweep file's keys
    parser.add_argument("--full", action="store_true", default=False,
                        help="the table also shows each rank's median, min and max over ranks "
                             "(OSU -f); records always hold every statistic")
    parser.add_argument("--output", "-O", default=None,
                        help="append one record per (case, size) to this file: .jsonl or .json "
                             "(JSON lines) or .parquet (default: a new file in ccbench-results/ "
                             "or in the folder CCBENCH_RESULTS names, said at the end)")
    parser.add_argument("--no-output", action="store_true",
                        help="keep no records file: print only")
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table",
                        help="stdout: an nccl-tests style table (default), JSON lines or CSV, "
                             "one row per record")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bar or status line; the results, notes and errors "
                             "still print")
    # a switch of the nccl-cupy backend, not a method option of every backend (so not in
    # BENCH_OPTIONS, and not a sweep key)
    parser.add_argument("--cuda-graph", action="store_true",
                        help=f"{', '.join(reading('cuda_graph'))}: capture the measured call "
                             f"in a CUDA graph and time graph launches")
    add_familiar_arguments(parser)


DESCRIPTION = """\
Measure collectives: `ccbench COLLECTIVE [options]` in every rank (start ranks with
`ccbench launch -n N`, mpiexec, srun or torchrun); `ccbench SUBCOMMAND ...` does the rest."""


def subcommand_summaries() -> list[tuple[str, str]]:
    """(name, one-line help) of every subcommand, from its own register()."""
    out = []
    for name in SUBCOMMANDS:
        parser = OneLineParser(prog="ccbench")
        subparsers = parser.add_subparsers(dest="command")
        importlib.import_module(f"ccbench.commands.{name}").register(subparsers)
        out += [(action.dest, action.help or "") for action in subparsers._choices_actions]
    return out


def _subcommand_list() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [f"  {name:<{width}}  {summary}" for name, summary in subcommand_summaries()]
    return "\n\nsubcommands (ccbench SUBCOMMAND --help says more):\n" + "\n".join(lines)


def bench_parser(list_subcommands: bool = False) -> argparse.ArgumentParser:
    """The benchmark's parser; `list_subcommands` (for --help) imports every subcommand to
    describe each in one line."""
    description = DESCRIPTION + (_subcommand_list() if list_subcommands else "")
    parser = OneLineParser(prog="ccbench", description=description, epilog=FAMILIAR_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(parser)
    parser.add_argument("--version", action="version", version=f"ccbench {__version__}")
    return parser


def _check_consistency(args: argparse.Namespace, backends: list[str]) -> None:
    """Contradictions that would otherwise be accepted silently."""
    from ccbench.backends import backend_names, reading

    if args.backend is not None and any(not part.strip() for part in args.backend.split(",")):
        raise UsageError(f"malformed --backend {args.backend!r}: empty item (valid: a comma "
                         f"list such as {','.join(backend_names()[:2])})")
    for flag, value, option in (("--nccl-algo", args.nccl_algo, "nccl_algo"),
                                ("--nccl-proto", args.nccl_proto, "nccl_proto")):
        readers = reading(option)
        if value and not any(b.split("@")[-1] in readers for b in backends):
            raise UsageError(f"{flag} {value!r} only applies to the {', '.join(readers[:-1])} "
                             f"and {readers[-1]} backends, not {', '.join(backends)}")
    readers = reading("cuda_graph")
    if args.cuda_graph and not set(readers) & set(backends):
        flag = f"-G {args.cudagraph} (CUDA graphs)" if args.cudagraph else "--cuda-graph"
        raise UsageError(f"{flag} only applies to backend {', '.join(readers)}, not "
                         f"{', '.join(backends)}")


def _check_supported(args: argparse.Namespace, collectives: list[str], backends: list[str],
                     dtypes: list[str], ops: list[str], device: str) -> None:
    """A dtype or op named on the command line that a backend can never run (MPI's avg,
    gloo's float8 ...) is one error line now, not a run that skips it. What `all` brought in
    is skipped with a note where a backend lacks it, as a run-time refusal is; a named item
    is refused when every case it is part of is."""
    from ccbench.backends import backend_class
    from ccbench.collectives import REDUCING
    from ccbench.dtypes import numpy_dtype

    named_dtype = args.dtype.strip().lower() != "all"
    named_op = args.op.strip().lower() != "all"
    asked = sorted({(dtype, op if collective in REDUCING else None)
                    for collective in collectives for dtype in dtypes for op in ops},
                   key=lambda case: (case[0], case[1] or ""))
    for name in backends:
        factory = backend_class(name, device)
        refused = {case: factory.refuses(numpy_dtype(case[0]), case[1]) for case in asked}
        for (dtype, op), reason in refused.items():
            if not reason:
                continue
            both = named_dtype and (named_op or op is None)
            # one named coordinate: refused when it is refused with everything `all` added
            alone = ((named_dtype and all(refused[c] for c in asked if c[0] == dtype))
                     or (named_op and op is not None
                         and all(refused[c] for c in asked if c[1] == op)))
            if both or alone:
                raise UsageError(f"{reason}: drop it from --backend, --dtype or --op")


def _check_device(device: str) -> None:
    if device != "cuda":
        return
    try:
        import torch
        visible = torch.cuda.is_available()
    except ImportError:
        visible = False
    if visible:
        return
    from ccbench.backends.cupy_device import cupy_missing_reason

    if importlib.util.find_spec("cupy") is not None and cupy_missing_reason() is None:
        return                                 # CuPy sees a device (nccl-cupy, mpi --device cuda)
    raise UsageError("--device cuda: no CUDA GPU is visible here (valid here: cpu, auto)")


def _apply_environment(args: argparse.Namespace) -> None:
    """CCBENCH_<OPTION> settings (bench.options.environment_settings) where the command line
    did not set that option; sizes only where no other tool's size flags were given either."""
    other_sizes = any(getattr(args, name, None) not in (None, "") for name in
                      ("minbytes", "maxbytes", "osu_sizes", "param_b", "param_e", "param_f",
                       "dash_f"))
    check = {"sizes": parse_sizes, "dtype": parse_dtypes, "op": parse_ops}
    for name, (variable, value) in environment_settings(os.environ).items():
        if given(args, name) or (name == "sizes" and other_sizes):
            continue
        if name in check:
            try:
                check[name](value)
            except UsageError as exc:
                raise UsageError(f"{variable}={value!r}: {exc}") from None
        setattr(args, name, value)


def config_from_args(args: argparse.Namespace, argv: Sequence[str]):  # -> BenchConfig
    """Validate every argument before any rank starts (bad input: exit 2). Pure: the
    process is left as it was (the rank applies what its libraries read from it:
    runner.run_benchmark, Backend.prepare_process)."""
    from ccbench.backends import default_backend, default_device, parse_backends
    from ccbench.bench.runner import BenchConfig

    _apply_environment(args)                    # CCBENCH_SIZES ...: below the command line
    resolve_familiar(args)                      # other tools' flags -> ccbench's settings

    collectives = parse_collectives(args.collective)
    named = parse_backends(args.backend or default_backend())
    if not named:
        raise UsageError("empty --backend")
    backends = list(dict.fromkeys(named))       # each once, in the order first named
    if len(backends) < len(named) and not _quiet_rank():
        twice = sorted({name for name in named if named.count(name) > 1})
        print(f"ccbench: note: --backend {args.backend} names {', '.join(twice)} more than "
              f"once: each runs once ({','.join(backends)})", file=sys.stderr, flush=True)
    sizes = parse_sizes(args.sizes)
    dtypes = parse_dtypes(args.dtype)
    ops = parse_ops(args.op)
    check_flags(vars(args))                     # limits and cross-option rules
    _check_consistency(args, backends)
    from ccbench.bench.output.files import check_output_file, wants_default_output

    if args.output and args.no_output:
        raise UsageError(f"--no-output contradicts --output {args.output!r} (give one)")
    if args.output:
        check_output_file(args.output)
    if args.inplace and args.outofplace:
        modes: tuple[bool, ...] = (False, True)
    elif args.inplace:
        modes = (True,)
    elif args.outofplace:
        modes = (False,)
    else:
        modes = (False, True)
    method = method_from(vars(args))
    device = args.device
    if device == "auto":
        # a GPU backend without a GPU is the backend's own "unavailable" line, said later
        device = default_device(backends)
    else:
        _check_device(device)
    _check_supported(args, collectives, backends, dtypes, ops, device)
    return BenchConfig(collectives=collectives, backends=backends, sizes=sizes, dtypes=dtypes,
                       ops=ops, modes=modes, method=method, root=args.root, device=device,
                       output=args.output, keep_records=wants_default_output(args),
                       fmt=args.format, quiet=args.quiet, full=args.full,
                       options={"nccl_algo": args.nccl_algo, "nccl_proto": args.nccl_proto,
                                "cuda_graph": args.cuda_graph,
                                "mpi_thread_level": args.mpi_thread_level},
                       argv=list(argv),
                       connect_timeout=connect_timeout(args.timeout, args.connect_timeout))


def parse_subcommand(name: str, argv: Sequence[str]) -> tuple[Any, argparse.Namespace]:
    """The module of subcommand `name` and its parsed arguments (bad input: UsageError)."""
    try:
        module = importlib.import_module(f"ccbench.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("ccbench.commands"):
            raise UsageError(f"subcommand {name!r} is not available in this build") from None
        raise
    parser = OneLineParser(prog="ccbench")
    subparsers = parser.add_subparsers(dest="command", required=True)
    module.register(subparsers)
    return module, parser.parse_args([name, *argv])


def _run_subcommand(name: str, argv: Sequence[str]) -> int:
    """A subcommand; what the environment refuses it (a full disk, a folder it may not write,
    too little memory for its input) ends it with one line and exit 2, never a traceback.
    Inputs and outputs are checked where they are read and written (ccbench.safeio); this
    is the net under them."""
    module, args = parse_subcommand(name, argv)
    try:
        return int(module.main(args))
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        target = exc.filename if exc.filename is not None else getattr(args, "output", None)
        where = f"{os.fspath(target)!r}: " if target is not None else ""
        raise UsageError(f"{where}{exc.strerror or exc}") from None
    except MemoryError:
        raise UsageError(f"ccbench {name}: out of memory (its input needs more memory than "
                         f"this process may use: `ulimit -v`, the cgroup, the machine)") from None
    except RecursionError:
        raise UsageError(f"ccbench {name}: input nested too deep to read") from None


def _note_spoken() -> None:
    """Under a bare mpiexec, the store host must not add a line of its own to this one."""
    from ccbench.run.launchers import under_mpi_launcher

    if under_mpi_launcher():
        from ccbench.run.storehost import note_spoken

        note_spoken(os.getppid())


def library_output_to_stderr() -> None:
    """A rank's stdout carries only ccbench's table, CSV or JSON: the libraries it loads may
    write log lines to file descriptor 1 (oneCCL's logger does), so fd 1 becomes a copy of
    stderr and Python's sys.stdout keeps the original destination on a descriptor of its own."""
    try:
        sys.stdout.flush()
        own = os.dup(sys.stdout.fileno())
        os.dup2(sys.stderr.fileno(), 1)
    except (OSError, ValueError, AttributeError):   # no real descriptors (embedded, captured)
        return
    sys.stdout = os.fdopen(own, "w", encoding=sys.stdout.encoding, errors=sys.stdout.errors,
                           buffering=1 if os.isatty(own) else -1)


_PACKAGE_VAR = "CCBENCH_LAUNCHER_PACKAGE"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _note_other_package() -> None:
    """A rank that imported another ccbench than its launcher did says so in one line."""
    launcher = os.environ.get(_PACKAGE_VAR)
    if launcher and launcher != _PACKAGE_DIR and not _quiet_rank():
        print(f"ccbench: warning: the ranks import ccbench from {_PACKAGE_DIR}, the launcher "
              f"from {launcher} (check PYTHONPATH and the working directory)", file=sys.stderr,
              flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from ccbench.run.lifeline import hold

    hold()                             # a rank or case ends with the ccbench that started it
    try:
        if argv and argv[0] in SUBCOMMANDS:
            os.environ.setdefault(_PACKAGE_VAR, _PACKAGE_DIR)   # what its ranks should import
            return _run_subcommand(argv[0], argv[1:])
        _note_other_package()
        check_command_word(argv[0] if argv else "")
        asks_help = any(arg in ("-h", "--help") for arg in argv)
        args = bench_parser(list_subcommands=asks_help).parse_args(argv)
        config = config_from_args(args, argv)
        from ccbench.bench.runner import run_benchmark

        library_output_to_stderr()

        return run_benchmark(config)
    except UsageError as exc:
        if not _quiet_rank():
            print(error_line(exc), file=sys.stderr, flush=True)
        return 2
    except RunFailure as exc:
        print(error_line(exc), file=sys.stderr, flush=True)
        _note_spoken()
        return 1
    except BrokenPipeError:            # `ccbench ... | head`: the reader left, not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("ccbench: interrupted", file=sys.stderr)
        return 130
