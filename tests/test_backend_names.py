"""A backend is one module under ccbench/backends/ that owns what it can do (availability,
version, display name, libraries, default device, the options it reads, its point-to-point
transport, its sub-communicators, whether it carries the algorithms): no other
module names a backend in a string literal, except the registry's data (ccbench/backend_facts.py,
which imports nothing so that report/ and model/ may read it). Checked on the source, every
string constant."""

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
    from ccbench.backends import backend_class

    assert list(REGISTRY) == list(BACKENDS)
    for name, facts in BACKENDS.items():
        assert REGISTRY[name] == facts.target
        module, _, cls = facts.target.partition(":")
        assert module.startswith("ccbench.backends.") and cls
    assert backend_class("mpi").display_name == BACKENDS["mpi"].display_name


def test_the_check_sees_a_name() -> None:
    assert _NAMED.match("gloo") and _NAMED.match("ring@mpi") and _NAMED.match("nccl-cupy")
    assert not _NAMED.match("global") and not _NAMED.match("mpiexec")
