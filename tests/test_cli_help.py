"""Every option, positional and subcommand has a one-line help; `ccbench --help` describes
each subcommand and fits a terminal."""

from __future__ import annotations

import argparse
import importlib

import pytest
from conftest import run_ccbench

from ccbench.cli import SUBCOMMANDS, OneLineParser, bench_parser


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    out = [("ccbench", bench_parser())]
    for name in SUBCOMMANDS:
        parser = OneLineParser(prog="ccbench")
        importlib.import_module(f"ccbench.commands.{name}").register(
            parser.add_subparsers(dest="command"))
        out.append(("ccbench", parser))
    return out


def _missing_help(path: str, parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            missing += [f"{path} {a.dest}" for a in action._choices_actions if not a.help]
            for name, sub in action.choices.items():
                missing += _missing_help(f"{path} {name}", sub)
        elif action.help is not argparse.SUPPRESS and not (action.help or "").strip():
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


@pytest.mark.parametrize(("path", "parser"), _parsers(),
                         ids=["benchmark", *SUBCOMMANDS])
def test_every_option_has_help(path: str, parser: argparse.ArgumentParser) -> None:
    assert _missing_help(path, parser) == []


def test_main_help_describes_each_subcommand() -> None:
    proc = run_ccbench("--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name in SUBCOMMANDS:
        described = [line for line in lines if line.split()[:1] == [name] and
                     len(line.split()) > 2]
        assert described, f"no line describes {name}"
    start = lines.index(next(line for line in lines if line.startswith("Measure collectives")))
    assert all(len(line) <= 100 for line in lines[start:start + 20])


def test_quiet_says_what_it_hides() -> None:
    quiet = next(a for a in bench_parser()._actions if "--quiet" in a.option_strings)
    assert "progress bar" in quiet.help and "still print" in quiet.help


def _silent_defaults(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """Options with a default value (not off, not empty) whose help does not say it."""
    silent = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                silent += _silent_defaults(f"{path} {name}", sub)
        elif (action.option_strings and action.default not in (None, False, True, [], "")
              and action.default is not argparse.SUPPRESS
              and "default" not in (action.help or "").lower()):
            silent.append(f"{path} {'/'.join(action.option_strings)} ({action.default!r})")
    return silent


@pytest.mark.parametrize(("path", "parser"), _parsers(),
                         ids=["benchmark", *SUBCOMMANDS])
def test_every_default_is_in_the_help(path: str, parser: argparse.ArgumentParser) -> None:
    assert _silent_defaults(path, parser) == []


def test_every_method_option_says_its_default() -> None:
    """Method options are parsed with no argparse default (a given one wins over the
    environment), so their help must say the default itself (--min-time did not)."""
    from ccbench.bench.options import BENCH_OPTIONS

    assert [o.name for o in BENCH_OPTIONS
            if o.default not in ("", None) and "default" not in o.help.lower()] == []


def test_launch_help_describes_it_with_an_example() -> None:
    proc = run_ccbench("launch", "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ccbench launch -n 2 allreduce" in proc.stdout
    assert "Start N local ranks" in proc.stdout
