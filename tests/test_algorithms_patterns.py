"""A computation algorithms/ knows is one entry of algorithms.patterns.PATTERNS: a new one
(an inclusive prefix reduction here) generates, verifies, runs and is checked against the
reference from that entry alone; a schedule whose buffers disagree with its pattern is
refused; the unit tables in the docs are PATTERNS'."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from algorithms import PATTERNS, Pattern, Schedule, Span, generate, verify
from algorithms import patterns as patterns_module
from algorithms.executor import Executor
from algorithms.kernels import OPS, NumpyReducer
from algorithms.reference import exact_inputs, reference
from algorithms.schedule import RoundBuilder
from algorithms.transport import run_threads

ROOT = Path(__file__).resolve().parent.parent


def _scan(inputs: Sequence[np.ndarray], combine, root: int) -> list[np.ndarray | None]:
    return [combine(inputs[:r + 1]) for r in range(len(inputs))]


SCAN = Pattern("scan", rooted=False, reduces=True, inplace="same", unit="count",
               send_units="1", recv_units="1", result=_scan)


def _chain_scan(p: int, segments: int = 1, own: bool = True) -> Schedule:
    """Rank r reduces segment j of r-1's prefix into its own and forwards it (own=False: it
    forwards r-1's prefix without adding its own, a wrong scan)."""
    b = RoundBuilder(p)
    b.copy(0, 0, Span("send", 0, segments), Span("recv", 0, segments))
    for r in range(p - 1):
        for j in range(segments):
            if own:
                b.transfer(r + j, r, r + 1, Span("recv", j, j + 1), reduce=True,
                           base=Span("send", j, j + 1))
            else:
                b.transfer(r + j, r, r + 1, Span("recv", j, j + 1))
    return Schedule("chain", "scan", p, segments, {"send": 1, "recv": 1}, b.steps(), 0,
                    segments)


@pytest.fixture
def scan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PATTERNS, "scan", SCAN)


@pytest.mark.parametrize("p", [1, 2, 5])
def test_a_new_pattern_verifies_from_its_entry(scan: None, p: int) -> None:
    for segments in (1, 3):
        for inplace in (False, True):
            result = verify(_chain_scan(p, segments), inplace)
            assert result.ok, str(result)


def test_the_verifier_holds_a_new_pattern_to_its_result(scan: None) -> None:
    result = verify(_chain_scan(4, own=False))
    assert not result.ok
    assert "rank 1: output block 0 missing r1.b0" in str(result)


def test_a_new_pattern_runs_against_its_reference(scan: None) -> None:
    p, unit, s = 5, 7, _chain_scan(5, 3)
    cases = [(np.dtype(dt), op) for dt in ("float32", "int8") for op in OPS]
    inputs = [exact_inputs("scan", op, p, unit, dt, seed=i) for i, (dt, op) in enumerate(cases)]

    def body(transport):
        ex = Executor(s, transport.rank, transport, reducer=NumpyReducer(), timeout=20)
        out = []
        for (dt, op), x in zip(cases, inputs, strict=True):
            recv = np.zeros(unit, dt)
            ex.run(x[transport.rank].copy(), recv, op)
            out.append(recv)
        return out

    results = run_threads(p, body, timeout=60)
    for i, (_, op) in enumerate(cases):
        want = reference("scan", inputs[i], op)
        for r in range(p):
            assert results[r][i].tobytes() == want[r].tobytes(), (op, r)
    # rank r's prefix, not everybody's: the reference is the pattern's
    x = [np.full(2, r + 1, np.int32) for r in range(4)]
    assert [list(y) for y in reference("scan", x, "sum")] == [[1, 1], [3, 3], [6, 6], [10, 10]]


def test_a_schedule_with_other_buffers_than_its_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match=r"ring allgather schedule at p=4 has units "
                                         r"\{'send': 1, 'recv': 1\}, but its pattern "
                                         r"'allgather' has \{'send': 1, 'recv': 4\}"):
        s = generate("ring", "allgather", 4)
        Schedule(s.algorithm, s.collective, 4, s.blocks_per_unit, {"send": 1, "recv": 1},
                 s.steps)


def test_an_unknown_pattern_has_no_reference() -> None:
    with pytest.raises(ValueError, match="no reference for pattern 'scan' "):
        reference("scan", [np.zeros(1)], "sum")


def _table(text: str) -> dict[str, tuple[str, str, str]]:
    """pattern -> (unit, send units, recv units) from a markdown table of the docs."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].split(" ")[0] in PATTERNS:
            unit = cells[1].split(" ")[0]
            rows[cells[0].split(" ")[0]] = (unit, *("-" if c in ("-", "–") else c
                                                    for c in cells[2:]))
    return rows


def test_the_documented_unit_tables_are_the_patterns() -> None:
    want = {p.name: (p.unit, p.send_units, p.recv_units) for p in PATTERNS.values()}
    assert _table(patterns_module.__doc__ or "") == want
    readme = (ROOT / "algorithms" / "README.md").read_text()
    assert _table(readme) == want, "algorithms/README.md's pattern table"


def test_the_documented_names_table_is_the_registry() -> None:
    """algorithms/README.md's "Names" table has a cell, and only then, for each (algorithm,
    collective) the registry holds: a new schedule fails here until it is described."""
    from algorithms import REGISTRY

    lines = (ROOT / "algorithms" / "README.md").read_text().split("## Names", 1)[1].splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in lines if line.startswith("|")]
    header, body = rows[0], rows[2:]
    described = {(row[0].strip("`"), collective) for row in body
                 for collective, cell in zip(header[1:], row[1:], strict=True) if cell}
    assert described == set(REGISTRY), (
        f"registered, not in the table: {sorted(set(REGISTRY) - described)}; "
        f"in the table, not registered: {sorted(described - set(REGISTRY))}")
