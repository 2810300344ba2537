"""The direction of dependencies: cli -> sweep -> bench (the benchmark core: runner -> harness)
-> backends -> algorithms;
commands -> replay -> harness/backends; formats -> model -> trace; the rank lifecycle (run/)
sits under the benchmark, the replay and diagnose; model/ and report/ read
records and never reach a backend; trace/ holds no file format; records/ is data only;
algorithms/ is pure. Every package states its layer here, and no two packages (or top-level
modules) import each other, directly or round a longer loop. Checked on the source (every
import, lazy ones inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package or module (dotted prefix) -> the prefixes it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    # the registry's data, read by backends/, report/ and model/ alike: imports nothing
    "ccbench.backend_facts": ("ccbench", "torch", "mpi4py", "numpy"),
    "algorithms": ("ccbench", "torch", "mpi4py"),
    "ccbench.records": ("ccbench.backends", "ccbench.bench.harness", "ccbench.bench.runner", "ccbench.sweep",
                        "ccbench.cli", "ccbench.commands", "ccbench.model", "ccbench.report",
                        "torch", "mpi4py"),
    "ccbench.model": ("ccbench.backends", "ccbench.bench.harness", "ccbench.bench.runner", "ccbench.cli",
                      "ccbench.commands", "ccbench.formats", "ccbench.replay", "torch", "mpi4py"),
    # data and rules about traces: no file format, no model, no replay
    "ccbench.trace": ("ccbench.formats", "ccbench.model", "ccbench.replay", "ccbench.bench.harness",
                      "ccbench.bench.runner", "ccbench.cli", "ccbench.commands", "torch", "mpi4py"),
    # readers and writers of other tools' files; capture wraps torch.distributed in the
    # user's job, so torch is allowed (lazily), a ccbench backend is not
    "ccbench.formats": ("ccbench.backends", "ccbench.bench.harness", "ccbench.bench.runner", "ccbench.replay",
                        "ccbench.sweep", "ccbench.cli", "ccbench.commands", "mpi4py"),
    "ccbench.replay": ("ccbench.model", "ccbench.formats", "ccbench.sweep", "ccbench.cli",
                       "ccbench.commands", "ccbench.report"),
    "ccbench.collectives": ("ccbench.backends", "ccbench.bench.harness", "ccbench.bench.runner",
                            "ccbench.sweep", "ccbench.cli", "ccbench.commands", "ccbench.model",
                            "ccbench.report", "ccbench.trace", "ccbench.formats", "torch",
                            "mpi4py"),
    "ccbench.testbed": ("ccbench.backends", "ccbench.bench.harness", "ccbench.bench.runner", "ccbench.sweep",
                        "ccbench.cli", "ccbench.commands", "ccbench.model", "ccbench.report",
                        "ccbench.trace", "ccbench.formats", "ccbench.replay", "torch", "mpi4py"),
    "ccbench.diagnose": ("ccbench.cli", "ccbench.commands", "ccbench.report", "ccbench.sweep",
                         "ccbench.model", "ccbench.formats", "ccbench.replay"),
    # the top layer: parses and calls everything below, imported by cli alone
    "ccbench.commands": ("ccbench.__main__",),
    "ccbench.report": ("ccbench.backends", "ccbench.bench.harness", "ccbench.bench.runner", "ccbench.cli",
                       "ccbench.commands", "torch", "mpi4py"),
    "ccbench.backends": ("ccbench.bench.harness", "ccbench.bench.runner", "ccbench.sweep", "ccbench.cli",
                         "ccbench.commands"),
    # the benchmark core: options, runner, harness, validation, output, familiar flags,
    # repeats, stats; under the commands and sweeps, over backends, records and run/
    "ccbench.bench": ("ccbench.cli", "ccbench.commands", "ccbench.sweep", "ccbench.replay",
                      "ccbench.diagnose", "ccbench.report", "ccbench.model", "ccbench.formats",
                      "ccbench.trace", "ccbench.testbed"),
    # inside it: the harness measures one size and knows nothing of a whole run or its output
    "ccbench.bench.harness": ("ccbench.bench.runner", "ccbench.bench.output",
                              "ccbench.bench.familiar", "ccbench.bench.repeats"),
    # the option declarations, read by sweeps and commands: no backend, record or control plane
    "ccbench.bench.options": ("ccbench.backends", "ccbench.collectives", "ccbench.records",
                              "ccbench.run", "ccbench.bench.runner", "ccbench.bench.harness",
                              "ccbench.bench.output", "ccbench.bench.familiar", "torch",
                              "mpi4py", "numpy"),
    # statistics, read by report/ and compare: numpy only
    "ccbench.bench.stats": ("ccbench", "torch", "mpi4py"),
    "ccbench.sweep": ("ccbench.cli", "ccbench.commands", "ccbench.bench.harness",
                      "ccbench.bench.runner", "torch", "mpi4py"),
    # the rank lifecycle and control plane: under the benchmark, the replay and diagnose
    "ccbench.run": ("ccbench.backends", "ccbench.bench.harness", "ccbench.bench.runner", "ccbench.sweep",
                    "ccbench.cli", "ccbench.commands", "ccbench.model", "ccbench.report",
                    "ccbench.trace", "ccbench.formats", "ccbench.replay", "ccbench.diagnose",
                    "ccbench.testbed"),
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


# modules that break their package's rule today, each with the rule it breaks and why
EXEMPT: dict[str, tuple[str, ...]] = {
    # sub-communicators per backend: moves into backends/ (a backend owns its sub-communicators)
    "ccbench/trace/subcomm.py": ("ccbench.backends",),
}


def _violations(prefix: str) -> list[str]:
    root = ROOT.joinpath(*prefix.split("."))
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    bad = []
    for path in files:
        for name in sorted(_imports(path)):
            for banned in FORBIDDEN[prefix]:
                if banned in EXEMPT.get(path.relative_to(ROOT).as_posix(), ()):
                    continue
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


def _unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: ccbench.model.netsim ->
    ccbench.model, ccbench.bench.harness -> ccbench.bench.harness, algorithms.ring -> algorithms."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "ccbench" else parts[0]


def _package_graph(roots: tuple[str, ...] = ("ccbench", "algorithms")) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            source = _unit(_module_name(path))
            targets = {_unit(name) for name in _imports(path) if _unit(name) in
                       ("ccbench", "algorithms") or name.startswith("ccbench.")}
            graph.setdefault(source, set()).update(targets - {source})
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one node (Tarjan): each holds a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _packages() -> set[str]:
    return {f"ccbench.{path.parent.name}" for path in (ROOT / "ccbench").glob("*/__init__.py")} \
        | {"algorithms"}


def test_no_cycle_between_packages() -> None:
    """No package takes part in an import loop, directly or through top-level modules."""
    loops = [loop for loop in _cycles(_package_graph()) if set(loop) & _packages()]
    assert loops == []


def test_the_cycle_check_sees_a_loop() -> None:
    graph = {"ccbench.model": {"ccbench.trace"}, "ccbench.trace": {"ccbench.formats"},
             "ccbench.formats": {"ccbench.model"}, "ccbench.cli": {"ccbench.model"}}
    assert _cycles(graph) == [["ccbench.formats", "ccbench.model", "ccbench.trace"]]


def test_every_package_has_a_layer() -> None:
    assert _packages() - set(FORBIDDEN) == set()
