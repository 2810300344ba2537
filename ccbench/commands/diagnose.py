"""`ccbench diagnose`: is this cluster's network normal, and if not, where is it broken?

Started like every run, one rank per host (or --ranks-per-host K):

    srun -N16 --ntasks-per-node 1 python -m ccbench diagnose --link-rate 100G
    mpiexec -n 8 -ppn 1 python -m ccbench diagnose --backend mpi
    ccbench launch -n 4 diagnose --backend gloo      # one machine: each rank stands for a host

Prints the plan with its estimated time, then a verdict: a table of findings (component,
kind, measured, expected, evidence, confidence). Exit status 1 when anything is flagged
(also a host that stopped answering mid-plan), 0 when healthy, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ccbench.backends import HOST_BACKEND, backend_class, backend_names
from ccbench.errors import UsageError, error_line
from ccbench.run.exit import skip_finalize
from ccbench.timeouts import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from ccbench.diagnose.analyse import WorldResult
    from ccbench.diagnose.measure import PlanSettings
    from ccbench.run.supervisor import LaunchPlan

__all__ = ["launch_plan", "main", "plan_of", "plan_seconds", "register"]

DEFAULT_SIZE = 4 << 20
TRANSFER_S = 0.05               # with a known link rate: a bandwidth sample takes about this
PROBE_SIZE = 256 << 10          # the world step's size when nothing says what the link does
DEFAULT_BUDGET_S = 180.0
MIN_ITERS = 2


def _interface_variable(name: str) -> str | None:
    return backend_class(name).interface_variable


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", "-B", default=HOST_BACKEND,
                        help=f"{', '.join(backend_names())} (default {HOST_BACKEND})")
    parser.add_argument("--ranks-per-host", type=int, default=1,
                        help="ranks started on every host (default 1); the lowest rank of "
                             "each host measures for it")
    parser.add_argument("--rails", default=None,
                        help="rail-optimized hosts, one rank per GPU and NIC: K (rank i of "
                             "each host on rail i; the library picks its NIC) or the NICs "
                             "r0,r1 (rank i's traffic pinned to NIC i); pairs are measured "
                             "rail to rail and findings name host, rail and plane port. "
                             "--ranks-per-host is K; --planes then lists each NIC's ports, "
                             "NIC by NIC: r0p0,r0p1/r1p0,r1p1")
    parser.add_argument("--quick", action="store_true",
                        help="log2(N) bisection rounds instead of every pair (large clusters)")
    parser.add_argument("--link-rate", default=None,
                        help="expected link rate in bits/s (100M, 25G, 400G)")
    parser.add_argument("--latency-us", type=float, default=None,
                        help="expected pair latency in microseconds")
    parser.add_argument("--model", default=None,
                        help="model.json from `ccbench calibrate`: expected rate and latency")
    parser.add_argument("--no-nic-speed", action="store_true",
                        help="do not take the NIC speed the OS reports as the expectation")
    parser.add_argument("--leaves", default=None,
                        help="leaf switches: L (host i of the sorted names on leaf i mod L) or "
                             "host lists 'h0,h2/h1,h3'; adds the leaf-against-leaf partition")
    parser.add_argument("--oversub", type=float, default=1.0,
                        help="uplink oversubscription with --leaves (default 1)")
    parser.add_argument("--planes", default=None,
                        help="interfaces of the planes, e.g. eth0,eth1: adds the plane "
                             "partition (gloo); with --rails, per NIC: r0p0,r0p1/r1p0,r1p1")
    parser.add_argument("--size", default=None,
                        help="bytes of a bandwidth measurement (default: 50 ms at --link-rate, "
                             "else 4M)")
    parser.add_argument("--iters", "-n", type=int, default=5,
                        help="timed iterations per measurement (default 5)")
    parser.add_argument("--warmup", "-w", type=int, default=1, help="warm-up iterations (1)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds one operation may take (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--no-repeat", action="store_true",
                        help="do not measure suspicious pairs again before blaming them")
    parser.add_argument("--no-compute", action="store_true", help="skip the compute probe")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds the plan may take (default "
                             f"{DEFAULT_BUDGET_S:g}): after the world step the plan is sized "
                             "from the rate it measured and cut to fit (fewer iterations, a "
                             "smaller size, fewer repeats, --quick, no compute probe), "
                             "saying what it cut")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="the verdict as a table or JSON (findings, pairs, plan); the "
                             "plan goes to stderr with JSON (default table)")
    parser.add_argument("--output", "-O", default=None,
                        help="append one record per measurement to this file (JSON lines)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("diagnose", help="find the slow link, path, uplink, plane "
                                   "port or host of a cluster")
    _arguments(parser)


def _leaves(text: str | None) -> str | int | None:
    if text is None:
        return None
    if text.strip().isdigit():
        leaves = int(text)
        if leaves < 2:
            raise UsageError(f"--leaves {text}: at least 2 leaves")
        return leaves
    groups = [[h.strip() for h in g.split(",") if h.strip()] for g in text.split("/")]
    if len(groups) < 2 or any(not g for g in groups):
        raise UsageError(f"bad --leaves {text!r} (valid: a leaf count such as 2, or host "
                         f"lists such as h0,h2/h1,h3)")
    return text


def _check_numbers(args: argparse.Namespace) -> None:
    for name in ("iters", "ranks_per_host"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    if args.warmup < 0 or args.timeout <= 0 or args.oversub < 1 or args.budget <= 0:
        raise UsageError("--warmup must be >= 0, --timeout > 0, --oversub >= 1 and "
                         "--budget > 0")
    if args.latency_us is not None and args.latency_us <= 0:
        raise UsageError(f"--latency-us must be > 0, got {args.latency_us:g}")


def _expectation(args: argparse.Namespace, backend: str) -> Any:
    """--link-rate, else --model; --latency-us on top of either."""
    from ccbench.diagnose.analyse import Expectation
    from ccbench.units import parse_rate

    expect = Expectation()
    if args.link_rate is not None:
        try:
            expect = Expectation(float(parse_rate(args.link_rate)), None, "--link-rate")
        except UsageError:
            raise UsageError(f"unknown --link-rate {args.link_rate!r} (valid: bits per second "
                             f"with K, M, G or T: 100M, 25G, 400G)") from None
    elif args.model is not None:
        expect = _from_model(args.model, backend)
    if args.latency_us is not None:
        expect.latency_us = args.latency_us
        if expect.link_bps is None:
            expect.source = "--latency-us"
    return expect


def _bandwidth_size(args: argparse.Namespace, link_bps: float | None) -> int:
    """--size, else TRANSFER_S of traffic at the expected rate (64 KiB to 64 MiB)."""
    from ccbench.units import parse_sizes

    if args.size is not None:
        sizes = parse_sizes(args.size)
        if len(sizes) != 1:
            raise UsageError(f"--size takes one size, got {args.size!r}")
        return sizes[0]
    if link_bps is not None:
        return max(64 << 10, min(64 << 20, int(link_bps / 8 * TRANSFER_S) >> 16 << 16))
    return PROBE_SIZE           # the world step's; the rest is sized from what it measured


def _rails(args: argparse.Namespace, backend: str
           ) -> tuple[int, list[str] | None, list[list[str]] | None]:
    """--rails K or NIC names, --planes per NIC -> (K, the NICs or None, each NIC's plane
    ports or None); K 1 without --rails."""
    if args.rails is None:
        if args.planes and "/" in args.planes:
            raise UsageError(f"--planes {args.planes!r}: per-NIC ports ('/') need --rails")
        return 1, None, None
    text = args.rails.strip()
    nics = None
    if text.isdigit():
        rails = int(text)
    else:
        nics = [n.strip() for n in text.split(",") if n.strip()]
        rails = len(nics)
        if not nics or any(not n.replace("-", "").replace("_", "").replace(".", "").isalnum()
                           for n in nics):
            raise UsageError(f"bad --rails {args.rails!r} (valid: a count such as 2, or the "
                             f"NICs' interfaces such as r0,r1)")
    if rails < 2:
        raise UsageError(f"--rails {args.rails}: at least 2 rails")
    if args.ranks_per_host not in (1, rails):
        raise UsageError(f"--rails {args.rails} is one rank per NIC: --ranks-per-host "
                         f"{rails}, got {args.ranks_per_host}")
    args.ranks_per_host = rails
    if args.leaves is not None:
        raise UsageError("--leaves does not combine with --rails (each rail is its own "
                         "network)")
    if nics and _interface_variable(backend) is None:
        raise UsageError(f"--rails {args.rails} pins each rank's traffic to its NIC through "
                         f"the library's interface setting; backend {backend!r} has none "
                         f"(give the count, --rails {rails}, and the library picks its NIC)")
    ports = None
    if args.planes is not None:
        groups = [[p.strip() for p in g.split(",") if p.strip()] for g in args.planes.split("/")]
        if (len(groups) != rails or len({len(g) for g in groups}) != 1
                or len(groups[0]) < 2):
            raise UsageError(f"--planes {args.planes!r} with --rails {args.rails}: each of the "
                             f"{rails} NICs' plane ports (2 or more, as many on every NIC), "
                             f"NIC by NIC, e.g. r0p0,r0p1/r1p0,r1p1")
        ports = groups
    return rails, nics, ports


def _planes(args: argparse.Namespace, backend: str) -> list[str] | None:
    planes: list[str] | None
    if args.rails is not None and args.planes is not None:
        planes = [str(p) for p in range(len(args.planes.split("/")[0].split(",")))]
    else:
        planes = ([p.strip() for p in args.planes.split(",") if p.strip()] if args.planes
                  else None)
    if args.planes is not None and (not planes or len(planes) < 2):
        raise UsageError(f"--planes needs 2 or more interfaces, got {args.planes!r}")
    if planes and _interface_variable(backend) is None:
        pinning = [name for name in backend_names() if _interface_variable(name)]
        raise UsageError(f"--planes pins traffic to a plane through the library's interface "
                         f"setting; backend {backend!r} has none (use --backend "
                         f"{' or '.join(pinning)})")
    return planes


def _config(args: argparse.Namespace) -> Any:
    from ccbench.backends import parse_backends
    from ccbench.bench.harness import Method
    from ccbench.diagnose.measure import DiagnoseConfig

    backends = parse_backends(args.backend)
    if len(backends) != 1:
        raise UsageError(f"diagnose runs one backend, got --backend {args.backend!r}")
    _check_numbers(args)
    expect = _expectation(args, backends[0])
    size = _bandwidth_size(args, expect.link_bps)
    rails, nics, ports = _rails(args, backends[0])
    planes = _planes(args, backends[0])
    leaves = _leaves(args.leaves)
    return DiagnoseConfig(
        backend=backends[0], size=size, latency_size=8,
        method=Method(iters=args.iters, warmup=args.warmup, check=1, timeout=args.timeout),
        quick=args.quick, repeat=not args.no_repeat,
        leaves=None if leaves is None or isinstance(leaves, int) else
        [[h.strip() for h in g.split(",") if h.strip()] for g in str(leaves).split("/")],
        leaf_count=leaves if isinstance(leaves, int) else None,
        planes=planes, ranks_per_host=args.ranks_per_host, expect=expect,
        rails=rails, rail_nics=nics, rail_ports=ports,
        compute=not args.no_compute,
        nic_speed=not args.no_nic_speed and expect.link_bps is None, output=args.output,
        argv=["diagnose", *sys.argv[1:]]), leaves


def _from_model(path: str, backend: str) -> Any:
    from ccbench.diagnose.analyse import Expectation
    from ccbench.model.modelfile import load_model, select_fit

    model = load_model(path)
    fit, _why = select_fit(model, "broadcast", 2, backend)
    if fit["beta"] <= 0:
        raise UsageError(f"{path}: the fit for {backend} has no bandwidth term (beta 0)")
    return Expectation(8.0 / fit["beta"], fit["alpha"] * 1e6 if fit["alpha"] > 0 else None,
                       f"model {path}")


def _by_count(leaves: str | int | None, hosts: int) -> list[list[int]] | None:
    """--leaves L: host i (of the sorted names) on leaf i mod L; host lists: None here (the
    ranks resolve the names)."""
    if not isinstance(leaves, int):
        return None
    return [list(range(hosts))[leaf::leaves] for leaf in range(leaves)]


def plan_seconds(config: Any, steps: list[Any], hosts: int, link_bps: float | None) -> float:
    """The plan's estimated time as printed (an unknown link rate counts as 10 Gbit/s)."""
    from ccbench.diagnose.plan import estimate_seconds

    return estimate_seconds(steps, hosts, config.size, link_bps or 10e9,
                            2 * (config.method.iters + config.method.warmup + 1))


