"""The direction of dependencies: cli -> sweep/runner -> harness -> backends -> algorithms;
model/ and report/ read records and never reach a backend; records/ is data only; algorithms/
is pure. Checked on the source (every import, lazy ones inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package or module (dotted prefix) -> the prefixes it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "algorithms": ("ccbench", "torch", "mpi4py"),
    "ccbench.records": ("ccbench.backends", "ccbench.harness", "ccbench.runner", "ccbench.sweep",
                        "ccbench.cli", "ccbench.commands", "ccbench.model", "ccbench.report",
                        "torch", "mpi4py"),
    "ccbench.model": ("ccbench.backends", "ccbench.harness", "ccbench.runner", "ccbench.cli",
                      "ccbench.commands", "torch", "mpi4py"),
    "ccbench.report": ("ccbench.backends", "ccbench.harness", "ccbench.runner", "ccbench.cli",
                       "ccbench.commands", "torch", "mpi4py"),
    "ccbench.backends": ("ccbench.harness", "ccbench.runner", "ccbench.sweep", "ccbench.cli",
                         "ccbench.commands"),
    "ccbench.harness": ("ccbench.runner", "ccbench.sweep", "ccbench.cli", "ccbench.commands"),
    "ccbench.sweep": ("ccbench.cli", "ccbench.commands", "ccbench.harness", "torch", "mpi4py"),
    "ccbench.runner": ("ccbench.cli", "ccbench.commands", "ccbench.sweep"),
}


def _module_name(path: Path) -> str:
    if not path.is_relative_to(ROOT):
        return path.stem
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else _module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:                                   # relative: resolve against package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
    return found


def _violations(prefix: str) -> list[str]:
    root = ROOT.joinpath(*prefix.split("."))
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    bad = []
    for path in files:
        for name in sorted(_imports(path)):
            for banned in FORBIDDEN[prefix]:
                if name == banned or name.startswith(banned + "."):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("prefix", sorted(FORBIDDEN))
def test_layering(prefix: str) -> None:
    assert _violations(prefix) == []


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from ccbench.backends import gloo\n")
    assert "ccbench.backends" in _imports(module)
