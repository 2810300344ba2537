"""The house rules as tests: ruff (the project's rule set) and mypy (the project's
configuration, pyproject.toml) pass on the whole tree. Both tools are pinned in the test extra
because new releases add rules; under CI a missing tool fails instead of skipping."""

from __future__ import annotations

import ast
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


#: public functions and methods that take or return `dict[str, Any]` (or Mapping[str, Any])
#: because the shape is open: path::qualified name -> why. Anything else with a known shape
#: says so in its type (a TypedDict, a dataclass or a NamedTuple).
OPEN_SHAPED = {
    "ccbench/backends/base.py::found_or_why":
        "a library's facts: each Library's probe names its keys (a plugin's too)",
    "ccbench/backends/buffers.py::DeviceBuffer.__cuda_array_interface__":
        "the CUDA Array Interface as CuPy gives it (its version decides the keys)",
    "ccbench/backends/options.py::BackendOptions.from_mapping":
        "an older caller's plain dict, checked there against the fields",
    "ccbench/bench/options.py::method_record":
        "a method block: its keys are the registry of options (BENCH_OPTIONS)",
    "ccbench/bench/options.py::method_from": "{option name: value}: the registry of options",
    "ccbench/bench/options.py::add_options": "{option name: default}: the registry of options",
    "ccbench/bench/options.py::check_flags": "{option name: value}: the registry of options",
    "ccbench/bench/options.py::conflict": "{option name: value}: the registry of options",
    "ccbench/bench/options.py::option_argv": "{option name: value}: the registry of options",
    "ccbench/bench/options.py::measured_variant":
        "a record's method block: its keys are the registry of options",
    "ccbench/formats/chakra.py::classes":
        "the installed Chakra schema's protobuf classes, by message name",
    "ccbench/formats/chakra.py::write_trace": "GlobalMetadata attributes the caller names",
    "ccbench/formats/chakra.py::node_attrs": "a node's attributes, whichever the trace gives",
    "ccbench/records/table.py::flat_row":
        "a record's flat row: the columns come from the records' method and environment",
    "ccbench/report/__init__.py::build_report": "a model file as report.model.load reads it",
    "ccbench/report/model.py::load":
        "read forgivingly: without ccbench.model a model file is unchecked JSON",
    "ccbench/report/model.py::predictions": "a model file as load reads it",
    "ccbench/report/paper.py::rc_for": "matplotlib rc parameters",
    "ccbench/run/control.py::ControlServer.snapshot":
        "the control store's contents: key -> whatever JSON a rank set under it",
    "ccbench/run/control.py::ControlClient.prefix":
        "the control store's keys under a prefix -> whatever JSON a rank set under each",
    "ccbench/run/storehost.py::unexplained_end": "the control store's contents (snapshot)",
    "ccbench/sweep/spec.py::Sweep.to_dict":
        "a sweep file: its keys include the registry of options (BENCH_KEYS)",
    "ccbench/sweep/spec.py::sweep_from_dict": "a sweep file's YAML before it is checked",
}

_MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping"}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):       # typing.Any, typing.Mapping
        return node.attr
    return None


def _open_dict(annotation: ast.expr | None) -> bool:
    """Whether an annotation holds dict[str, Any] (or Mapping[str, Any]) anywhere: in a union,
    a list, a tuple, a Callable, a quoted annotation."""
    import ast

    if annotation is None:
        return False
    for node in ast.walk(annotation):  # type: ignore[arg-type]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if _open_dict(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:
                continue
        if isinstance(node, ast.Subscript) and _name(node.value) in _MAPPINGS \
                and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2 \
                and _name(node.slice.elts[0]) == "str" and _name(node.slice.elts[1]) == "Any":
            return True
    return False


def open_shaped(source: str, path: str) -> dict[str, list[str]]:
    """path::qualified name -> its arguments (and `return`) typed dict[str, Any], for every
    public function and method: no leading underscore (dunders count), in no private class
    or function."""
    found: dict[str, list[str]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and not node.name.endswith("__"):
                    continue
                a = node.args
                args = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg,
                                                                               a.kwarg))]
                bad = [x.arg for x in args if _open_dict(x.annotation)]
                bad += ["return"] if _open_dict(node.returns) else []
                if bad:
                    found[f"{path}::{prefix}{node.name}"] = bad
                visit(node.body, f"{prefix}{node.name}.")     # a callback defined inside
    visit(ast.parse(source).body, "")
    return found


def test_the_open_shape_check_sees_a_new_case() -> None:
    planted = ("from typing import Any\n"
               "class Result:\n"
               "    def to_json(self) -> 'dict[str, Any] | None': ...\n"
               "    def _private(self, x: dict[str, Any]) -> None: ...\n"
               "def load(path: str, extra: list[dict[str, Any]]) -> int: ...\n"
               "def table(rows: dict[str, int], more: Mapping[str, typing.Any]) -> None: ...\n"
               "def main() -> None:\n"
               "    def replan(world: dict[str, Any] | None) -> int: ...\n"
               "class _Hidden:\n"
               "    def to_json(self) -> dict[str, Any]: ...\n")
    assert open_shaped(planted, "x.py") == {"x.py::Result.to_json": ["return"],
                                             "x.py::load": ["extra"],
                                             "x.py::table": ["more"],
                                             "x.py::main.replan": ["world"]}


def test_no_new_public_interface_is_an_untyped_dict() -> None:
    """A public function's or method's argument or return of a known shape is a TypedDict,
    a dataclass or a NamedTuple; `dict[str, Any]` only where the shape is open (OPEN_SHAPED,
    each with why). An entry no longer needed leaves the list too."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "ccbench").rglob("*.py")):
        found.update(open_shaped(path.read_text(), path.relative_to(ROOT).as_posix()))
    new = {name: where for name, where in found.items() if name not in OPEN_SHAPED}
    assert not new, f"dict[str, Any] in a public interface (type it, or say why in OPEN_SHAPED): {new}"
    stale = sorted(set(OPEN_SHAPED) - set(found))
    assert not stale, f"OPEN_SHAPED names what no longer takes or returns dict[str, Any]: {stale}"
