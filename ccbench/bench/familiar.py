"""The flags users of nccl-tests, the OSU micro-benchmarks and PARAM already type.

Each is read with its tool's meaning and turned into ccbench's own setting before anything
else looks at the arguments, so the rest of ccbench sees one vocabulary. Where two tools (or a
tool and ccbench) give one letter different meanings, the choice is made here, once, and a
combination that could mean either is refused with one line rather than guessed:

- `-n` is the iteration count, as in nccl-tests (PARAM: `--n`). Under `ccbench launch`, a `-n`
  before the collective is the rank count (as `mpiexec -n`); everything after the collective
  belongs to the benchmark.
- `-f N` is nccl-tests' step factor (PARAM: `--f N`); a bare `-f` is OSU's "full statistics".
- `-i` is OSU's iteration count. nccl-tests' `-i` (step in bytes) is not offered, so `-i` next
  to nccl-tests sizes (`-b`/`-e`) or an nccl-tests program name is refused.
- `-a` combines the ranks' times of an iteration as nccl-tests numbers it (0 rank 0, 1 mean,
  2 min, 3 max); ccbench's default stays max, where nccl-tests' is the mean.
- Two flags that set one thing (`--sizes` and `-b`, `-n` and `-i`, `-O` and `-J` ...) are
  refused together, even when they agree.
"""

from __future__ import annotations

import argparse
import os

from ccbench.backends import MPI_SUITE_BACKEND, reading
from ccbench.bench.options import COMBINE_LABELS, GivenStore, given
from ccbench.collectives import every
from ccbench.errors import UsageError

__all__ = ["COMBINE_LABELS", "PROGRAMS", "add_familiar_arguments", "resolve_familiar"]

_NCCL_AVERAGE = {0: "rank0", 1: "mean", 2: "min", 3: "max"}     # nccl-tests -a numbering

#: program names of nccl-tests and OSU, so that their command line runs with ccbench in front
PROGRAMS = {program: c.name for c in every() for program in c.tools.programs}
_NCCL_TESTS_ONLY = ("gather_perf", "scatter_perf", "hypercube_perf")

DEFAULT_LOW, DEFAULT_HIGH = "1K", "16M"      # ccbench's default --sizes 1K-16M


