"""The house rules as tests: ruff (the project's rule set) and mypy (the project's
configuration, pyproject.toml) pass on the whole tree. Both tools are pinned in the test extra
because new releases add rules; under CI a missing tool fails instead of skipping."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import missing_prerequisite

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        missing_prerequisite(f"{name} is not installed (it is in the test extra)")
    return path


def test_ruff_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "ccbench", "algorithms", "tests", "benchmarks",
                           "scripts"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_clean() -> None:
    proc = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_no_function_over_80_lines() -> None:
    """The house rule beside ruff's complexity bound (C90, max 15, pyproject.toml): a function
    of the package, the algorithms, benchmarks or scripts fits on a screen."""
    import ast

    long = []
    for folder in ("ccbench", "algorithms", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > 80:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                    f"({lines} lines)")
    assert not long, long
