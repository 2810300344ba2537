"""Records survive concurrent appenders and torn tails (issue 29): every append is one write
under the file's flock, and the cut of a torn last line takes the same lock, so a record being
appended by another ccbench is never taken for a torn one; a failed write leaves whole lines."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_ccbench

import ccbench.records.writer as writer
from ccbench.formats.chakra import comm_coll_node, write_trace
from ccbench.records import append_record, cut_torn_tail, read_records, record_from_dict

FIXTURE = Path(__file__).parent / "fixtures" / "records-v1.jsonl"
RECORD = record_from_dict(json.loads(FIXTURE.read_text().splitlines()[0]))

# one appender: `count` records of ~`samples` x 8 bytes each (big lines take many writes of a
# buffered file, the window the cutter hit)
_WRITER = """
import json, sys
from ccbench.records import append_record, record_from_dict
data = json.loads(open(sys.argv[1]).read().splitlines()[0])
for i in range(int(sys.argv[3])):
    data["samples_us"] = [1.0 + (i % 7)] * int(sys.argv[4])
    data["run_id"] = f"{sys.argv[5]}-{i}"
    append_record(sys.argv[2], record_from_dict(data))
"""
# the cutter, as `ccbench sweep` runs it between cases, over and over until told to stop
_CUTTER = """
import os, sys
from ccbench.records import cut_torn_tail
cut = 0
while not os.path.exists(sys.argv[2]):
    cut += cut_torn_tail(sys.argv[1], aside=sys.argv[1] + ".torn")
print(cut)
"""


def test_concurrent_appenders_and_a_cutter_lose_no_record(tmp_path: Path) -> None:
    """The issue's case: 40 complete records written by four appenders while a cutter runs
    cut_torn_tail in a loop; every record must be in the file, none in .torn."""
    path, stop = tmp_path / "r.jsonl", tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cutter = subprocess.Popen([sys.executable, "-c", _CUTTER, str(path), str(stop)], env=env,
                              stdout=subprocess.PIPE, text=True)
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(FIXTURE), str(path), "10",
                                 "40000", f"w{w}"], env=env) for w in range(4)]
    try:
        assert [w.wait(timeout=300) for w in writers] == [0, 0, 0, 0]
    finally:
        stop.touch()
        out, _ = cutter.communicate(timeout=60)
    assert cutter.returncode == 0 and out.strip() == "0"          # nothing was taken as torn
    assert not (tmp_path / "r.jsonl.torn").exists()
    records, report = read_records(path)
    assert not report.skipped
    assert sorted(r.run_id for r in records) == sorted(f"w{w}-{i}" for w in range(4)
                                                       for i in range(10))


def test_append_moves_a_torn_tail_aside_first(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(RECORD.to_json().encode() + b'\n{"schema":"ccbench.rec')
    assert append_record(path, RECORD) == len(b'{"schema":"ccbench.rec')
    assert (tmp_path / "r.jsonl.torn").read_bytes() == b'{"schema":"ccbench.rec\n'
    records, report = read_records(path)
    assert len(records) == 2 and not report.skipped
    assert append_record(path, RECORD) == 0                      # nothing torn: nothing moved


def test_a_full_disk_leaves_no_partial_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    path = tmp_path / "r.jsonl"
    append_record(path, RECORD)
    before = path.read_bytes()

    def half_then_full(fd: int, data: bytes) -> int:
        if len(data) > 10:
            return os.write(fd, data[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "_write", half_then_full)
    with pytest.raises(OSError) as raised:
        append_record(path, RECORD)
    assert raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == before                            # the half line was cut


def test_cut_torn_tail_waits_for_an_append_in_progress(tmp_path: Path) -> None:
    """A writer holding the lock mid-record (its line not yet ended): the cutter waits for it
    instead of cutting the record."""
    import fcntl

    path = tmp_path / "r.jsonl"
    path.write_bytes(b"whole\n")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"half of a rec")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cutter = subprocess.Popen([sys.executable, "-c", "import sys; from ccbench.records import "
                               "cut_torn_tail; print(cut_torn_tail(sys.argv[1]))", str(path)],
                              env=env, stdout=subprocess.PIPE, text=True)
    with pytest.raises(subprocess.TimeoutExpired):
        cutter.wait(timeout=3)                                    # blocked on the lock
    os.write(fd, b"ord\n")
    os.close(fd)
    out, _ = cutter.communicate(timeout=60)
    assert out.strip() == "0" and path.read_bytes() == b"whole\nhalf of a record\n"


def test_cut_torn_tail_still_cuts_a_real_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"whole\ncut short")
    assert cut_torn_tail(path, aside=tmp_path / "aside") == len(b"cut short")
    assert path.read_bytes() == b"whole\n" and (tmp_path / "aside").read_bytes() == b"cut short\n"
    assert cut_torn_tail(tmp_path / "missing") == 0


def test_replay_moves_a_torn_tail_aside_like_the_benchmark(tmp_path: Path) -> None:
    folder = tmp_path / "trace"
    folder.mkdir()
    for rank in range(2):
        write_trace(folder / f"w.{rank}.et", [comm_coll_node(0, "ar", "allreduce", 4096)])
    out = tmp_path / "r.jsonl"
    out.write_bytes(RECORD.to_json().encode() + b'\n{"schema":"ccbench.rec')
    done = run_ccbench("launch", "-n", "2", "replay", str(folder), "--iters", "2", "--output",
                       str(out), "--quiet", timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "was moved to" in done.stderr and ".torn" in done.stderr
    assert (tmp_path / "r.jsonl.torn").read_bytes() == b'{"schema":"ccbench.rec\n'
    records, report = read_records(out)
    assert len(records) >= 2 and not report.skipped
