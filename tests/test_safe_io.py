"""Nothing lost, nothing blocks, one line (issue 33): Parquet runs that end together, `merge
IN -o IN` while a run appends, outputs written whole or not at all (a full disk: the previous
file stays), outputs that are not records files or are symbolic links, FIFOs and newline
bombs as input, hostile model values, trace sizes and memory limits. Each ends in one
`ccbench: error:` line and exit 2, or keeps every record."""

from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, run_ccbench_forked
from test_hostile_input import fit_records

import ccbench.commands.merge as merge_command
import ccbench.records.table as table
from ccbench.bench.output.files import check_output_file
from ccbench.errors import UsageError
from ccbench.formats import load_trace
from ccbench.formats.chakra import comm_coll_node, write_trace
from ccbench.model.modelfile import load_model
from ccbench.records import append_record, read_records, record_from_dict

FIXTURE = Path(__file__).parent / "fixtures" / "records-v1.jsonl"
GOOD = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
REPO = Path(__file__).resolve().parents[1]


def _record(run_id: str) -> Any:
    data = json.loads(json.dumps(GOOD[0]))
    data["run_id"] = run_id
    return record_from_dict(data)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("ccbench: error: "), done.stderr[-2000:]
    return lines[0]


def _limited(*args: str, fsize: int | None = None, address_space: int | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m ccbench ARGS` with a file-size limit (writes past it fail with EFBIG, as on
    a full disk, without needing a mount) or an address-space limit (`ulimit -v`)."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([PYTHON, "-m", "ccbench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=limit)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("calibrated")
    done = run_ccbench_forked("calibrate", str(fit_records(folder / "fit.jsonl")), "-o",
                              str(folder / "model.json"), "--bootstrap", "0")
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture
def model(tmp_path: Path, calibrated: Path) -> Path:
    """model.json and the records it was fitted to (fit.jsonl), in this test's folder."""
    for name in ("fit.jsonl", "model.json"):
        (tmp_path / name).write_bytes((calibrated / name).read_bytes())
    return tmp_path / "model.json"


# -- item 1: runs sharing one -O x.parquet --------------------------------------------------

def test_parquet_runs_ending_together_keep_every_record(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """While one run folds the journal into the Parquet file, another appends a record and a
    third finishes too: every record ends in the Parquet file, once, and no finisher fails
    (the issue: 65 of 66 records, or FileNotFoundError in finish_parquet)."""
    out = tmp_path / "x.parquet"
    journal = Path(table.journal_path(out))
    for i in range(3):
        append_record(journal, _record(f"a-{i}"))
    real = table.write_parquet
    others: list[threading.Thread] = []
    errors: list[BaseException] = []

    def guarded(job: Any) -> None:
        try:
            job()
        except BaseException as exc:      # noqa: BLE001 -- reported by the assert below
            errors.append(exc)

    def write_while_others_run(path: Any, records: Any) -> int:
        if not others:
            others.append(threading.Thread(target=guarded, args=(
                lambda: append_record(journal, _record("late")),)))
            others.append(threading.Thread(target=guarded, args=(
                lambda: table.finish_parquet(out),)))
            for other in others:
                other.start()
                other.join(timeout=2)     # today's code lets them run now; the fix makes
        return real(path, records)        # them wait for the lock, then go on

    monkeypatch.setattr(table, "write_parquet", write_while_others_run)
    table.finish_parquet(out)
    for other in others:
        other.join(timeout=120)
    assert not errors, errors
    table.finish_parquet(out)             # whatever a late run left in a new journal
    ids = sorted(r.run_id for r in table.read_parquet(out))
    assert ids == ["a-0", "a-1", "a-2", "late"]
    assert not journal.exists()


# -- item 3: merge IN -o IN while a run appends to IN ---------------------------------------

def test_merge_into_its_input_keeps_records_appended_meanwhile(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    path = tmp_path / "in.jsonl"
    for i in range(4):
        append_record(path, _record(f"r-{i}"))
    real = merge_command.write_records
    appender: list[threading.Thread] = []

    def write_while_a_run_appends(out: Any, records: Any) -> int:
        appender.append(threading.Thread(target=append_record, args=(path, _record("late"))))
        appender[0].start()
        appender[0].join(timeout=2)       # today: appended to the file about to be replaced
        return real(out, records)

    monkeypatch.setattr(merge_command, "write_records", write_while_a_run_appends)
    args = merge_command.argparse.Namespace(inputs=[str(path)], output=str(path), force=False)
    assert merge_command.main(args) == 0
    appender[0].join(timeout=120)
    records, report = read_records(path)
    assert not report.skipped
    assert sorted(r.run_id for r in records) == ["late", "r-0", "r-1", "r-2", "r-3"]


def test_merge_refuses_an_output_that_is_not_records_as_dash_o_does(tmp_path: Path) -> None:
    """merge -o replaced any file; -O and simulate -o refuse one that is not ccbench records:
    one shared check, and the file is left as it was."""
    source = tmp_path / "in.jsonl"
    append_record(source, _record("r-0"))
    text = tmp_path / "text.jsonl"
    text.write_text("my notes, not records\n")
    args = merge_command.argparse.Namespace(inputs=[str(source)], output=str(text), force=False)
    with pytest.raises(UsageError, match="not ccbench records"):
        merge_command.main(args)
    assert text.read_text() == "my notes, not records\n"
    with pytest.raises(UsageError, match="not ccbench records"):
        check_output_file(str(text))                        # the same words as -O


# -- item 2 and the OSError tracebacks: outputs on a full disk ------------------------------

def test_calibrate_on_a_full_disk_keeps_the_previous_model(tmp_path: Path, model: Path) -> None:
    before = model.read_bytes()
    done = _limited("calibrate", str(tmp_path / "fit.jsonl"), "-o", str(model),
                    fsize=len(before) // 2)
    line = _one_error_line(done)
    assert f"cannot write {str(model)!r}" in line and "too large" in line.lower()
    assert model.read_bytes() == before                     # whole, as it was
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("command", ["merge", "simulate", "export", "report"])
def test_outputs_on_a_full_disk_are_one_line(tmp_path: Path, model: Path, command: str) -> None:
    records = str(tmp_path / "fit.jsonl")
    out = tmp_path / "out"
    argv = {"merge": ["merge", records, "-o", f"{out}.jsonl"],
            "simulate": ["simulate", str(model), "allreduce", "-p", "4", "-o", f"{out}.jsonl"],
            "export": ["export", "astra-sim", str(model), "-o", str(out)],
            "report": ["report", records, "-o", str(out), "--formats", "png"]}[command]
    line = _one_error_line(_limited(*argv, fsize=64, timeout=300))
    assert "too large" in line.lower(), line


# -- item 4: outputs that are not records files, or are links --------------------------------

def test_simulate_output_refuses_what_launch_refuses(tmp_path: Path, model: Path) -> None:
    notes = tmp_path / "notes.jsonl"
    notes.write_text("my notes\nan unterminated last line")
    for target in (notes, tmp_path / "notes.txt"):
        if target.suffix == ".txt":
            target.write_text("text")
        before = target.read_bytes()
        line = _one_error_line(run_ccbench_forked("simulate", str(model), "allreduce", "-p", "4",
                                                  "-o", str(target)))
        assert "--output" in line
        assert target.read_bytes() == before
        assert not Path(f"{target}.torn").exists()


@pytest.mark.parametrize("command", ["calibrate", "merge", "simulate", "launch"])
def test_an_output_that_is_a_symlink_is_refused(tmp_path: Path, model: Path,
                                                command: str) -> None:
    victim = tmp_path / "victim.jsonl"
    append_record(victim, _record("v"))
    before = victim.read_bytes()
    link = tmp_path / ("link.json" if command == "calibrate" else "link.jsonl")
    link.symlink_to(victim)
    records = str(tmp_path / "fit.jsonl")
    if command == "launch":
        with pytest.raises(UsageError, match="symbolic link"):
            check_output_file(str(link))
        return
    argv = {"calibrate": ["calibrate", records, "-o", str(link), "--bootstrap", "0"],
            "merge": ["merge", records, "-o", str(link)],
            "simulate": ["simulate", str(model), "allreduce", "-p", "4", "-o", str(link)]}
    line = _one_error_line(run_ccbench_forked(*argv[command]))
    assert "symbolic link" in line
    assert victim.read_bytes() == before and link.is_symlink()


def test_an_appender_never_writes_through_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    (tmp_path / "r.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        append_record(tmp_path / "r.jsonl", _record("x"))
    assert victim.read_text() == ""


# -- item 9: FIFOs, newline bombs -------------------------------------------------------------

@pytest.mark.parametrize("where", ["model", "sweep", "groups-file", "records"])
def test_a_fifo_as_input_is_refused_unread(tmp_path: Path, model: Path, where: str) -> None:
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    argv = {"model": ["simulate", str(fifo), "allreduce", "-p", "4"],
            "sweep": ["sweep", str(fifo), "--dry-run"],
            "groups-file": ["replay", str(tmp_path), "--groups-file", str(fifo)],
            "records": ["merge", str(fifo), "-o", str(tmp_path / "m.jsonl")]}[where]
    if where == "groups-file":                  # in a process of its own: it may block
        code = ("import sys\nfrom ccbench.formats.named import parse_group_settings\n"
                "parse_group_settings([], sys.argv[1])")
        done = subprocess.run([PYTHON, "-c", code, str(fifo)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert "in.fifo: a FIFO, not a regular file" in done.stderr, done.stderr[-2000:]
        return
    line = _one_error_line(run_ccbench_forked(*argv, timeout=120))   # today: blocks for ever
    assert "FIFO" in line or "neither a results file" in line


def test_a_gzip_of_newlines_stops_at_the_line_cap(tmp_path: Path) -> None:
    """The issue's bomb, smaller: 64 MiB of newlines (64 KiB of gzip) is 67 million lines;
    the default cap of 4 million lines stops it in seconds, with a line naming the knob."""
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as out:
        out.write(FIXTURE.read_bytes())
        block = b"\n" * (1 << 20)
        for _ in range(64):
            out.write(block)
    line = _one_error_line(run_ccbench_forked("merge", str(bomb), "-o", str(tmp_path / "m.jsonl"),
                                              timeout=300))
    assert "more than 4,000,000 lines" in line and "CCBENCH_MAX_INPUT_LINES" in line


def test_the_input_cap_counts_across_the_files_of_one_read(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A folder of bombs each under the cap is refused once together they pass it."""
    folder = tmp_path / "many"
    folder.mkdir()
    for k in range(4):
        with gzip.open(folder / f"b{k}.jsonl.gz", "wb") as out:
            out.write(FIXTURE.read_bytes() + b" " * (1 << 20) + b"\n")
    monkeypatch.setenv("CCBENCH_MAX_INPUT_BYTES", str(3 << 20))
    with pytest.raises(UsageError, match=r"b2.jsonl.gz: inflates to more than 3 MiB"):
        read_records(folder)


# -- model values, deep JSON, trace sizes -----------------------------------------------------

@pytest.mark.parametrize(("change", "says"), [
    ({"alpha": "1e-6"}, "alpha is '1e-6', not a number"),
    ({"alpha": float("inf")}, "alpha is inf: must be finite"),
    ({"alpha": float("nan")}, "alpha is nan: must be finite"),
    ({"beta": 1e308}, "beta is 1e+308: must be finite, 0 to 1"),
    ({"gamma": -1e-9}, "gamma is -1e-09"),
    ({"goodness": {}}, "goodness is {}, without its points"),
    ({"world_sizes": [0]}, "world_sizes holds 0"),
    ({"world_sizes": []}, "world_sizes is [], not a list"),
    ({"pieces": [{"max_bytes": 4096, "alpha": 1e-6, "beta": float("nan"), "gamma": 0}]},
     "piece 0 beta is nan"),
    ({"sizes": [10, 1]}, "sizes is [10, 1]: the smallest comes first"),
])
def test_model_values_that_cannot_predict_are_refused(tmp_path: Path, model: Path,
                                                      change: dict[str, Any], says: str) -> None:
    data = json.loads(model.read_text())
    for fit in data["fits"]:
        fit.update(change)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"bad.json: fit 0: ") as caught:
        load_model(bad)
    assert says in str(caught.value)


def test_nan_model_is_one_line_not_a_wrong_prediction(tmp_path: Path, model: Path) -> None:
    data = json.loads(model.read_text())
    data["fits"][0]["alpha"] = float("nan")
    bad = tmp_path / "nan.json"
    bad.write_text(json.dumps(data))
    line = _one_error_line(run_ccbench_forked("simulate", str(bad), "allreduce", "-p", "4"))
    assert "alpha is nan" in line


def test_deep_json_in_a_groups_file_and_a_capture_file_is_one_line(tmp_path: Path) -> None:
    from ccbench.formats.named import parse_group_settings, read_capture

    deep = tmp_path / "groups.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match="JSON nested more than 100 levels"):
        parse_group_settings([], str(deep))
    capture = tmp_path / "capture.0.jsonl"
    capture.write_text('{"op": "allreduce"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UsageError, match=r"capture.0.jsonl:2: JSON nested more than 100"):
        read_capture(capture)


@pytest.mark.parametrize("size", [-4096, 1 << 62])
def test_trace_sizes_out_of_range_are_refused(tmp_path: Path, size: int) -> None:
    path = tmp_path / "t.0.et"
    write_trace(path, [comm_coll_node(0, "", "allreduce", 4096),
                       comm_coll_node(1, "", "allreduce", size)])
    with pytest.raises(UsageError, match=r"t.0.et, node 1: allreduce of .* bytes .*2\^50"):
        load_trace([path])


# -- memory: RLIMIT_AS, node counts, a gzip whose last member is empty -----------------------

def test_open_input_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    from ccbench.safeio import open_input

    os.mkfifo(tmp_path / "f")
    with pytest.raises(UsageError, match="a FIFO, not a regular file"):
        open_input(tmp_path / "f")


def test_the_memory_check_counts_the_address_space_limit() -> None:
    """Under `ulimit -v` the room left in the address space is what a trace may take."""
    code = ("import resource, sys\n"
            "from ccbench.safeio import check_memory\n"
            "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
            "room = 256 << 20\n"
            "resource.setrlimit(resource.RLIMIT_AS, (size + room, size + room))\n"
            "check_memory('t', 128 << 20)\n"
            "try:\n"
            "    check_memory('t', 512 << 20)\n"
            "except Exception as exc:\n"
            "    print(exc)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CCBENCH_TRACE_MEMORY", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "t needs about 512 MiB of memory" in done.stdout, done.stdout


def test_a_trace_of_small_nodes_is_checked_by_its_node_count(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Small nodes take far more memory per byte than the file-size estimate assumes: the
    node count, once read, is checked too (the issue: MemoryError under `ulimit -v`)."""
    path = tmp_path / "t.0.et"
    write_trace(path, [comm_coll_node(i, "a", "allreduce", 4096) for i in range(20_000)])
    per_file = 40 * path.stat().st_size                 # what the size alone suggests
    monkeypatch.setenv("CCBENCH_TRACE_MEMORY", str(int(per_file * 1.2)))
    with pytest.raises(UsageError, match=r"a Chakra trace of 20,000 nodes needs about"):
        load_trace([path])


def test_a_gzip_whose_last_member_is_empty_does_not_hide_its_size(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    from ccbench.safeio import check_memory, inflated_size

    plain = tmp_path / "p.0.et"
    write_trace(plain, [comm_coll_node(i, "", "allreduce", 4096) for i in range(2000)])
    packed = tmp_path / "g" / "w.0.et.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()) + gzip.compress(b""))
    assert inflated_size(packed) == plain.stat().st_size
    monkeypatch.setenv("CCBENCH_TRACE_MEMORY", str(plain.stat().st_size * 20))
    with pytest.raises(UsageError, match="needs about"):
        load_trace([packed.parent])
    with pytest.raises(UsageError, match="needs about"):
        check_memory("x", plain.stat().st_size * 40)


def test_a_trace_under_ulimit_v_is_one_line(tmp_path: Path, model: Path) -> None:
    """The issue's MemoryError traceback: simulate under an address-space limit that leaves
    less room than the trace needs says so in one line."""
    folder = tmp_path / "t"
    folder.mkdir()
    write_trace(folder / "w.0.et", [comm_coll_node(i, "a", "allreduce", 4096)
                                    for i in range(100_000)])          # ~6 MB: ~300 MB parsed
    code = ("import ccbench.cli, ccbench.commands.simulate, ccbench.model.tracesim, "
            "ccbench.formats, resource\n"
            "print(int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize())")
    probe = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert probe.returncode == 0, probe.stderr
    done = _limited("simulate", str(model), "--trace", str(folder), "-p", "2",
                    address_space=int(probe.stdout) + (150 << 20), timeout=300)
    line = _one_error_line(done)
    assert "memory" in line, line


# -- the size messages name a knob that changes them -----------------------------------------

def test_model_and_sweep_caps_do_not_suggest_a_variable_that_does_not_raise_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ccbench.model.modelfile as modelfile
    import ccbench.sweep.spec as spec
    from ccbench.sweep import load_sweep

    big = tmp_path / "big.json"
    big.write_text(" " * 4096)
    monkeypatch.setattr(modelfile, "_MODEL_CAP", 1024)
    with pytest.raises(UsageError) as caught:
        load_model(big)
    assert "more than 1 KiB" in str(caught.value)
    assert "CCBENCH_MAX_INPUT_BYTES" not in str(caught.value)
    monkeypatch.setattr(spec, "_SWEEP_CAP", 1024)
    big.rename(tmp_path / "big.yaml")
    with pytest.raises(UsageError) as caught:
        load_sweep(tmp_path / "big.yaml")
    assert "more than 1 KiB" in str(caught.value)
    assert "CCBENCH_MAX_INPUT_BYTES" not in str(caught.value)


# -- found by probing from outside: a group key that is not a node id, a group of 100,000
#    copies of one rank (it ran for minutes), a --timeout no socket or timer can hold ------

@pytest.mark.parametrize("setting,message", [
    ({"abc": [0, 1]}, "expected NODE_ID or RANK:NODE_ID"),
    ({"1": [0] * 100_000}, "names each of the 2 ranks at most once"),
    ({"1": [0, 1, 2]}, "names each of the 2 ranks at most once"),
])
def test_group_settings_that_name_no_node_or_repeat_ranks_are_one_line(
        setting: dict[str, list[int]], message: str) -> None:
    from ccbench.formats.named import apply_user_groups

    with pytest.raises(UsageError, match=message):
        apply_user_groups([[], []], setting)


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_a_timeout_beyond_a_week_is_one_line(how: str) -> None:
    args, env = ["allreduce", "--sizes", "1K", "--no-output"], {}
    if how == "flag":
        args += ["--timeout", "1e10"]
    else:
        env["CCBENCH_TIMEOUT"] = "1e10"
    line = _one_error_line(run_ccbench_forked(*args, env=env))
    assert "must be <= 604800" in line
