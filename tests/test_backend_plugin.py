"""A new backend is its module plus one registry line: a backend class defined here and
registered by name alone is listed by `ccbench doctor` with its own display name, verdict,
version and library, and runs a collective in this process (world size 1) with every
element checked."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ccbench.backends import REGISTRY
from ccbench.backends.base import Backend, Library, library_line
from ccbench.records import load_records

NAME = "copyonly"


def _facts() -> dict[str, Any]:
    return {"found": True, "version": "1.2.3"}


class CopyOnlyBackend(Backend):
    """One rank's allreduce and broadcast, done by numpy (all a world of one needs)."""

    name = NAME
    display_name = "Copy-only (numpy, one rank)"
    libraries = (Library("copylib", _facts, lambda facts: [library_line("copylib",
                                                                        facts["version"])]),)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    @classmethod
    def probe_version(cls) -> str | None:
        return "copylib 1.2.3"

    def info(self) -> dict[str, Any]:
        return {"library": "copylib", "library_version": "1.2.3", "device": "cpu", "env": {}}

    def _allreduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return functools.partial(np.copyto, recv, send)

    def _broadcast(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return lambda: None

    builders = {"allreduce": _allreduce, "broadcast": _broadcast}
    lacks = {"alltoall": "a world of one is all this backend knows"}

    def barrier(self) -> None:
        return None


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line a new backend adds to ccbench/backends/__init__.py."""
    monkeypatch.setitem(REGISTRY, NAME, f"{__name__}:CopyOnlyBackend")


def test_doctor_lists_it_from_its_own_answers(registered: None) -> None:
    from ccbench.commands.doctor import collect, render_table

    report = collect()
    rows = {row["name"]: row for row in report["backends"]}
    assert rows[NAME] == {"name": NAME, "kind": "library", "display": "Copy-only (numpy, one rank)",
                          "available": True, "reason": None, "version": "copylib 1.2.3"}
    assert report["libraries"]["copylib"] == {"found": True, "version": "1.2.3"}
    table = render_table(report)
    assert any(line.split()[:2] == [NAME, "Copy-only"] and " available    copylib 1.2.3"
               in line for line in table.splitlines()), table
    assert "  copylib  1.2.3" in table.splitlines()


def test_a_collective_runs_through_it_in_process(registered: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.cli import main

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CCBENCH_CONTROL", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "r.jsonl"
    assert main(["allreduce", "--backend", NAME, "--sizes", "8,1K", "-q", "--iters", "2",
                 "--warmup", "1", "--output", str(out)]) == 0
    records = load_records(out)
    assert {(r.backend, r.library, r.collective) for r in records} == {
        (NAME, "copylib", "allreduce")}
    assert len(records) == 4 and all(r.wrong == 0 for r in records)   # 2 sizes x 2 modes