def add_familiar_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of other tools; ccbench's own short options (-n, -w, -c, -o, -d) are the
    nccl-tests ones already."""
    # other tools' names for ccbench's options: the same destination, the same meaning
    for names, dest, kind in ((("--n",), "iters", int), (("-x", "--w"), "warmup", int),
                              (("-T",), "timeout", float), (("-r",), "root", int)):
        parser.add_argument(*names, dest=dest, type=kind, action=GivenStore,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    nccl = parser.add_argument_group(
        "nccl-tests flags", "as all_reduce_perf reads them; `ccbench launch -n 2 all_reduce_perf "
        "-b 8 -e 128M -f 2 ...` runs an nccl-tests command line (also -n iters, -w warmup, "
        "-c check, -o op, -d datatype, -r root, -T timeout)")
    nccl.add_argument("-b", "--minbytes", default=None,
                      help="smallest size (bytes, K/M/G suffixes; default 1K)")
    nccl.add_argument("-e", "--maxbytes", default=None,
                      help="largest size (default 16M); without -f, powers of 2 (nccl-tests "
                           "would step by -i bytes, which ccbench does not offer)")
    nccl.add_argument("-f", dest="dash_f", nargs="?", const="", default=None, metavar="N",
                      help="with N: step factor between -b and -e (nccl-tests); without: "
                           "full statistics (OSU), see --full")
    nccl.add_argument("-g", "--ngpus", type=int, default=None,
                      help="devices per rank: only 1 (ccbench drives one device per rank; "
                           "start one rank per GPU)")
    nccl.add_argument("-t", "--nthreads", type=int, default=None,
                      help="threads per rank: only 1 (one rank per process)")
    nccl.add_argument("-a", "--average", type=int, default=None, metavar="0-3",
                      help="how an iteration's rank times combine: 0 rank 0, 1 mean, 2 min, "
                           "3 max (ccbench's default: 3, max; nccl-tests' default is 1); "
                           "see --combine")
    nccl.add_argument("-z", "--blocking", type=int, default=None, metavar="0|1",
                      help="accepted for nccl-tests command lines; the timing mode is "
                           "--timing: per-op (default) waits for every operation as -z 1 "
                           "does, pipelined runs them back to back as nccl-tests' -z 0 loop "
                           "does; -z 1 with --timing pipelined is refused")
    nccl.add_argument("-G", "--cudagraph", type=int, default=None, metavar="N",
                      help=f"N > 0: --cuda-graph (backend {', '.join(reading('cuda_graph'))} "
                           "only); ccbench's graph holds "
                           "one call and is launched once per timed iteration (-n), where "
                           "nccl-tests' holds -n calls launched N times, so N counts nothing "
                           "here; 0: no graph")
    nccl.add_argument("-J", dest="json_output", default=None, metavar="FILE",
                      help="write the records to FILE, one JSON record per line (as --output; "
                           "nccl-tests writes one JSON document)")
    osu = parser.add_argument_group(
        "OSU micro-benchmark flags", "as osu_allreduce reads them (also -x warmup; -f: see "
        "above)")
    osu.add_argument("-m", "--message-size", dest="osu_sizes", default=None, metavar="[MIN:]MAX",
                     help="sizes from MIN to MAX bytes, powers of 2 (MIN: alone from MIN up)")
    osu.add_argument("-i", dest="osu_iters", default=None, metavar="N",
                     help="timed iterations (as --iters)")
    param = parser.add_argument_group(
        "PARAM comms flags", "as comms.py reads them (also --n iters, --w warmup)")
    param.add_argument("--b", dest="param_b", default=None, metavar="BYTES", help="smallest size (bytes)")
    param.add_argument("--e", dest="param_e", default=None, metavar="BYTES", help="largest size (bytes)")
    param.add_argument("--f", dest="param_f", default=None, metavar="N", help="factor between sizes")
    param.add_argument("--collective", dest="param_collective", default=None, metavar="NAME",
                       help="the collective(s), instead of the positional COLLECTIVE "
                            "(all_reduce, all_gather, ...)")


def resolve_familiar(args: argparse.Namespace) -> None:
    """Turn the familiar flags into ccbench's settings in `args`, in place; refuse any
    combination that could be read two ways. Fills the defaults of the options they alias."""
    factor = _factor(args)                  # first: a bare -f may have swallowed the collective
    tool = _resolve_collective(args)
    if tool == "osu":                       # OSU's program: OSU's backend and columns
        args.backend = args.backend or MPI_SUITE_BACKEND
        args.format = "osu" if args.format == "table" else args.format
    _resolve_sizes(args, factor)
    _resolve_iterations(args, tool == "nccl-tests")
    _resolve_output(args)
    _resolve_combine(args)
    _resolve_single_device(args)
    if args.blocking is not None:
        if args.blocking not in (0, 1):
            raise UsageError(f"-z {args.blocking}: nccl-tests' blocking flag is 0 or 1")
        if args.blocking == 1 and args.timing == "pipelined":
            raise UsageError("-z 1 (wait for every operation) contradicts --timing pipelined "
                             "(operations back to back); drop one")
    if args.cudagraph is not None:
        if args.cudagraph < 0:
            raise UsageError(f"-G {args.cudagraph}: nccl-tests' CUDA-graph launches are 0 (off) "
                             f"or more")
        if args.cudagraph > 0:
            args.cuda_graph = True      # refused later unless the backend is nccl-cupy


def _resolve_collective(args: argparse.Namespace) -> str | None:
    """The collective from the positional, a program name or PARAM's --collective. Returns
    the tool whose program name it was ("nccl-tests": its -i would mean step bytes; "osu"),
    None for ccbench's own names."""
    given, param = args.collective, args.param_collective
    if given is not None and param is not None:
        raise UsageError(f"two collectives given: {given!r} and --collective {param!r} (give "
                         f"one)")
    if given is None and param is None:
        raise UsageError("a collective is needed: ccbench allreduce ... (or --collective "
                         "all_reduce as in PARAM, or all_reduce_perf as in nccl-tests)")
    text = given if given is not None else param
    program = os.path.basename(text)
    if program in PROGRAMS:
        args.collective = PROGRAMS[program]
        return "nccl-tests" if program.endswith("_perf") else "osu"
    if program in _NCCL_TESTS_ONLY:
        raise UsageError(f"nccl-tests' {program} has no ccbench counterpart (valid: "
                         f"{', '.join(PROGRAMS)})")
    args.collective = text
    return None


def _given(*values: object) -> bool:
    return any(value is not None for value in values)


