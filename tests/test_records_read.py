"""The one records reader: every command reads .jsonl, .jsonl.gz and folders alike, skips lines
that are not records with a count and file:line, and ends bad input with one error line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.commands.merge import merge_records
from ccbench.errors import UsageError
from ccbench.records import RecordKey, load_records, read_records

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "results" / "data"
FIXTURE = Path(__file__).parent / "fixtures" / "records-v1.jsonl"
GOOD_LINE = FIXTURE.read_text().splitlines()[0]


def _with(**changes: object) -> str:
    data = json.loads(GOOD_LINE)
    data.update(changes)
    return json.dumps(data)


# name -> (file name, bytes, what the skip reason says)
BAD_FILES: dict[str, tuple[str, bytes, str]] = {
    "not-utf8": ("garbage.jsonl", b"\xff\xfe\x00binary\x80\x81\n", "not UTF-8"),
    "gzip-garbage": ("garbage.jsonl.gz", b"\x1f\x8b\x08\x00garbage", "unreadable compressed"),
    "json-list": ("list.jsonl", b"[1,2]\n", "not a JSON object but list"),
    "json-number": ("number.jsonl", b"42\n", "not a JSON object but int"),
    "wrong-type": ("type.jsonl", (_with(time_us="fast") + "\n").encode(), "field 'time_us'"),
    "bool-for-int": ("bool.jsonl", (_with(world_size=True) + "\n").encode(), "field 'world_size'"),
    "other-json": ("other.jsonl", b'{"name": "x", "value": 1}\n', "not a ccbench record"),
    "missing-field": ("missing.jsonl",
                      (json.dumps({k: v for k, v in json.loads(GOOD_LINE).items()
                                   if k != "samples_us"}) + "\n").encode(), "missing field"),
    "csv": ("table.jsonl", b"a,b,c\n1,2,3\n", "not JSON"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_line_is_skipped_with_file_and_line(tmp_path: Path, name: str) -> None:
    filename, content, reason = BAD_FILES[name]
    path = tmp_path / filename
    path.write_bytes(content)
    records, report = read_records(path)
    assert records == []
    assert report.skipped and reason in report.skipped[0].reason
    assert str(report.skipped[0]).startswith(f"{path}:1: ")
    with pytest.raises(UsageError, match="no ccbench records"):
        load_records(path, require=True)


def test_good_records_survive_bad_lines_around_them(tmp_path: Path, capsys) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"42\n" + GOOD_LINE.encode() + b"\n\xff\n" + GOOD_LINE.encode()
                     + b"\n{\"schema\": \"ccbench.rec")
    records = load_records(path)
    assert len(records) == 2
    err = capsys.readouterr().err
    assert f"{path}:1: " in err and f"{path}:3: not UTF-8" in err
    assert f"{path}:5: torn last line" in err and "skipped 3 line(s)" in err


def test_gzip_and_folders(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    with gzip.open(tmp_path / "sub" / "a.jsonl.gz", "wt") as handle:
        handle.write(GOOD_LINE + "\n")
    (tmp_path / "b.jsonl").write_text(GOOD_LINE + "\n")
    (tmp_path / "notes.txt").write_text("not results\n")        # not picked up from a folder
    records, report = read_records([tmp_path])
    assert len(records) == 2 and len(report.files) == 2 and not report.skipped


def test_unknown_schema_version_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "new.jsonl"
    path.write_text(GOOD_LINE + "\n" + _with(schema_version=99) + "\n")
    with pytest.raises(UsageError, match=r"new.jsonl:2: unknown record schema version 99"):
        read_records(path)


def test_shipped_results_load_and_merge_keeps_every_record() -> None:
    records, report = read_records(SHIPPED)
    assert len(report.files) == len(list(SHIPPED.glob("*.jsonl.gz"))) >= 10
    assert not report.skipped and len(records) > 4000
    merged = merge_records(records)
    assert not merged.conflicts and merged.duplicates == 0
    assert len(merged.records) == len(records)
    # MPICH, Open MPI and Intel MPI ran the same cases: all three stay
    mpi = {r.library_version.split()[0] for r in merged.records if r.backend == "mpi"}
    assert len(mpi) >= 3, mpi
    assert len({RecordKey.of(r) for r in merged.records}) == len(records)


def _ccbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ccbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccbench: error: "), proc.stderr
    return lines[0]


# every command that reads records, each given a different bad file (subprocesses are slow)
COMMANDS = [
    ("report", "not-utf8", ["report", "{f}", "-o", "{d}/out"]),
    ("merge", "gzip-garbage", ["merge", "{f}", "-o", "{d}/merged.jsonl"]),
    ("calibrate", "json-list", ["calibrate", "{f}", "-o", "{d}/model.json"]),
    ("compare", "wrong-type", ["compare", "{f}", "{f}"]),
    ("export-chakra", "json-number", ["export", "chakra", "{f}", "-o", "{d}/et"]),
    ("simulate", "not-utf8", ["simulate", "{f}", "allreduce", "--sizes", "1K"]),
]


@pytest.mark.parametrize("command,bad,argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_gives_one_error_line(tmp_path: Path, command: str, bad: str,
                                            argv: list[str]) -> None:
    filename, content, _ = BAD_FILES[bad]
    path = tmp_path / filename
    path.write_bytes(content)
    proc = _ccbench(*[a.format(f=path, d=tmp_path) for a in argv], cwd=tmp_path)
    line = _one_error_line(proc)
    assert str(path) in line
    assert not (tmp_path / "merged.jsonl").exists() and not (tmp_path / "model.json").exists()


def test_a_skipped_line_is_counted_on_stderr_and_the_rest_used(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b"[1,2]\n" + GOOD_LINE.encode() + b"\n")
    proc = _ccbench("merge", str(path), "-o", str(tmp_path / "m.jsonl"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"skipped {path}:1: not a JSON object" in proc.stderr
    assert "1 records in, 1 written" in proc.stderr


def test_calibrate_finds_the_shipped_records(tmp_path: Path) -> None:
    proc = _ccbench("calibrate", str(SHIPPED / "gloo-n2.jsonl.gz"), str(SHIPPED / "gloo-n4.jsonl.gz"),
                    "-o", str(tmp_path / "model.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "from 426 records" in proc.stdout