def fit_budget(args: argparse.Namespace, config: Any, hosts: int, rate_bps: float | None,
               sized: bool) -> tuple[PlanSettings, float, list[str]]:
    """The rest of the plan's settings after the world step: with `sized` (no --size, no
    link rate), the bandwidth size is TRANSFER_S of traffic at the measured rate (64 KiB to
    DEFAULT_SIZE); then, while the estimate exceeds --budget, cuts in this order: iterations
    (down to MIN_ITERS), the size (down to a fifth of TRANSFER_S of traffic), the repeat
    passes (to 1), every pair -> --quick, the compute probe. Returns the settings, the
    estimated seconds and what was cut."""
    from ccbench.diagnose.plan import build_plan, estimate_seconds

    rate = rate_bps or 10e9
    size = config.size
    if sized:
        size = max(64 << 10, min(DEFAULT_SIZE, int(rate / 8 * TRANSFER_S) >> 16 << 16))
    # PlanSettings's keys, looked up by name in the cuts below
    settings: dict[str, Any] = {"size": size, "iters": config.method.iters,
                                "quick": config.quick, "repeat_passes": config.repeat_passes,
                                "compute": config.compute}
    leaves = _by_count(_leaves(args.leaves), hosts)

    def seconds() -> float:
        steps = build_plan(hosts, settings["quick"], leaves, config.planes,
                           compute=settings["compute"], rails=config.rails)
        repeats = 2 * settings["repeat_passes"] if config.repeat else 0
        extra = [s for s in steps if s.kind == "pairs"][:repeats]
        return estimate_seconds(steps[1:] + extra, hosts, settings["size"], rate,
                                2 * (settings["iters"] + config.method.warmup + 1))

    floor = max(64 << 10, int(rate / 8 * TRANSFER_S / 5) >> 16 << 16)
    cuts: list[str] = []
    options = [("iters", MIN_ITERS, "iterations"), ("size", floor, "size (B)"),
               ("repeat_passes", 1, "repeat passes"), ("quick", True, "pair rounds"),
               ("compute", False, "compute probe")]
    for key, value, label in options:
        if seconds() <= args.budget:
            break
        before = settings[key]
        if before == value or (key in ("iters", "size", "repeat_passes") and before <= value):
            continue
        settings[key] = value
        cuts.append({"quick": "pair rounds: every pair -> log2 N (--quick)",
                     "compute": "compute probe skipped"}.get(key, f"{label} {before} -> {value}"))
    fitted: PlanSettings = {"size": settings["size"], "iters": settings["iters"],
                            "quick": settings["quick"], "repeat_passes": settings["repeat_passes"],
                            "compute": settings["compute"]}
    return fitted, seconds(), cuts