def _resolve_sizes(args: argparse.Namespace, factor: tuple[int, str] | None) -> None:
    sources = [name for name, present in (
        ("--sizes", args.sizes is not None),
        ("-b/-e (nccl-tests)", _given(args.minbytes, args.maxbytes)),
        ("-m (OSU)", args.osu_sizes is not None),
        ("--b/--e (PARAM)", _given(args.param_b, args.param_e))) if present]
    if len(sources) > 1:
        raise UsageError(f"sizes given twice: {' and '.join(sources)} (give one)")
    if args.sizes is not None:
        if factor is not None:
            raise UsageError(f"{factor[1]} {factor[0]} steps -b/-e sizes; with --sizes write the "
                             f"factor in it (e.g. --sizes 1K-1M:{factor[0]})")
        return
    if _given(args.minbytes, args.maxbytes):
        low, high, flags = args.minbytes, args.maxbytes, ("-b", "-e")
    elif _given(args.param_b, args.param_e):
        low, high, flags = args.param_b, args.param_e, ("--b", "--e")
    elif args.osu_sizes is not None:
        low, high = _osu_range(args.osu_sizes)
        flags = ("-m MIN", "-m MAX")
    else:
        low, high, flags = None, None, ("", "")
    if low is None and high is None and factor is None:
        args.sizes = f"{DEFAULT_LOW}-{DEFAULT_HIGH}"
        return
    args.sizes = _range_spec(low, high, flags, factor[0] if factor else 2)


def _factor(args: argparse.Namespace) -> tuple[int, str] | None:
    """(step factor, the flag that set it) or None; -f without a value is OSU's --full."""
    dash_f = args.dash_f
    if dash_f == "":
        args.full = True
        dash_f = None
    given = [(text, flag) for text, flag in ((dash_f, "-f"), (args.param_f, "--f"))
             if text is not None]
    if len(given) > 1:
        raise UsageError("step factor given twice: -f and --f (give one)")
    if not given:
        return None
    text, flag = given[0]
    if not text.strip().isdigit() or int(text) < 2:
        extra = " or nothing (OSU -f: full statistics)" if flag == "-f" else ""
        raise UsageError(f"{flag} takes an integer step factor >= 2 (nccl-tests -f 2){extra}, "
                         f"got {text!r}")
    return int(text), flag


def _osu_range(text: str) -> tuple[str | None, str | None]:
    low, colon, high = text.partition(":")
    if not colon:
        return None, text.strip() or None
    return low.strip() or None, high.strip() or None


def _range_spec(low: str | None, high: str | None, flags: tuple[str, str], factor: int) -> str:
    """A --sizes spec from bounds that may be missing: a missing one comes from ccbench's
    default range, moved so that the range never goes down."""
    from ccbench.units import parse_size

    low_b = parse_size(low) if low is not None else None
    high_b = parse_size(high) if high is not None else None
    if low_b is not None and high_b is not None and low_b > high_b:
        raise UsageError(f"{flags[0]} {low} is above {flags[1]} {high} (the smallest size must "
                         f"not exceed the largest)")
    if low_b is None:
        low_b = min(parse_size(DEFAULT_LOW), high_b or parse_size(DEFAULT_LOW))
    if high_b is None:
        high_b = max(parse_size(DEFAULT_HIGH), low_b)
    return f"{low_b}-{high_b}:{factor}"


def _resolve_iterations(args: argparse.Namespace, nccl_program: bool) -> None:
    if args.osu_iters is None:
        return
    if nccl_program or _given(args.minbytes, args.maxbytes):
        raise UsageError(f"-i {args.osu_iters} next to nccl-tests flags: in nccl-tests -i is the "
                         f"step in bytes, which ccbench does not offer; in OSU it is the "
                         f"iteration count (use -n for iterations with nccl-tests flags)")
    if given(args, "iters"):
        raise UsageError(f"iterations given twice: {given(args, 'iters')} {args.iters} and -i "
                         f"{args.osu_iters} (OSU) (give one)")
    text = args.osu_iters.strip()
    if not text.isdigit():
        raise UsageError(f"-i is OSU's iteration count, an integer; got {args.osu_iters!r}")
    args.iters = int(text)


def _resolve_output(args: argparse.Namespace) -> None:
    if args.json_output is None:
        return
    if args.output is not None:
        raise UsageError(f"output given twice: --output {args.output!r} and -J "
                         f"{args.json_output!r} (give one)")
    args.output = args.json_output


def _resolve_combine(args: argparse.Namespace) -> None:
    if args.average is None:
        return
    if args.average not in _NCCL_AVERAGE:
        raise UsageError(f"-a {args.average}: nccl-tests' average mode is 0 (rank 0), 1 (mean), "
                         f"2 (min) or 3 (max)")
    chosen = _NCCL_AVERAGE[args.average]
    if given(args, "combine") and args.combine != chosen:
        raise UsageError(f"-a {args.average} ({chosen}) contradicts --combine {args.combine} "
                         f"(give one)")
    args.combine = chosen


def _resolve_single_device(args: argparse.Namespace) -> None:
    for flag, value, what in (("-g", args.ngpus, "devices"), ("-t", args.nthreads, "threads")):
        if value is not None and value != 1:
            raise UsageError(f"{flag} {value}: ccbench runs one rank per process with one device "
                             f"(only {flag} 1); for {value} {what}, start {value} ranks "
                             f"(ccbench launch -n N, torchrun or mpiexec)")
