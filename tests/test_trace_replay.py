"""`ccbench replay` on traces made by real PyTorch runs, started by `ccbench launch`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ccbench.formats import load_trace
from ccbench.records import load_records
from tests.conftest import have_mpi, run_ccbench


def _replay(nprocs: int, *args: str) -> tuple[str, str]:
    done = run_ccbench("launch", "-n", str(nprocs), "replay", *args, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout, done.stderr


def test_two_process_groups_replay_on_gloo_as_sub_communicators(traces4: Path,
                                                                 tmp_path: Path) -> None:
    out, summary = tmp_path / "rec.jsonl", tmp_path / "summary.json"
    stdout, _ = _replay(4, str(traces4 / "groups"), "--backend", "gloo", "-O", str(out),
                        "--summary", str(summary), "--iters", "2", "--repeat", "1")
    trace = load_trace([traces4 / "groups"])
    records = load_records(out)
    # a record carries the node id of the call on its group's first rank
    calls = {op.call: op for op in trace.all_ops() if op.group and op.rank == op.group.ranks[0]}
    assert len(records) == len(calls) == 13            # tp: 2 groups x 4 calls, dp: 2 x 2, 1
    for rec in records:
        tag = rec.method["trace"]
        op = calls[tag["call"]]
        assert tag["node_id"] == op.node_id and tag["group"] == list(op.group.ranks)
        assert rec.world_size == len(tag["group"]) and rec.wrong == 0
        assert rec.collective == op.collective and rec.size_used == op.size
    assert sorted(r.world_size for r in records).count(2) == 12
    data = json.loads(summary.read_text())
    backend = data["backends"][0]
    assert backend["backend"] == "gloo" and backend["summary"]["measured"] == 13
    assert "whole sequence (back-to-back)" in stdout


@pytest.mark.skipif(not have_mpi(), reason="mpiexec is not installed")
def test_three_ranks_two_backends_say_which_is_faster(traces3: Path, tmp_path: Path) -> None:
    stdout, _ = _replay(3, str(traces3 / "ddp"), "--backend", "mpi,ring@mpi", "--iters", "2",
                        "--repeat", "2", "-O", str(tmp_path / "r.jsonl"))
    records = load_records(tmp_path / "r.jsonl")
    assert {r.backend for r in records} == {"mpi", "ring@mpi"}
    assert all(r.wrong == 0 and r.world_size == 3 for r in records)
    assert "replays this trace" in stdout and "x faster than" in stdout


def test_ops_beyond_the_five_replayed_or_skipped_with_reason(traces4: Path,
                                                             tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    _replay(4, str(traces4 / "p2p"), "--backend", "gloo", "--iters", "2", "--repeat", "1",
            "--summary", str(summary))
    ops = json.loads(summary.read_text())["backends"][0]["ops"]
    by_name = {op["collective"]: op for op in ops}
    assert by_name["barrier"]["time_us"] > 0 and by_name["sendrecv"]["wrong"] == 0
    for name in ("reduce", "gather", "scatter"):  # collectives of the registry: measured
        assert by_name[name]["wrong"] == 0, name
    for name in ("broadcast", "allgather", "barrier", "sendrecv", "reduce", "gather", "scatter"):
        assert by_name[name]["time_us"] is not None, name
    for name, op in by_name.items():
        assert (op["time_us"] is not None) != bool(op["reason"]), name


# -- bad input: one line, exit 2, naming the file and node ------------------------------------

def _bad(tmp_path: Path, source: Path, edit) -> Path:        # noqa: ANN001  (a callable)
    folder = tmp_path / "bad"
    shutil.copytree(source, folder)
    edit(folder)
    return folder


def _refused(folder: Path, *expect: str) -> None:
    done = run_ccbench("launch", "-n", "4", "replay", str(folder))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccbench: error: "), done.stderr
    for text in expect:
        assert text in lines[0], lines[0]


def test_unknown_schema_version(traces4: Path, tmp_path: Path) -> None:
    def edit(folder: Path) -> None:
        path = folder / "rank2.json"
        data = json.loads(path.read_text())
        data["schema"] = "9.0.0"
        path.write_text(json.dumps(data))
    _refused(_bad(tmp_path, traces4 / "tp", edit), "rank2.json", "'9.0.0'", "schema")


def test_truncated_json(traces4: Path, tmp_path: Path) -> None:
    def edit(folder: Path) -> None:
        path = folder / "rank1.json"
        path.write_text(path.read_text()[: 5000])
    _refused(_bad(tmp_path, traces4 / "tp", edit), "rank1.json", "truncated JSON",
             "observer.unregister_callback()")


def _drop_first(name: str):                                   # noqa: ANN202
    def edit(folder: Path) -> None:
        path = folder / "rank3.json"
        data = json.loads(path.read_text())
        first = next(n for n in data["nodes"] if n["name"] == name)
        data["nodes"].remove(first)
        path.write_text(json.dumps(data))
    return edit


def test_ranks_whose_sequences_disagree(traces4: Path, tmp_path: Path) -> None:
    folder = _bad(tmp_path, traces4 / "tp", _drop_first("c10d::_allgather_base_"))
    _refused(folder, "op sequences disagree", "rank3.json, node ", "rank 3's op")


def test_size_not_divisible_by_the_group(traces4: Path, tmp_path: Path) -> None:
    def edit(folder: Path) -> None:
        for rank in range(4):
            path = folder / f"rank{rank}.json"
            data = json.loads(path.read_text())
            node = next(n for n in data["nodes"] if n["name"] == "c10d::_allgather_base_")
            node["inputs"]["values"][0][3] = 2047          # output no longer 4 x the input
            path.write_text(json.dumps(data))
    folder = _bad(tmp_path, traces4 / "tp", edit)
    _refused(folder, "rank0.json, node ", "not divisible by the group")


@pytest.mark.parametrize("nprocs", [2, 3])
def test_isend_irecv_at_once_match_as_one_exchange_and_replay(nprocs: int,
                                                              tmp_path: Path) -> None:
    """Every rank sends to the next and receives from the previous at once (a swap at 2
    ranks, a ring at 3): in issue order every rank's first op is a send, so the sends and
    receives are matched as a set, each pair one call, and replayed without deadlock."""
    from tests.trace_fixtures import record_small_job

    folder = record_small_job("ring_job.py", nprocs, tmp_path / "ring")
    trace = load_trace([folder])
    p2p = [op for op in trace.all_ops() if op.collective in ("send", "recv")]
    assert [op.collective for op in trace.ops[0]] == ["send", "recv", "barrier"]
    assert len(p2p) == 2 * nprocs and len({op.exchange for op in p2p}) == 1
    for call in {op.call for op in p2p}:
        recv, send = sorted((op for op in p2p if op.call == call), key=lambda o: o.collective)
        assert (send.collective, send.peer, recv.peer) == ("send", recv.rank, send.rank)
    out = tmp_path / "r.jsonl"
    _replay(nprocs, str(folder), "--backend", "gloo", "--iters", "2", "--repeat", "1",
            "-O", str(out))
    records = load_records(out)
    assert sorted(r.collective for r in records) == ["barrier"] + ["sendrecv"] * nprocs
    assert all(r.wrong == 0 for r in records)
    if have_mpi():
        out = tmp_path / "mpi.jsonl"
        _replay(nprocs, str(folder), "--backend", "mpi", "--iters", "2", "--repeat", "1",
                "-O", str(out))
        assert len(load_records(out)) == nprocs + 1


def test_a_group_that_does_not_tile_the_recorded_world_is_not_rescaled(tmp_path: Path) -> None:
    """{0, 2} of 3 ranks has no copies at 6 (rank r runs recorded rank r mod 3): --world-size
    refuses in one line naming the group, and the size-mismatch hint does not offer it."""
    from tests.conftest import run_ccbench
    from tests.trace_fixtures import record_small_job

    folder = str(record_small_job("subgroup_job.py", 3, tmp_path / "sub"))
    for args in (["--world-size", "6"], []):
        done = run_ccbench("launch", "-n", "6", "replay", folder, *args, "--backend", "gloo",
                           timeout=300)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
        assert "group [0, 2] is not one of the groups" in lines[0]
        assert "disagree" not in lines[0] and "pass --world-size" not in lines[0]