def plan_of(argv: list[str], hosts: int) -> tuple[list[Any], float]:
    """The steps and estimated seconds `ccbench diagnose ARGV` plans for `hosts` hosts (with
    --leaves, a count; with --rails K, the steps' pairs are NICs: host x K + rail), without
    running anything."""
    from ccbench.cli import OneLineParser
    from ccbench.diagnose.plan import build_plan

    parser = OneLineParser(prog="ccbench diagnose")
    _arguments(parser)
    args = parser.parse_args(argv)
    config, leaves = _config(args)
    steps = build_plan(hosts * config.rails, config.quick, _by_count(leaves, hosts),
                       config.planes, compute=not args.no_compute, rails=config.rails)
    return steps, plan_seconds(config, steps, hosts * config.rails, config.expect.link_bps)


def launch_plan(argv: list[str], nprocs: int | None = None) -> LaunchPlan:
    """What `ccbench launch` starts for `ccbench diagnose ARGV`: its backend on 2 ranks
    unless -n says otherwise."""
    from ccbench.bench.options import connect_timeout
    from ccbench.cli import OneLineParser
    from ccbench.run.supervisor import LaunchPlan

    parser = OneLineParser(prog="ccbench diagnose")
    _arguments(parser)
    config, _ = _config(parser.parse_args(argv))
    return LaunchPlan(argv=["diagnose", *argv], backends=[config.backend],
                      connect_timeout=connect_timeout(config.method.timeout),
                      nprocs=2 if nprocs is None else nprocs)


