"""Hostile and broken input (issue 29): JSON nested 100,000 deep, impossible record values, a
Chakra trace of NUL bytes, a decompression bomb, a trace too large for memory and a YAML alias
bomb each end the command with one `ccbench: error:` line and exit 2, before memory or the
stack runs out."""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from pathlib import Path

import pytest
from conftest import run_ccbench, run_ccbench_forked

from ccbench.errors import UsageError
from ccbench.formats import load_trace
from ccbench.formats.chakra import comm_coll_node, read_trace, write_trace
from ccbench.records import load_records, read_records
from ccbench.safeio import MAX_JSON_DEPTH, check_json_depth, load_json, load_yaml, read_input
from ccbench.sweep import load_sweep

FIXTURE = Path(__file__).parent / "fixtures" / "records-v1.jsonl"
GOOD = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
DEEP = "[" * 100_000 + "]" * 100_000


def _one_error_line(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("ccbench: error: "), done.stderr[-2000:]
    return lines[0]


def fit_records(path: Path) -> Path:
    """A synthetic allreduce at several sizes, alpha 5 us, beta 1 ns/B: records to calibrate."""
    lines = []
    for size in (1 << k for k in range(10, 20)):
        rec = json.loads(json.dumps(GOOD[0]))
        time_us = 5.0 + size / 1e3
        rec.update(size_asked=size, size_used=size, count=size // 4,
                   samples_us=[time_us * f for f in (0.98, 1.0, 1.02)],
                   rank_median_us=[time_us, time_us])
        rec["time_us"].update(median=time_us, min=time_us * 0.98, max=time_us * 1.02,
                              mean=time_us, p5=time_us * 0.98, p95=time_us * 1.02)
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


def _model(tmp_path: Path) -> Path:
    """A model calibrated from a synthetic allreduce at several sizes."""
    records = fit_records(tmp_path / "fit.jsonl")
    model = tmp_path / "model.json"
    done = run_ccbench("calibrate", str(records), "-o", str(model))
    assert done.returncode == 0, done.stderr
    return model


# -- JSON nested 100,000 deep ------------------------------------------------------------------

def test_depth_check_names_the_line_and_ignores_brackets_in_strings() -> None:
    text = b'{"a": "[[[[[[[[[[", "b": 1}\n' * 3 + b"[" * (MAX_JSON_DEPTH + 1) + b"\n"
    with pytest.raises(UsageError, match=r"^f:4: JSON nested more than 100 levels"):
        check_json_depth(text, "f")
    check_json_depth(b'["' + b"[" * 500 + b'"]', "f")        # all inside one string
    check_json_depth(b'["\\"' + b"[" * 500 + b'"]', "f")    # an escaped quote inside it
    check_json_depth(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, "f")


@pytest.mark.parametrize("command", ["report", "compare", "merge", "calibrate", "replay",
                                     "simulate-trace", "report-model", "simulate-model"])
def test_json_nested_100000_deep_is_one_line(tmp_path: Path, command: str) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(FIXTURE.read_text())
    deep_records = tmp_path / "deep.jsonl"
    deep_records.write_text(FIXTURE.read_text() + DEEP + "\n")
    deep_json = tmp_path / "deep.json"
    deep_json.write_text(DEEP)
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "rank0.json").write_text('{"nodes": ' + DEEP + "}")
    model = _model(tmp_path) if command == "simulate-trace" else tmp_path / "none.json"
    argv = {
        "report": ["report", str(deep_records), "-o", str(tmp_path / "fig")],
        "compare": ["compare", str(good), str(deep_records)],
        "merge": ["merge", str(deep_records), "-o", str(tmp_path / "m.jsonl")],
        "calibrate": ["calibrate", str(deep_records), "-o", str(tmp_path / "c.json")],
        "replay": ["replay", str(trace)],
        "simulate-trace": ["simulate", str(model), "--trace", str(trace)],
        "report-model": ["report", str(good), "--model", str(deep_json), "-o",
                         str(tmp_path / "fig")],
        "simulate-model": ["simulate", str(deep_json), "allreduce"],
    }[command]
    line = _one_error_line(run_ccbench_forked(*argv))
    assert "JSON nested more than 100 levels deep" in line
    assert ("deep.jsonl:3:" in line) or ("rank0.json:1:" in line) or ("deep.json:1:" in line)


