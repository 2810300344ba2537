"""Every command form of the README's command table parses as written, with its positionals
anywhere among the options, and the documented `simulate` form runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import run_ccbench

from ccbench.cli import SUBCOMMANDS, bench_parser, parse_subcommand
from ccbench.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
# what the table's placeholders stand for in a command line that parses
PLACEHOLDERS = {"FILE": "sweep.yaml", "IN...": "a.jsonl b.jsonl", "OUT": "out.jsonl",
                "RESULTS...": "r.jsonl", "RESULTS": "r.jsonl", "DIR": "out", "P": "16",
                "T": "fat-tree", "COLLECTIVE": "allreduce", "...": "1M-1G", "BASE": "a.jsonl",
                "NEW": "b.jsonl", "TRACE": "traces/job", "A,B": "gloo,mpi",
                "MODEL": "model.json"}

# forms that leave out a required option the same table row states in its first form
ROW_SHORTHAND = {"ccbench export astra-sim MODEL --trace TRACE": ["-o", "out"]}


def readme_table_forms() -> list[str]:
    """The `ccbench ...` code spans of the README's command table ("The rest of the suite"),
    including the ones after a ` / ` that leave out the leading `ccbench`."""
    text = (ROOT / "README.md").read_text()
    forms = []
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split(" | ")[0]
        for span in re.findall(r"`([^`]+)`", first_cell):
            words = span.split()
            if words[0] == "ccbench" or words[0] in SUBCOMMANDS:
                forms.append(span if words[0] == "ccbench" else f"ccbench {span}")
    return forms


def concrete(form: str) -> list[str]:
    form = re.sub(r"\s*\[[^]]*\]", "", form.replace("\\|", "|"))     # options left out
    words = []
    for word in shlex.split(form)[1:]:
        words += PLACEHOLDERS.get(word, word).split()
    return words


def test_the_readme_has_a_command_table() -> None:
    forms = readme_table_forms()
    assert len(forms) >= 10 and any(f.startswith("ccbench simulate") for f in forms), forms


@pytest.mark.parametrize("form", readme_table_forms())
def test_every_documented_form_parses(form: str) -> None:
    argv = concrete(form) + ROW_SHORTHAND.get(form, [])
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
    from ccbench.commands.simulate import size_label

    assert [size_label(n) for n in (8, 1026 * 1024, 2385960, 1 << 30)] == \
        ["8", "1026K", "2.275M", "1G"]
