"""The install extras: `.[all]` is everything a user runs, `.[dev]` what developers add."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _names(extra: str) -> set[str]:
    """Package names an extra installs, following ccbench[...] references."""
    out: set[str] = set()
    for spec in EXTRAS[extra]:
        inner = re.fullmatch(r"ccbench\[([^]]+)\]", spec)
        if inner:
            for name in inner.group(1).split(","):
                out |= _names(name.strip())
        else:
            out.add(re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower())
    return out


def test_all_is_what_a_user_runs() -> None:
    users = _names("all")
    assert {"torch", "mpi4py", "impi-rt", "matplotlib", "pandas", "pyarrow", "protobuf"} <= users
    assert not users & {"pytest", "ruff", "mypy", "hypothesis", "pytest-timeout"}


def test_dev_is_the_tools_and_ci_installs_both() -> None:
    assert {"pytest", "ruff", "mypy", "hypothesis", "pytest-timeout"} <= _names("dev")
    assert "pip install -q -e '.[all,dev]'" in (ROOT / ".ci" / "run").read_text()