def test_a_deep_process_group_table_inside_a_trace_is_ignored(tmp_path: Path) -> None:
    """The process-group table is JSON inside a string of the trace: a deep one is skipped as
    a malformed one is, never decoded."""
    node = {"id": 1, "name": "## process_group:init ##", "ctrl_deps": 0,
            "inputs": {"values": [DEEP], "shapes": [[]], "types": ["String"]},
            "outputs": {"values": [], "shapes": [], "types": []}, "attrs": []}
    (tmp_path / "rank0.json").write_text(json.dumps(
        {"schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "x", "start_ts": 1, "nodes": [node]}))
    trace = load_trace([tmp_path / "rank0.json"])            # no RecursionError
    assert trace.world_size == 1 and [g.name for g in trace.groups] == ["world"]


# -- impossible record values ---------------------------------------------------------------

def _records_with(tmp_path: Path, name: str, change) -> Path:
    out = []
    for rec in GOOD:
        rec = json.loads(json.dumps(rec))
        change(rec)
        out.append(json.dumps(rec))
    path = tmp_path / f"{name}.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def _times(value: float):
    def change(rec: dict) -> None:
        rec["samples_us"] = [value] * len(rec["samples_us"])
        rec["rank_median_us"] = [value] * len(rec["rank_median_us"])
        rec["time_us"] = {k: value for k in rec["time_us"]}
    return change


BAD_VALUES = {
    "negative-times": (_times(-2.0), "time_us median holds -2.0"),
    "zero-times": (_times(0.0), "time_us median holds 0.0"),
    "huge-times": (_times(1e308), "time_us median holds 1e+308"),
    "tiny-times": (_times(1e-300), "time_us median holds 1e-300"),
    "one-negative-sample": (lambda r: r["samples_us"].__setitem__(1, -1.0), "samples_us holds"),
    "nan-rank-median": (lambda r: r["rank_median_us"].__setitem__(0, math.nan),
                        "rank_median_us holds nan"),
    "size-1e30": (lambda r: r.update(size_asked=10**30, size_used=10**30), "size_asked is"),
    "negative-count": (lambda r: r.update(count=-1), "count is -1"),
    "negative-iterations": (lambda r: r.update(iterations=-3), "iterations is -3"),
    "negative-wrong": (lambda r: r.update(wrong=-1), "wrong is -1"),
    "infinite-bandwidth": (lambda r: r.update(busbw_gbps=math.inf), "busbw_gbps is inf"),
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_impossible_record_values_name_file_and_line(tmp_path: Path, name: str) -> None:
    change, says = BAD_VALUES[name]
    path = _records_with(tmp_path, name, change)
    with pytest.raises(UsageError, match=f"^{re.escape(f'{path}:1: {says}')}"):
        read_records(path)


@pytest.mark.parametrize(("command", "bad"), [("compare", "huge-times"),
                                              ("compare", "negative-times"),
                                              ("compare", "zero-times"),
                                              ("compare", "tiny-times"),
                                              ("calibrate", "zero-times"),
                                              ("calibrate", "huge-times"),
                                              ("report", "size-1e30"),
                                              ("merge", "negative-times")])
def test_commands_refuse_impossible_records_with_one_line(tmp_path: Path, command: str,
                                                          bad: str) -> None:
    path = _records_with(tmp_path, bad, BAD_VALUES[bad][0])
    good = tmp_path / "good.jsonl"
    good.write_text(FIXTURE.read_text())
    argv = {"compare": ["compare", str(good), str(path)],
            "calibrate": ["calibrate", str(path), "-o", str(tmp_path / "m.json")],
            "report": ["report", str(path), "-o", str(tmp_path / "fig")],
            "merge": ["merge", str(path), "-o", str(tmp_path / "m.jsonl")]}[command]
    line = _one_error_line(run_ccbench_forked(*argv))
    assert f"{path}:1: " in line and "(a damaged or forged record)" in line
    assert "inf" not in line.replace("info", "")


def test_parquet_rows_are_validated_too(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from dataclasses import replace

    from ccbench.records import write_records

    good = load_records(FIXTURE)
    bad = replace(good[1], time_us={**good[1].time_us, "median": -1.0})
    path = tmp_path / "r.parquet"
    write_records(path, [good[0], bad])
    with pytest.raises(UsageError, match=r"r.parquet: row 2: time_us median holds -1.0"):
        read_records(path)


def test_report_draws_sizes_at_the_largest_accepted(tmp_path: Path) -> None:
    """The boundary of the size check (2^50 bytes) is one matplotlib can draw."""
    pytest.importorskip("matplotlib")
    path = _records_with(tmp_path, "max", lambda r: r.update(
        size_asked=(1 << 50) - r["size_used"], size_used=(1 << 50) - r["size_used"],
        count=((1 << 50) - r["size_used"]) // 4))
    done = run_ccbench("report", str(path), "-o", str(tmp_path / "fig"))
    assert done.returncode == 0, done.stderr[-2000:]


def test_plausible_records_still_read() -> None:
    assert len(load_records(FIXTURE, require=True)) == 2


# -- bounded reads: record lines, gzip bombs --------------------------------------------------

def _gzip_of_zeros(path: Path, inflated: int) -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    with open(path, "wb") as out:
        for _ in range(inflated // len(block)):
            out.write(packer.compress(block))
        out.write(packer.flush())


def test_gzip_bomb_stops_at_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = tmp_path / "bomb.0.et.gz"
    _gzip_of_zeros(bomb, 64 << 20)
    monkeypatch.setenv("CCBENCH_MAX_INPUT_BYTES", str(8 << 20))
    with pytest.raises(UsageError, match=r"inflates to more than 8 MiB, the input cap .* "
                                         r"CCBENCH_MAX_INPUT_BYTES"):
        read_input(bomb)
    with pytest.raises(UsageError, match="inflates to more than 8 MiB"):
        load_trace([bomb])


def test_records_gzip_bomb_of_blank_lines_stops_at_the_cap(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb") as out:
        out.write(FIXTURE.read_bytes() + b"\n" * (16 << 20))
    monkeypatch.setenv("CCBENCH_MAX_INPUT_BYTES", str(4 << 20))
    monkeypatch.setenv("CCBENCH_MAX_INPUT_LINES", str(1 << 30))    # the byte cap, not lines
    with pytest.raises(UsageError, match=r"bomb.jsonl.gz: inflates to more than 4 MiB"):
        read_records(bomb)


def test_a_line_without_end_is_refused_at_the_line_limit(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import ccbench.safeio

    monkeypatch.setattr(ccbench.safeio, "MAX_LINE_BYTES", 1 << 16)
    path = tmp_path / "long.jsonl"
    path.write_bytes(FIXTURE.read_bytes() + b"x" * (1 << 17))
    with pytest.raises(UsageError, match=r"long.jsonl:3: a line longer than 64 KiB"):
        read_records(path)


def test_model_file_too_large_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.json"
    path.write_text('{"fits": [' + ", ".join(["1"] * 100_000) + "]}")
    monkeypatch.setenv("CCBENCH_MAX_INPUT_BYTES", "1000")
    with pytest.raises(UsageError, match="is more than 1000 B, the input cap"):
        load_json(path)


# -- Chakra traces: NUL bytes, empty, truncated, too large for memory ------------------------

@pytest.mark.parametrize(("content", "says"), [
    (b"\0" * (1 << 20), "empty message at byte 0"),
    (b"", "empty Chakra trace"),
    (b"\x05ab", "truncated Chakra trace"),
    (b"\x02\x08\x01", "names no version"),
])
def test_chakra_garbage_is_refused(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "t.0.et"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=says):
        load_trace([path])


def test_chakra_file_of_nul_bytes_is_one_line_in_simulate(tmp_path: Path) -> None:
    trace = tmp_path / "nulls.0.et"
    trace.write_bytes(b"\0" * (1 << 20))
    line = _one_error_line(run_ccbench_forked("simulate", str(_model(tmp_path)), "--trace",
                                              str(trace)))
    assert "not a Chakra trace (an empty message at byte 0)" in line


def _chakra(folder: Path, ranks: int, nodes: int) -> Path:
    folder.mkdir()
    body = [comm_coll_node(i, "", "allreduce", 4096) for i in range(nodes)]
    for rank in range(ranks):
        write_trace(folder / f"w.{rank}.et", body)
    return folder


def test_real_chakra_trace_still_reads(tmp_path: Path) -> None:
    folder = _chakra(tmp_path / "t", 1, 5)
    meta, nodes = read_trace(folder / "w.0.et")
    assert meta.version == "0.0.4" and len(nodes) == 5


def test_trace_larger_than_memory_is_refused_up_front(tmp_path: Path) -> None:
    """A trace whose parsed form exceeds the memory available (here set to 1 MB) is refused
    before it is parsed, naming the limit and how to raise it; replay counts the launcher
    and every rank, which each read it."""
    folder = _chakra(tmp_path / "t", 2, 2000)          # ~20 KB a rank: ~0.8 MB parsed
    env = {"CCBENCH_TRACE_MEMORY": str(1 << 20)}
    line = _one_error_line(run_ccbench("simulate", str(_model(tmp_path)), "--trace",
                                       str(folder), env=env))
    assert "needs about" in line and "more than the 1 MiB available" in line
    assert "CCBENCH_TRACE_MEMORY" in line
    line = _one_error_line(run_ccbench("launch", "-n", "2", "replay", str(folder), env=env))
    assert "read by 3 processes" in line and "CCBENCH_TRACE_MEMORY" in line


# -- YAML alias bombs -------------------------------------------------------------------------

# nine levels of nine aliases (9^9 strings once expanded), anchored inside the key itself
_LEVELS = ['&a0 ["1K"]'] + [f"&a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)] \
    + [f"[{', '.join(['*a8'] * 9)}]"]
BOMBS = {"sizes": f"sizes: [{', '.join(_LEVELS)}]",
         "env": f"env: {{X: [{', '.join(_LEVELS)}]}}"}


@pytest.mark.parametrize("where", sorted(BOMBS))
def test_yaml_alias_bomb_in_a_sweep_is_refused(tmp_path: Path, where: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(f"name: bomb\ncollectives: [allreduce]\nbackends: [gloo]\n{BOMBS[where]}\n")
    with pytest.raises(UsageError, match=r"bomb.yaml: YAML aliases expand to more than 100,000"):
        load_sweep(path)
    line = _one_error_line(run_ccbench_forked("sweep", str(path), "--dry-run", timeout=60))
    assert "alias bomb" in line


def test_yaml_recursive_alias_and_deep_nesting_are_refused() -> None:
    with pytest.raises(UsageError, match="recursive aliases"):
        load_yaml("f", "a: &a [1, *a]\n")
    with pytest.raises(UsageError, match="nested too deep"):
        load_yaml("f", "[" * 100_000 + "]" * 100_000)


def test_yaml_with_a_few_aliases_still_loads() -> None:
    assert load_yaml("f", "base: &b {X: 1}\none: *b\ntwo: *b\n") == {
        "base": {"X": 1}, "one": {"X": 1}, "two": {"X": 1}}
