"""A backend is one module under ccbench/backends/ that owns what it can do (availability,
version, display name, libraries, default device, the options it reads, its point-to-point
transport, its sub-communicators, whether it carries the algorithms): no other
module names a backend in a string literal, except the registry's data (ccbench/backend_facts.py,
which imports nothing so that report/ and model/ may read it); and no text outside them lists
backends by hand (a help text, a message: `comma list: gloo, mpi, ...`): such a list is made
from the registry. Checked on the source, every string constant (the parts of f-strings too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ccbench.backends import REGISTRY

ROOT = Path(__file__).resolve().parent.parent / "ccbench"

#: module (relative to ccbench/) -> why it may name backends
ALLOWED = {
    "backend_facts.py": "the registry as data: each backend's module, display name, colour and "
                        "documented algorithms, for the layers that may not import backends/",
}

_NAMED = re.compile(r"^(?:[\w:.-]+@)?(" + "|".join(map(re.escape, REGISTRY)) + r")$")


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and _NAMED.match(node.value)]


_WORD = re.compile(r"(?<![\w.-])(?:[\w:.-]+@)?(" + "|".join(
    map(re.escape, sorted(REGISTRY, key=len, reverse=True))) + r")(?![\w-])")


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def _lists(path: Path) -> list[tuple[int, str]]:
    """Text (not a docstring, not an example command line) naming two backends or more."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            for line in node.value.splitlines():
                if "ccbench " not in line and len(set(_WORD.findall(line))) >= 2:
                    found.append((node.lineno, line.strip()))
    return found


def test_no_hand_written_list_of_backends() -> None:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("backends/") or relative in ALLOWED:
            continue
        hits = _lists(path)
        if hits:
            found[relative] = hits
    assert not found, f"lists of backends written by hand (make them from the registry): {found}"


def test_the_list_check_sees_a_list_in_an_fstring(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('x = 1\nhelp = f"comma list: gloo, mpi, {x}"\n'
                      'example = "ccbench launch -n 2 allreduce --backend gloo,mpi"\n')
    assert [line for _, line in _lists(module)] == ["comma list: gloo, mpi,"]


def test_no_backend_name_outside_backends() -> None:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("backends/") or relative in ALLOWED:
            continue
        hits = _literals(path)
        if hits:
            found[relative] = hits
    assert not found, f"backend names outside ccbench/backends/: {found}"


def test_the_allow_list_is_short_and_still_needed() -> None:
    assert list(ALLOWED) == ["backend_facts.py"], "a backend's facts belong in its entry"
    for relative in ALLOWED:
        assert _literals(ROOT / relative), f"{relative} names no backend any more: drop it"


def test_the_registry_is_its_data() -> None:
    """backends/ registers exactly the entries of backend_facts.py, and each class shows the
    display name its entry gives (reports read the entry; doctor asks the class)."""
    from ccbench.backend_facts import BACKENDS
    from ccbench.backends import PLUGINS, backend_class

    # the built-in part: an installed plugin adds its own entries after these
    plugins = {plugin.name for plugin in PLUGINS}
    assert [name for name in REGISTRY if name not in plugins] == list(BACKENDS)
    for name, facts in BACKENDS.items():
        assert REGISTRY[name] == facts.target
        module, _, cls = facts.target.partition(":")
        assert module.startswith("ccbench.backends.") and cls
    assert backend_class("mpi").display_name == BACKENDS["mpi"].display_name


def test_the_check_sees_a_name() -> None:
    assert _NAMED.match("gloo") and _NAMED.match("ring@mpi") and _NAMED.match("nccl-cupy")
    assert not _NAMED.match("global") and not _NAMED.match("mpiexec")