def main(args: argparse.Namespace) -> int:
    from ccbench.diagnose.measure import diagnose_rank, write_verdict
    from ccbench.diagnose.plan import build_plan
    from ccbench.diagnose.preflight import before_mpi
    from ccbench.diagnose.verdict import findings_of, format_plan, print_verdict

    config, leaves = _config(args)
    if args.output:
        from ccbench.bench.output.files import check_output_file

        check_output_file(args.output)
    plan_stream = sys.stderr if args.format == "json" else sys.stdout

    def build(hosts: int, leaf_hosts: list[list[int]] | None) -> list[Any]:
        if isinstance(leaves, int):
            leaf_hosts = _by_count(leaves, hosts)
        return build_plan(hosts, config.quick, leaf_hosts, config.planes,
                          compute=config.compute, rails=config.rails)

    def on_plan(steps: list[Any], names: list[str], expect: Any) -> None:
        seconds = plan_seconds(config, steps, len(names), expect.link_bps)
        for line in format_plan(steps, names, expect, seconds, config.backend):
            print(line, file=plan_stream, flush=True)

    def on_stop(collected: Any, why: str, stopped: dict[int, str]) -> None:
        collected.stopped = stopped
        findings = findings_of(collected, args.oversub)
        print_verdict(collected, findings, args.format)
        write_verdict(config, collected, findings)
        sys.stdout.flush()
        _flagged_line(findings)

    def status_of(collected: Any) -> int:
        if isinstance(leaves, int):
            collected.leaves = _by_count(leaves, len(collected.names))
        return 1 if findings_of(collected, args.oversub) else 0

    def replan(world: WorldResult | None, hosts: int, expect: Any) -> PlanSettings:
        measured = world.get("busbw_bps") if world else None
        rate = expect.link_bps or measured
        settings, seconds, cuts = fit_budget(args, config, hosts, rate,
                                             sized=args.size is None and not expect.link_bps)
        source = (f"link {(rate or 0) / 1e6:.1f} Mbit/s ({expect.source})" if expect.link_bps
                  else f"{(measured or 0) / 1e6:.1f} Mbit/s measured by the world step"
                  if measured else "no rate measured")
        print(f"ccbench diagnose: after the world step: {source}; size {settings['size']} B, "
              f"{settings['iters']} iterations, estimated {seconds:.0f} s (--budget "
              f"{args.budget:g} s)" + (f"; cut: {', '.join(cuts)}" if cuts else ""),
              file=plan_stream, flush=True)
        return settings

    config.on_plan = on_plan
    config.replan = replan
    before_mpi(config.backend, config.method.timeout)
    collected, status = diagnose_rank(config, build, on_stop, status_of)
    if collected is None:
        # the run's status is rank 0's: the others end with 0 on a flagged verdict, since a
        # bare mpiexec (hydra) kills every rank once one ends with another status, and then
        # ends with 255 (a rank killed while it was ending: 3 of 24 runs of a port down);
        # without MPI_Finalize, which rank 0, ending with 1, skips (ccbench.run.exit)
        if status == 1:
            skip_finalize()
            return 0
        return status
    status_of(collected)
    findings = findings_of(collected, args.oversub)
    print_verdict(collected, findings, args.format)
    write_verdict(config, collected, findings)
    _flagged_line(findings)
    return 1 if findings else 0


def _flagged_line(findings: list[Any]) -> None:
    """The reason for the exit status, for launchers that ask (`ccbench launch` needs a
    rank's `ccbench: error:` line for a status other than 0)."""
    if findings:
        print(error_line(f"diagnose flagged {len(findings)} component"
                         f"{'s' if len(findings) > 1 else ''}: exit status 1 (the verdict is "
                         f"on stdout)"), file=sys.stderr, flush=True)
