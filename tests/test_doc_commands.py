"""Every command line written in the documentation runs, as pyperf executes its doc examples.

The code blocks (fenced bash/console/sh/python, and indented blocks) of the documents in DOCS
are extracted; each block runs in order, in a fresh copy of this checkout's files (what a clone
of the working tree holds: tracked and untracked-but-not-ignored files), with this Python's
environment first on PATH and the copy on PYTHONPATH. A command runs through bash exactly as
written, except for:

* SHORTEN: documented, mechanical substitutions that make long runs short (smaller sizes, a
  sweep file cut to its first case) or keep the test inside its own folder;
* NOT_HERE: commands that need what a CI machine lacks (a GPU, a multi-node cluster, a
  testbed as root, an index and minutes to install); each names the reason and is checked as
  far as it can be here (its ccbench arguments parse and validate, its script is valid bash,
  or it runs with `--dry-run`);
* STATUS: the exit status the documentation itself promises when it is not 0.

Everything else must exit 0. A new command in the docs therefore runs for real by default.
A block that takes more than a few seconds is marked `slow` (`-m "not slow"` skips them).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.trace_fixtures import TORCH_TEARDOWN_ABORT

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "results/README.md", "slurm/README.md", "results/multihost/README.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))
SHELL_LANGS = {"bash", "console", "sh", "shell"}
COMMAND_TIMEOUT_S = 900             # one command; the slowest (make-results --report) takes ~3 min
MEASURED_MAX = 16 * 1024            # SHORTEN: measuring commands stop at 16 KiB


# -- extraction ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    doc: str
    line: int                       # 1-based line of the block's first line in the document
    lang: str                       # "bash" for shell (indented blocks are shell), or "python"
    commands: tuple[str, ...]       # shell: one command per entry (comments, prompts removed)

    @property
    def ident(self) -> str:
        return f"{self.doc}:{self.line}"


def _strip_comment(line: str) -> str:
    """Drop a trailing `# comment` (a # at the start or after whitespace, outside quotes)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _shell_commands(lines: list[str], console: bool) -> tuple[str, ...]:
    commands: list[str] = []
    pending = ""
    for raw in lines:
        text = raw.strip()
        if console:                           # only prompted lines are commands
            if not text.startswith("$ ") and not pending:
                continue
            text = text[2:] if text.startswith("$ ") else text
        text = _strip_comment(text)
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        text = (pending + text).strip()
        pending = ""
        if text:
            commands.extend(_split_and(text))
    return tuple(commands)


def _split_and(text: str) -> list[str]:
    """`a && b` -> [a, b]; an && inside quotes or a ( subshell ) stays where it is."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        char = text[i]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif text.startswith(" && ", i) and depth == 0:
            parts.append(text[start:i].strip())
            start = i = i + 4
            continue
        i += 1
    return [*parts, text[start:].strip()]


def doc_blocks(doc: str) -> list[Block]:
    """The code blocks of one document: fenced (```lang) and indented (4 spaces after a blank)."""
    lines = (ROOT / doc).read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            lang, body = fence.group(1), lines[i + 1:end]      # no language: output, text
            if lang == "python":
                blocks.append(Block(doc, i + 2, "python", ("\n".join(body),)))
            elif lang in SHELL_LANGS:
                blocks.append(Block(doc, i + 2, "bash", _shell_commands(body, lang == "console")))
            i = end + 1
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            blocks.append(Block(doc, i + 1, "bash", _shell_commands(lines[i:end], False)))
            i = end
            continue
        i += 1
    return blocks


# -- how each command runs here ------------------------------------------------------------------

@dataclass
class Env:
    """One block's world: its copy of the checkout, its environment, a scratch folder."""

    root: Path
    scratch: Path
    vars: dict[str, str] = field(default_factory=dict)

    def bash(self, command: str, timeout: float = COMMAND_TIMEOUT_S
             ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], cwd=self.root, env=self.vars, text=True,
                              capture_output=True, timeout=timeout)


def _clip_sizes(spec: str) -> str:
    """`--sizes` cut at MEASURED_MAX: `1K-1G:4` -> `1K-16K:4`, `8,1K,1M` -> `8,1K`."""
    from ccbench.units import format_size, parse_size
    parts = [p for p in spec.split(",")
             if "-" in p or parse_size(p) <= MEASURED_MAX] or [spec.split(",")[0]]
    clipped = []
    for part in parts:
        if "-" not in part:
            clipped.append(part)
            continue
        low, _, rest = part.partition("-")
        high, colon, step = rest.partition(":")
        if parse_size(high) > MEASURED_MAX:
            high = format_size(max(MEASURED_MAX, parse_size(low)))
        clipped.append(f"{low}-{high}{colon}{step}")
    return ",".join(clipped)


def _cut_sweep_file(env: Env, command: str) -> str:
    """A sweep run here: its file, in this copy, keeps the first value of every list and
    sizes up to MEASURED_MAX (one case instead of dozens; same code path)."""
    import yaml
    path = env.root / shlex.split(command)[2]
    spec = yaml.safe_load(path.read_text())
    for key, value in spec.items():
        if isinstance(value, list) and key not in ("env", "slurm"):
            spec[key] = value[:1]
    if "sizes" in spec:
        spec["sizes"] = _clip_sizes(str(spec["sizes"]))
    path.write_text(yaml.safe_dump(spec))
    return command


def _fewer_results(env: Env, command: str) -> str:
    """make-results.sh --report: the copy's results/data keeps two runs (the report of all 15
    takes 3 to 10 minutes here; two run the same calibrate and report code)."""
    for path in (env.root / "results" / "data").glob("*.jsonl.gz"):
        if path.name not in KEPT_RESULTS:
            path.unlink()
    return command


KEPT_RESULTS = ("impi-n2.jsonl.gz", "gloo-n2.jsonl.gz")
MEASURING = re.compile(r"(^|\s)(-m ccbench|ccbench) (launch|allreduce|allgather|reduce-scatter|"
                       r"broadcast|alltoall|all)\b")

# (which commands, how they change, why): applied in order to every shell command
SHORTEN: list[tuple[re.Pattern[str], Callable[[Env, str], str], str]] = [
    (MEASURING,
     lambda env, c: re.sub(r"--sizes (\S+)", lambda m: f"--sizes {_clip_sizes(m.group(1))}", c),
     "measuring commands: sizes above 16 KiB are dropped (same code path, seconds not minutes)"),
    (MEASURING, lambda env, c: _clip_familiar(c),
     "measuring commands with nccl-tests, OSU or PARAM size flags (-e, -m, --e): the same cut"),
    (re.compile(r"^ccbench sweep slurm/sweeps/\S+\.yaml$"), _cut_sweep_file,
     "a local sweep: the file (in the test's copy) keeps the first value of every list, sizes "
     "up to 16 KiB"),
    (re.compile(r"^scripts/make-results\.sh --report$"), _fewer_results,
     "the report from results/data: the copy keeps two of its runs (impi-n2, gloo-n2)"),
    (re.compile(r"/opt/oneccl"), lambda env, c: c.replace("/opt/oneccl", str(env.scratch / "oneccl")),
     "a root-owned install folder: the test's scratch folder instead"),
    (re.compile(r"^OUT=/somewhere "), lambda env, c: c.replace("/somewhere", str(env.scratch / "out")),
     "an example folder: the test's scratch folder instead"),
    (re.compile(r"(^|\s)/tmp/"), lambda env, c: re.sub(r"(^|\s)/tmp/", rf"\1{env.scratch}/", c),
     "files under /tmp: the test's scratch folder instead (parallel runs must not share them)"),
]

# The exit status the documentation promises when it is not 0.
STATUS: list[tuple[re.Pattern[str], set[int], str]] = [
    (re.compile(r"^ccbench compare "), {0, 1},
     "compare exits 1 when a case regressed by a verdict that counts (several runs a side)"),
    (re.compile(r"^ccbench launch -n \d+ diagnose "), {0, 1},
     "diagnose exits 1 when it flags a component (one machine's loopback under load can be "
     "out of line)"),
    (re.compile(r"(^|\s)tests/gpu/check\.sh$"), {0, 3},
     "tests/gpu/check.sh: exit 3 when no GPU is visible (nothing checked), 0 when every step passed"),
]

ARGCHECK = r"""
import sys
from ccbench import cli
from ccbench.errors import UsageError
argv = sys.argv[1:]
try:
    if argv[0] in cli.SUBCOMMANDS:
        import importlib
        module = importlib.import_module(f"ccbench.commands.{argv[0]}")
        parser = cli.OneLineParser(prog="ccbench")
        module.register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        if argv[0] == "testbed" and args.action == "up":
            from ccbench import testbed
            from ccbench.units import parse_rate
            testbed.build_plan(args.hosts, parse_rate(args.link),
                               testbed.parse_topology(args.topology), args.ranks_per_host)
    else:
        cli.config_from_args(cli.bench_parser().parse_args(argv), argv)
except UsageError as exc:
    sys.exit(f"ccbench: error: {exc}")
print("arguments valid:", " ".join(argv))
"""


def _parses(command: str) -> Callable[[Env, str], None]:
    """Check that the ccbench part of `command` (after `ccbench` / `-m ccbench`) parses and
    validates, with bash doing the quoting and globbing as it would for the real command."""
    def check(env: Env, _: str) -> None:
        words = re.split(r"(?:^|\s)(?:python -m ccbench|ccbench)\s", command, maxsplit=1)
        assert len(words) == 2, f"no ccbench part in {command!r}"
        proc = env.bash(f"python -c {shlex.quote(ARGCHECK)} {words[1]}", timeout=120)
        assert proc.returncode == 0, f"{command!r}: {proc.stderr.strip()[-1500:]}"
    return check


def _bash_syntax(script: str) -> Callable[[Env, str], None]:
    def check(env: Env, _: str) -> None:
        proc = env.bash(f"bash -n {script}", timeout=60)
        assert proc.returncode == 0, proc.stderr
    return check


def _extras_exist(env: Env, command: str) -> None:
    """`pip install -e '.[a,b]'`: every extra it names is declared in pyproject.toml."""
    table = (env.root / "pyproject.toml").read_text().split(
        "[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    declared = set(re.findall(r"^([\w-]+)\s*=", table, re.M))
    named = re.search(r"\.\[([\w,]+)\]", command)
    assert named, command
    missing = set(named.group(1).split(",")) - set(declared)
    assert not missing, f"{command!r}: extras {sorted(missing)} not in pyproject.toml"


def _dry_run(env: Env, command: str) -> None:
    """A Slurm submission here: `--dry-run` instead of submitting (renders every script)."""
    dry = command.replace(" --wait", "") + " --dry-run"
    proc = env.bash(dry, timeout=300)
    assert proc.returncode == 0 and "#SBATCH" in proc.stdout, f"{dry!r}: {proc.stderr[-1500:]}"


def _downloads(env: Env, command: str) -> None:
    """`pip install --no-deps X==V` into this environment: download X==V instead."""
    spec = command.split()[-1]
    proc = env.bash(f"python -m pip download -q --no-deps -d {env.scratch / 'wheels'} {spec}",
                    timeout=300)
    assert proc.returncode == 0, proc.stderr[-1500:]


def _noop(env: Env, command: str) -> None:
    pass


@dataclass(frozen=True)
class NotHere:
    pattern: str                    # regex, matched in full against the command as written
    reason: str
    check: Callable[[Env, str], None]
    unless: Callable[[], bool] = lambda: False   # when this holds the command runs for real

    def matches(self, command: str) -> bool:
        return re.fullmatch(self.pattern, command) is not None and not self.unless()


def _astra_bin() -> str | None:
    """Where docs/predict.md says the binaries are: $CCBENCH_ASTRA_SIM_BIN, else
    ../shared/tools/astra-sim/bin beside the checkout (the main one, for a git worktree)."""
    explicit = os.environ.get("CCBENCH_ASTRA_SIM_BIN")
    if explicit:
        return explicit if Path(explicit).is_dir() else None
    common = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
                            cwd=ROOT, capture_output=True, text=True).stdout.strip()
    for checkout in (ROOT, Path(common).parent if common else ROOT):
        found = checkout.parent / "shared" / "tools" / "astra-sim" / "bin"
        if found.is_dir():
            return str(found.resolve())
    return None


INSTALL = "makes the environment this test already runs in (pip and an index, minutes)"
TESTBED = ("root, and it builds machine-wide network namespaces and bridges (one testbed per "
           "machine, shared with whoever else uses it)")
CLUSTER = "an N-host Slurm cluster (here: the emulated one of `ccbench testbed up --slurm`)"
MULTI_HOST = "hosts of a real cluster (node1, node2)"

NOT_HERE: list[NotHere] = [
    NotHere(r"python3 -m venv \.venv", INSTALL, _noop),
    NotHere(r"\. \.venv/bin/activate", INSTALL, _noop),
    NotHere(r"pip install -e '\.\[[\w,]+\]'", INSTALL + "; tests/test_wheel.py installs the "
            "wheel into a fresh environment", _extras_exist),
    NotHere(r"pip install --no-deps oneccl(-cpu)?==[\d.]+", "changes this environment (it would "
            "replace what scripts/install-oneccl.sh put there)", _downloads),
    NotHere(r"bash \.ci/run", "installs with pip and apt, starts Slurm as root, then runs the "
            "whole test suite, this test included", _bash_syntax(".ci/run")),
    NotHere(r"(FORCE=1 )?scripts/make-results\.sh", "measures 12 runs in three environments "
            "(VENV, VENV_MPICH, VENV_OPENMPI; about 25 minutes on 2 cores)",
            _bash_syntax("scripts/make-results.sh")),
    NotHere(r"scripts/make-multihost-results\.sh", TESTBED + "; about 10 minutes",
            _bash_syntax("scripts/make-multihost-results.sh")),
    NotHere(r"scripts/make-testbed-results\.sh", TESTBED + "; about 45 minutes",
            _bash_syntax("scripts/make-testbed-results.sh")),
    NotHere(r"ccbench testbed .*", TESTBED, lambda env, c: _parses(_fill_placeholders(c))(env, c)),
    NotHere(r"export SLURM_CONF=/run/ccbench-testbed/.*", CLUSTER, _noop),
    NotHere(r"sinfo", CLUSTER, _noop),
    NotHere(r"srun -N\d+ .*", CLUSTER, lambda env, c: _parses(c)(env, c)),
    NotHere(r"mpiexec -n \d+ -ppn \d+ -hosts \S+ .*", MULTI_HOST, lambda env, c: _parses(c)(env, c)),
    NotHere(r"srun --kill-on-bad-exit=1 .*", "a Slurm allocation", lambda env, c: _parses(c)(env, c)),
    NotHere(r"torchrun --nnodes [2-9].*", MULTI_HOST, lambda env, c: _parses(c)(env, c)),
    NotHere(r"ccbench sweep \S+ --slurm(?!.*--dry-run).*", "submits to a Slurm cluster with the partitions, "
            "nodes or GPUs the sweep names", _dry_run),
    NotHere(r"bash scripts/build-astra-sim\.sh.*", "clones ASTRA-sim from GitHub and builds it "
            "(about ten minutes)", _bash_syntax("scripts/build-astra-sim.sh")),
    NotHere(r"python scripts/astra_check\.py .*", "the ASTRA-sim binaries "
            "(../shared/tools/astra-sim/bin or CCBENCH_ASTRA_SIM_BIN)",
            lambda env, c: _must_pass(env, "python scripts/astra_check.py --help"),
            unless=lambda: _astra_bin() is not None),
    NotHere(r".*/AstraSim_Analytical_\w+ .*", "the ASTRA-sim binaries (as above)",
            lambda env, c: _must_pass(env, f"bash -n -c {shlex.quote(c)}"),
            unless=lambda: _astra_bin() is not None),
]

# python blocks that are fragments of a program, not programs: (pattern, reason, what must import)
PY_FRAGMENTS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"^observer = ExecutionTraceObserver\(\)"), "the tracing lines of "
     "examples/train_and_trace.py, which the document's next block runs; compiled here, and its "
     "class imported", "from torch.profiler import ExecutionTraceObserver"),
]


def _fill_placeholders(command: str) -> str:
    """A synopsis line (`--hosts N [--link RATE]`): example values, optional parts included."""
    command = re.sub(r"\[(--?[^\]]*)\]", r"\1", command)
    for word, value in (("N", "4"), ("K", "1"), ("RATE", "1G"), ("T", "switch"), ("S", "1"),
                        ("HOST", "h0"), ("COMMAND ...", "hostname")):
        command = re.sub(rf"(?<![\w-]){re.escape(word)}(?![\w-])", value, command)
    return command


def _optional_variants(command: str) -> list[str]:
    """`cmd [--a 1] [--b 2]`: run without the optional parts and with all of them."""
    if not re.search(r"\s\[-", command):
        return [command]
    return [re.sub(r"\s\[-[^\]]*\]", "", command), re.sub(r"\s\[(-[^\]]*)\]", r" \1", command)]


def _clip_familiar(command: str) -> str:
    """The largest size of nccl-tests' `-e`, PARAM's `--e` and OSU's `-m [MIN:]MAX` cut at
    MEASURED_MAX, as `--sizes` is (never below the smallest size asked)."""
    from ccbench.units import format_size, parse_size

    def high(text: str, low: str | None) -> str:
        floor = max(MEASURED_MAX, parse_size(low)) if low else MEASURED_MAX
        return format_size(floor) if parse_size(text) > floor else text

    low_b = re.search(r"(?:^|\s)--?b (\d\S*)", command)
    command = re.sub(r"(^|\s)(--?e) (\d\S*)", lambda m: f"{m.group(1)}{m.group(2)} "
                     f"{high(m.group(3), low_b.group(1) if low_b else None)}", command)

    def osu(m: re.Match[str]) -> str:
        low, colon, top = m.group(2).rpartition(":")
        if not top:
            return m.group(0)
        return f"{m.group(1)}-m {low}{colon}{high(top, low or None)}"

    return re.sub(r"(^|\s)-m ([\d:]\S*)", osu, command)      # not `python -m ccbench`


def _must_pass(env: Env, command: str) -> None:
    proc = env.bash(command, timeout=300)
    assert proc.returncode == 0, f"{command!r}: {proc.stderr[-1500:]}"


# -- the blocks ------------------------------------------------------------------------------

# a block with one of these takes more than a few seconds (tens, under load minutes)
SLOW = [MEASURING, re.compile(r"^ccbench sweep \S+\.yaml$|tests/gpu/check\.sh|^ccbench calibrate|"
                              r"make-results\.sh --report|astra_check\.py|export chakra|"
                              r"ccbench report|multihost-results\.sh --report|ccbench\.load\(|"
                              r"testbed-results\.sh --analyze")]
BLOCKS = [block for doc in DOCS for block in doc_blocks(doc)]


def _slow(block: Block) -> bool:
    """Runs a SLOW command for real (a command only checked here is quick)."""
    return any(pattern.search(command) and not any(rule.matches(command) for rule in NOT_HERE)
               for pattern in SLOW for command in block.commands)


def _checkout_copy(dest: Path) -> Path:
    """What a clone of this working tree holds: tracked files, and untracked ones git keeps."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _environment(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(root)
    astra = _astra_bin()
    if astra:
        env.setdefault("CCBENCH_ASTRA_SIM_BIN", astra)
    return env


def run_command(env: Env, command: str) -> str:
    """Run (or check) one documented command; returns what was done, for the test's log."""
    for rule in NOT_HERE:
        if rule.matches(command):
            rule.check(env, command)
            return f"checked only ({rule.reason}): {command}"
    if command.startswith("export "):
        name, _, value = command[len("export "):].partition("=")
        env.vars[name] = os.path.expandvars(value)
        return f"set: {command}"
    actual = command
    for pattern, change, _why in SHORTEN:
        if pattern.search(actual):
            actual = change(env, actual)
    allowed = next((codes for pattern, codes, _ in STATUS if pattern.search(command)), {0})
    for variant in _optional_variants(actual):
        started = time.monotonic()
        proc = env.bash(variant)
        if proc.returncode not in allowed and TORCH_TEARDOWN_ABORT in proc.stderr:
            proc = env.bash(variant)          # once more (tests/trace_fixtures.py says why)
        assert proc.returncode in allowed, (
            f"{command!r} ran as {variant!r}: exit {proc.returncode} (expected {sorted(allowed)})"
            f"\n--- stderr\n{proc.stderr[-3000:]}\n--- stdout\n{proc.stdout[-1500:]}")
        assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr[-3000:]
        actual = f"{variant} ({time.monotonic() - started:.1f} s)"
    return f"ran: {actual}"


def run_python(env: Env, code: str) -> str:
    for pattern, reason, needed in PY_FRAGMENTS:
        if pattern.search(code):
            compile(code, "<doc>", "exec")
            _must_pass(env, f"python -c {shlex.quote(needed)}")
            return f"checked only ({reason})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=env.root, env=env.vars,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert proc.returncode == 0, f"{code!r}:\n{proc.stderr[-3000:]}"
    return f"ran python: {code.splitlines()[0]}"


# documents whose blocks build on each other (a file made by one is read by the next): all
# their blocks run in one test, in order, in one copy
SEQUENTIAL = {"docs/replay.md"}
UNITS: list[tuple[str, list[Block]]] = [
    *((b.ident, [b]) for b in BLOCKS if b.doc not in SEQUENTIAL),
    *((doc, [b for b in BLOCKS if b.doc == doc]) for doc in sorted(SEQUENTIAL)
      if any(b.doc == doc for b in BLOCKS)),
]


@pytest.mark.parametrize("blocks", [
    pytest.param(blocks, id=ident, marks=[pytest.mark.slow] if any(map(_slow, blocks)) else [])
    for ident, blocks in UNITS])
@pytest.mark.timeout(1800)      # a document's blocks run in turn; each command has its own limit
def test_documented_commands_run(blocks: list[Block], tmp_path: Path) -> None:
    root = _checkout_copy(tmp_path / "checkout")
    env = Env(root, tmp_path / "scratch", _environment(root))
    env.scratch.mkdir()
    for block in blocks:
        if block.lang == "python":
            print(block.ident, run_python(env, block.commands[0]))
            continue
        for command in block.commands:
            print(block.ident, run_command(env, command))


def test_every_document_has_its_blocks_found() -> None:
    """The extraction sees the blocks (a changed fence style would silently test nothing)."""
    found = {b.doc for b in BLOCKS}
    assert {"README.md", "results/README.md", "slurm/README.md", "docs/predict.md",
            "docs/replay.md", "docs/measure.md", "docs/compare.md", "docs/clusters.md",
            "docs/testbed.md", "docs/oneccl.md", "docs/gpu.md"} <= found
    assert all(b.commands for b in BLOCKS)
    assert _split_and('A=1; (cd x && y) | grep "a && b" && z') == [
        'A=1; (cd x && y) | grep "a && b"', "z"]


def test_rules_catch_what_they_are_for() -> None:
    """The substitutions and exceptions do what their comments say, on the docs' own lines."""
    assert _clip_sizes("1K-1G") == "1K-16K" and _clip_sizes("8-64M") == "8-16K"
    assert _clip_sizes("1K-16M:4") == "1K-16K:4" and _clip_sizes("8,1K,1M") == "8,1K"
    assert _clip_sizes("64K-16M") == "64K-64K"
    assert _clip_familiar("ccbench launch -n 2 all_reduce_perf -b 8 -e 128M -f 2 -n 20") == \
        "ccbench launch -n 2 all_reduce_perf -b 8 -e 16K -f 2 -n 20"
    assert _clip_familiar("ccbench launch -n 2 osu_allreduce -m 8:1048576 -i 1000 -x 100 -f") == \
        "ccbench launch -n 2 osu_allreduce -m 8:16K -i 1000 -x 100 -f"
    assert _clip_familiar("ccbench launch -n 2 -- --collective all_reduce --b 8 --e 1M --f 2") == \
        "ccbench launch -n 2 -- --collective all_reduce --b 8 --e 16K --f 2"
    assert _clip_familiar("ccbench allreduce -b 64K -e 1M") == "ccbench allreduce -b 64K -e 64K"
    assert _clip_familiar("python -m ccbench allreduce -e 1K") == \
        "python -m ccbench allreduce -e 1K"
    assert _optional_variants("ccbench calibrate results/ -o m.json [--validate 2,4:3] "
                              "[--bootstrap 200]") == [
        "ccbench calibrate results/ -o m.json",
        "ccbench calibrate results/ -o m.json --validate 2,4:3 --bootstrap 200"]
    assert _fill_placeholders("ccbench testbed up --hosts N [--ranks-per-host K] [--link RATE] "
                              "[--topology T] [--slurm]") == (
        "ccbench testbed up --hosts 4 --ranks-per-host 1 --link 1G --topology switch --slurm")
    assert _fill_placeholders("ccbench testbed exec HOST -- COMMAND ...") == (
        "ccbench testbed exec h0 -- hostname")
    assert not any(rule.matches("ccbench launch -n 2 allreduce --sizes 1K") for rule in NOT_HERE)


def test_a_failing_command_fails_the_test(tmp_path: Path) -> None:
    env = Env(tmp_path, tmp_path, _environment(ROOT))
    with pytest.raises(AssertionError, match="exit 2"):
        run_command(env, "ccbench allreduce --sizes 1K-2K --backend nosuchbackend")
    with pytest.raises(AssertionError, match="nosuchbackend"):
        _parses("srun -N4 python -m ccbench allreduce --backend nosuchbackend")(env, "")


def test_generated_docs_are_current() -> None:
    """docs/reference/cli.md (with the method options' table) and records.md are what
    scripts/gen_docs.py makes from the code now (a changed flag, default or record field
    fails here until the script is rerun); README.md holds no generated text, so a new
    option cannot push it past its length."""
    proc = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_docs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert "README.md" not in {p.name for p in gen_docs.outputs()}
    assert "generated by scripts/gen_docs.py" not in (ROOT / "README.md").read_text()
    assert gen_docs.option_table() in (ROOT / "docs" / "reference" / "cli.md").read_text()


def test_links_in_docs_point_at_files() -> None:
    """Every relative Markdown link in the docs and the dated results names a file or folder
    that exists (a moved or renamed document breaks no link silently)."""
    broken = []
    dated = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*.md"))
    for doc in sorted({*DOCS, *dated}):
        text = (ROOT / doc).read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            if not ((ROOT / doc).parent / target).exists():
                broken.append(f"{doc}: {target}")
    assert not broken, broken


def test_readme_is_short() -> None:
    """The README stays an introduction (at most 1,500 words, as `wc -w` counts); the rest
    belongs in docs/ and results/."""
    words = len((ROOT / "README.md").read_text().split())
    assert words <= 1500, f"README.md has {words} words"


def test_readme_names_every_collective() -> None:
    """The README's opening names what ccbench measures: every collective of the registry, by
    its name or one of its other names (a new collective fails here until it is named)."""
    from ccbench.collectives import every

    opening = " ".join((ROOT / "README.md").read_text().split("\n\n")[1].split())
    missing = [c.name for c in every()
               if not any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", opening)
                          for name in (c.name, *c.aliases))]
    assert not missing, f"README.md's first paragraph does not name {missing}"
