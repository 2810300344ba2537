"""Every command form the documentation writes with placeholders (`ccbench simulate MODEL
--ranks P ...`) parses as written, with its positionals anywhere among the options, and the
documented `simulate` form runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import run_ccbench

from ccbench.cli import SUBCOMMANDS, bench_parser, parse_subcommand
from ccbench.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# what the placeholders stand for in a command line that parses
PLACEHOLDERS = {"FILE": "sweep.yaml", "IN...": "a.jsonl b.jsonl", "OUT": "out.jsonl",
                "RESULTS...": "r.jsonl", "RESULTS": "r.jsonl", "DIR": "out", "P": "16",
                "T": "fat-tree", "COLLECTIVE": "allreduce", "...": "", "BASE": "a.jsonl",
                "NEW": "b.jsonl", "TRACE": "traces/job", "A,B": "gloo,mpi",
                "MODEL": "model.json", "N": "2", "M": "8"}
# forms whose prose leaves out a required option the sentence around them states
SHORTHAND = {"ccbench export astra-sim MODEL --trace TRACE": ["-o", "out"],
             "ccbench export astra-sim MODEL --trace TRACE --ranks P": ["-o", "out"]}


def documented_forms() -> list[str]:
    """The `ccbench SUBCOMMAND ...` code spans of the guides that hold a placeholder (an
    upper-case word or `...`): the command forms the documentation teaches."""
    forms = []
    for guide in GUIDES:
        for span in re.findall(r"`(ccbench [^`]+)`", guide.read_text()):
            words = span.split()
            if (len(words) > 1 and words[1] in SUBCOMMANDS
                    and re.search(r"\b[A-Z]{1,}\b|\.\.\.", span)):
                forms.append(span)
    return sorted(set(forms))


def concrete(form: str) -> list[str]:
    form = re.sub(r"\s*\[[^]]*\]", "", form.replace("\\|", "|"))     # options left out
    words = []
    for word in shlex.split(form)[1:]:
        words += PLACEHOLDERS.get(word, word).split()
    return words


def test_the_guides_teach_command_forms() -> None:
    forms = documented_forms()
    assert len(forms) >= 5 and any(f.startswith("ccbench simulate") for f in forms), forms


@pytest.mark.parametrize("form", documented_forms())
def test_every_documented_form_parses(form: str) -> None:
    argv = concrete(form) + SHORTHAND.get(form, [])
    if argv[0] in SUBCOMMANDS:
        parse_subcommand(argv[0], argv[1:])
    else:
        bench_parser().parse_args(argv)


@pytest.mark.parametrize("argv", [
    ["simulate", "model.json", "--ranks", "16", "allreduce", "--sizes", "1M"],
    ["simulate", "--ranks", "16", "model.json", "--topology", "ring", "allreduce"],
    ["report", "-o", "out", "a.jsonl", "b.jsonl"],
    ["compare", "--threshold", "0.1", "a.jsonl", "b.jsonl"],
    ["calibrate", "-o", "model.json", "a.jsonl"],
    ["merge", "-o", "out.jsonl", "a.jsonl", "b.jsonl"],
    ["export", "astra-sim", "-o", "out", "model.json"],
    ["algorithms", "show", "--ranks", "4", "ring", "allreduce"],
])
def test_positionals_after_options(argv: list[str]) -> None:
    parse_subcommand(argv[0], argv[1:])


def test_the_benchmark_takes_its_collective_after_options() -> None:
    args = bench_parser().parse_args(["--backend", "gloo", "--sizes", "1K", "allreduce"])
    assert args.collective == "allreduce" and args.backend == "gloo"


def test_a_stray_positional_is_still_one_error() -> None:
    with pytest.raises(UsageError, match="unrecognized arguments: extra"):
        parse_subcommand("simulate", ["model.json", "allreduce", "extra", "--ranks", "4"])


def test_the_documented_simulate_form_runs() -> None:
    proc = run_ccbench("simulate", str(ROOT / "results" / "model.json"), "--ranks", "16384",
                       "--topology", "fat-tree", "allreduce", "--sizes", "1M-1G",
                       "--backend", "gloo/gloo", timeout=120)
    assert proc.returncode == 0, proc.stderr
    sizes = [line.split()[0] for line in proc.stdout.splitlines() if line[:1] in " 0123456789"]
    assert sizes[:2] == ["1M", "2M"] and sizes[-1] == "1G"


def test_an_empty_folder_names_every_results_format(tmp_path: Path) -> None:
    proc = run_ccbench("report", str(tmp_path), "-o", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2
    assert "*.jsonl, *.jsonl.gz, *.parquet" in proc.stderr


def test_simulate_sizes_share_one_style() -> None:
    from ccbench.units import size_label

    assert [size_label(n) for n in (8, 1026 * 1024, 2385960, 1 << 30)] == \
        ["8", "1026K", "2.275M", "1G"]
