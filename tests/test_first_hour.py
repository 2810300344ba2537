"""What a new user meets first: rank counts that fit the machine, the note when they do not."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, have_mpi, run_ccbench_forked

from ccbench.backends.base import STARMAP_LOOP
from ccbench.backends.mpi_loop import C_LOOP
from ccbench.collectives import COLLECTIVES
from ccbench.records import load_records
from ccbench.run.supervisor import default_nprocs
from ccbench.sysinfo import oversubscription_note, usable_cores

QUICK = ["allreduce", "--backend", "gloo", "--sizes", "1K", "--iters", "2", "--warmup", "1", "-q"]


def _launch(args: list[str], out: Path, cores: set[int] | None = None
            ) -> subprocess.CompletedProcess[str]:
    def pin() -> None:            # a child that may use only `cores`, as taskset would make it
        if cores is not None:
            os.sched_setaffinity(0, cores)
    return subprocess.run([PYTHON, "-m", "ccbench", "launch", *args, "--output", str(out)],
                          capture_output=True, text=True, timeout=300, preexec_fn=pin)


def test_default_rank_count_is_the_usable_cores() -> None:
    assert default_nprocs("cpu") == usable_cores() >= 1


def test_note_only_when_ranks_outnumber_cores() -> None:
    assert oversubscription_note(2, 2) is None
    note = oversubscription_note(4, 2)
    assert note is not None and note.count("\n") == 0
    assert "4 ranks on 2 cores" in note and "-n 2" in note


def test_launch_without_n_runs_one_rank_per_core(tmp_path: Path) -> None:
    cores = set(sorted(os.sched_getaffinity(0))[:2])
    proc = _launch(QUICK, tmp_path / "r.jsonl", cores)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "oversubscribed" not in proc.stderr
    records = load_records(tmp_path / "r.jsonl")
    assert {r.world_size for r in records} == {len(cores)}
    assert {r.method["oversubscribed"] for r in records} == {False}


def test_oversubscribed_run_says_so_once_and_records_it(tmp_path: Path) -> None:
    ranks = (os.cpu_count() or 1) + 1          # one more rank than the node has cores
    if ranks > 5:
        pytest.skip(f"{ranks - 1} cores: too many ranks to oversubscribe in a quick test")
    proc = _launch(["-n", str(ranks), *QUICK], tmp_path / "r.jsonl")
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = [line for line in proc.stderr.splitlines() if "oversubscribed" in line]
    assert len(notes) == 1 and f"{ranks} ranks on {ranks - 1} cores" in notes[0]
    records = load_records(tmp_path / "r.jsonl")
    assert records and all(r.method["oversubscribed"] is True for r in records)
    assert all(r.method["cores_per_node"] == ranks - 1 for r in records)


@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_what_the_clock_saw_is_recorded(tmp_path: Path) -> None:
    """Thread level, torch's threads, the batch loop and the out-of-place copy are recorded."""
    out = tmp_path / "r.jsonl"
    base = ["-n", "2", "allreduce", "--backend", "mpi,gloo", "--sizes", "8,3000", "--iters", "2",
            "--warmup", "1", "-q"]
    proc = _launch([*base, "--timing", "pipelined", "--mpi-thread-level", "single"], out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _launch(base, out)                     # per-op, default thread level
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(out)
    mpi = [r for r in records if r.backend == "mpi"]
    gloo = [r for r in records if r.backend == "gloo"]
    assert {(r.timing, r.method["mpi_thread_level"]) for r in mpi} == {
        ("pipelined", "single"), ("per-op", "funneled")}
    loops = {r.method["timed_call"] for r in mpi if r.timing == "pipelined"}
    assert loops == ({C_LOOP} if shutil.which("cc") or shutil.which("gcc") else {STARMAP_LOOP})
    assert all("mpi4py" in r.method["timed_call"] for r in mpi if r.timing == "per-op")
    assert all(r.method["torch_threads"] >= 1 for r in gloo)
    copies = {r.inplace: r.method.get("local_copy_us") for r in gloo if r.timing == "per-op"}
    assert copies[True] is None and copies[False] > 0


FIXTURE = Path(__file__).parent / "fixtures" / "records-v1.jsonl"


def test_load_gives_one_flat_typed_row_per_record() -> None:
    import ccbench

    records = load_records(FIXTURE)
    frame = ccbench.load(FIXTURE)
    assert len(frame) == len(records) > 0
    assert frame["time_median_us"].dtype == "float64" and frame["size_used"].dtype == "int64"
    assert frame["inplace"].dtype == bool and str(frame["wrong"].dtype) == "Int64"
    assert list(frame["time_median_us"]) == [r.time_us["median"] for r in records]
    nested = [c for c in frame.columns
              if c not in ("samples_us", "rank_median_us")
              and frame[c].map(lambda v: isinstance(v, (dict, list))).any()]
    assert nested == []


def test_parquet_round_trips_through_merge_and_every_reader(tmp_path: Path) -> None:
    import ccbench

    out = tmp_path / "all.parquet"
    proc = subprocess.run([PYTHON, "-m", "ccbench", "merge", str(FIXTURE), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [r.to_json() for r in load_records(out)] == [r.to_json()
                                                        for r in load_records(FIXTURE)]
    assert len(ccbench.load([tmp_path])) == len(load_records(FIXTURE))   # folders find it too
    proc = subprocess.run([PYTHON, "-m", "ccbench", "compare", str(FIXTURE), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_run_writes_parquet_and_csv_with_every_statistic(tmp_path: Path) -> None:
    import csv

    out = tmp_path / "r.parquet"
    proc = subprocess.run([PYTHON, "-m", "ccbench", "launch", "-n", "2", *QUICK, "--format",
                           "csv", "--output", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(proc.stdout.splitlines()))
    records = load_records(out)
    assert len(rows) == len(records) == 2 and not Path(f"{out}.partial.jsonl").exists()
    for stat in ("median", "mean", "min", "p5", "p95", "max", "stdev"):
        assert float(rows[0][f"time_{stat}_us"]) == records[0].time_us[stat]
    assert rows[0]["library"] == "gloo" and rows[0]["library_version"]


@pytest.mark.skipif(shutil.which("script") is None, reason="no script(1) to make a terminal")
def test_on_a_terminal_rows_and_bar_never_share_a_line() -> None:
    command = f"{PYTHON} -m ccbench launch -n 2 allreduce --backend gloo --sizes 1K-16K " \
              f"--iters 3 --warmup 1"
    proc = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TERM": "xterm"})
    assert proc.returncode == 0, proc.stdout[-2000:]
    visible = [line.split("\r")[-1] for line in proc.stdout.split("\n")]
    rows = [line for line in visible if "float32    sum" in line]
    assert len(rows) == 5
    assert all("size/s" not in row and "|" not in row for row in rows)


def test_without_a_terminal_a_status_line_comes_at_a_steady_interval() -> None:
    proc = subprocess.run([PYTHON, "-m", "ccbench", "launch", "-n", "2", "allreduce", "--backend",
                           "gloo", "--sizes", "1K,4M", "--iters", "20", "--warmup", "1"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CCBENCH_STATUS_INTERVAL": "0.2"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = [line for line in proc.stderr.splitlines() if "sizes done" in line]
    assert len(status) >= 2         # the run lasts well over two intervals
    assert all(line.startswith("ccbench: ") and len(line) < 160 for line in status)
    assert not any("sizes done" in line for line in proc.stdout.splitlines())


def test_ranks_import_the_installed_package_from_any_folder(tmp_path: Path) -> None:
    """From a folder holding a `ccbench/` directory (a checkout's parent), the ranks still
    import the package the launcher runs: they start in Python's safe-path mode."""
    impostor = tmp_path / "ccbench"
    impostor.mkdir()
    (impostor / "__init__.py").write_text("raise ImportError('the working directory was "
                                          "imported')\n")
    proc = subprocess.run([PYTHON, "-P", "-m", "ccbench", "launch", "-n", "2", *QUICK],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "working directory was imported" not in proc.stderr
    assert "allreduce" in proc.stdout


def test_a_rank_that_imports_another_ccbench_says_so_in_one_line() -> None:
    proc = subprocess.run([PYTHON, "-m", "ccbench", "allreduce", "--backend", "nosuch"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CCBENCH_LAUNCHER_PACKAGE": "/elsewhere/ccbench"})
    warnings = [line for line in proc.stderr.splitlines() if "/elsewhere/ccbench" in line]
    assert len(warnings) == 1 and "the launcher from /elsewhere/ccbench" in warnings[0]


def test_each_table_has_a_footer_of_its_own_rows(tmp_path: Path) -> None:
    """Two backends in one launch: two tables, each with the mean bus bandwidth of its own
    records (it once came once, under the last table, averaging both backends)."""
    out = tmp_path / "r.jsonl"
    proc = _launch(["-n", "2", "allreduce", "--backend", "gloo,ring@gloo", "--sizes", "1K-4K",
                    "--iters", "2", "--warmup", "1", "-q"], out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    footers = [float(line.split(":")[1]) for line in proc.stdout.splitlines()
               if line.startswith("# Avg bus bandwidth")]
    records = load_records(out)
    backends = list(dict.fromkeys(r.backend for r in records))
    assert len(backends) == 2 and len(footers) == 2, proc.stdout
    for backend, footer in zip(backends, footers, strict=True):
        own = [r.busbw_gbps for r in records if r.backend == backend]
        assert footer == pytest.approx(sum(own) / len(own), rel=1e-4, abs=1e-6)


#: the environment of a run whose default records folder is its working directory's
NO_RESULTS_VAR = {k: v for k, v in os.environ.items() if k != "CCBENCH_RESULTS"}


def test_the_main_job_keeps_its_records_and_says_how_to_report(tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "-m", "ccbench", "launch", "-n", "2", "all", *QUICK[1:]],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=NO_RESULTS_VAR)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ccbench: records in ccbench-results/ccbench-"), last
    path = last.split("records in ")[1].split(";")[0]
    records = load_records(tmp_path / path)
    assert {r.collective for r in records} == set(COLLECTIVES)          # `all`: every one
    report = last.split("figures and tables: ")[1].split()
    assert report[:3] == ["ccbench", "report", path]
    from ccbench.cli import parse_subcommand

    parse_subcommand("report", report[2:])


def test_a_named_output_is_the_only_file_the_main_job_writes(tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "-m", "ccbench", "launch", "-n", "2", "all", *QUICK[1:],
                           "-O", "mine.jsonl"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=NO_RESULTS_VAR)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.jsonl"]
    assert "records in" not in proc.stderr


def _kept(folder: Path, stderr: str) -> list:
    """The records of the one file in folder/ccbench-results/, which the run's last line names."""
    files = sorted((folder / "ccbench-results").glob("*.jsonl"))
    assert len(files) == 1, (files, stderr)
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"ccbench: records in ccbench-results/{files[0].name}; "), last
    return load_records(files[0])


def test_one_bare_rank_keeps_its_records_and_says_how_to_start_more(tmp_path: Path) -> None:
    """`ccbench allreduce` alone: a world of one rank, said on stderr with the command that
    starts two; its records kept in ccbench-results/ as every measuring run's are."""
    proc = run_ccbench_forked(*QUICK, cwd=str(tmp_path), env={"CCBENCH_RESULTS": ""})
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "one rank ran" in line]
    assert len(notes) == 1, proc.stderr
    assert f"ccbench launch -n 2 {' '.join(QUICK)}" in notes[0] and "torchrun" in notes[0]
    assert [r.world_size for r in _kept(tmp_path, proc.stderr)] == [1, 1]


def test_no_output_keeps_nothing(tmp_path: Path) -> None:
    proc = run_ccbench_forked(*QUICK, "--no-output", cwd=str(tmp_path), env={"CCBENCH_RESULTS": ""})
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == [] and "records in" not in proc.stderr


def test_records_folder_is_ccbench_results_var(tmp_path: Path) -> None:
    proc = run_ccbench_forked(*QUICK, cwd=str(tmp_path), env={"CCBENCH_RESULTS": str(tmp_path / "r")})
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "r").glob("ccbench-*.jsonl"))) == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(f"-o {tmp_path / 'r' / 'report'}")


def test_launch_of_one_collective_keeps_its_records(tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "-m", "ccbench", "launch", "-n", "2", *QUICK], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=NO_RESULTS_VAR)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r.world_size for r in _kept(tmp_path, proc.stderr)] == [2, 2]
    assert "one rank ran" not in proc.stderr


@pytest.mark.skipif(not (Path(PYTHON).parent / "torchrun").exists(), reason="no torchrun")
def test_torchrun_keeps_its_records(tmp_path: Path) -> None:
    """The headline command, `torchrun --nproc-per-node 2 -m ccbench allreduce ...`, without -O:
    rank 0 keeps the records, in one file, and names it last."""
    torchrun = str(Path(PYTHON).parent / "torchrun")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "ccbench",
                           *QUICK], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=NO_RESULTS_VAR)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r.world_size for r in _kept(tmp_path, proc.stderr)] == [2, 2]


def test_a_backend_named_twice_runs_once_with_a_note() -> None:
    proc = run_ccbench_forked("allreduce", "--backend", "gloo,gloo", "--sizes", "1K", "--iters",
                              "2", "--warmup", "0", "-q", "--no-output")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("backend gloo ") == 1, proc.stdout
    notes = [line for line in proc.stderr.splitlines() if "more than once" in line]
    assert notes == ["ccbench: note: --backend gloo,gloo names gloo more than once: each runs "
                     "once (gloo)"], proc.stderr


def test_export_names_its_files_without_a_double_slash(tmp_path: Path) -> None:
    out = f"{tmp_path / 'astra'}/"                     # a folder typed with its slash
    proc = run_ccbench_forked("export", "astra-sim", "results/model.json", "-o", out, "--ranks",
                              "4", "--backend", "gloo/gloo")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"wrote {tmp_path / 'astra' / 'network.yml'}, "), first
    assert "//" not in proc.stdout


GLOO_DATA = ["results/data/gloo-n2.jsonl.gz", "results/data/gloo-n4.jsonl.gz"]


def _columns(line: str) -> list[int]:
    import re

    return [m.start() for m in re.finditer(r"\S+", line)]


def test_calibrate_tables_have_no_twin_rows_and_aligned_columns(tmp_path: Path) -> None:
    """The fit across world sizes made from one (gloo's all-to-all leaves 2 ranks out) is not
    printed as a twin of the per-world-size row; --validate's tables are aligned, and a size's
    in-place and out-of-place records are told apart."""
    proc = run_ccbench_forked("calibrate", *GLOO_DATA, "-o", str(tmp_path / "m.json"),
                              "--bootstrap", "0", "--collective", "alltoall")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("gloo ")]
    assert len(rows) == 3 and len(set(rows)) == 3, proc.stdout
    proc = run_ccbench_forked("calibrate", *GLOO_DATA, "-o", str(tmp_path / "m.json"),
                              "--bootstrap", "0", "--collective", "allreduce", "--validate", "2:4")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.split("validation: ")[1].split("\nwrote ")[0]
    tables = [block.splitlines() for block in text.strip().split("\n\n")]
    tables[0] = tables[0][1:]                         # the line that says what was fitted
    assert len(tables) == 2 and all(len(t) > 1 for t in tables), text
    for table in tables:
        assert all(_columns(row) == _columns(table[0]) for row in table[1:]), table
        assert len(set(table)) == len(table), table


def test_the_dataframe_has_a_size_column() -> None:
    import ccbench

    frame = ccbench.load("tests/fixtures/records-v1.jsonl")
    assert list(frame["size"]) == list(frame["size_used"]) == [1024, 2048]
    assert frame.groupby("size").time_median_us.median().index.tolist() == [1024, 2048]


def test_astra_check_without_the_binaries_says_so_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "scripts/astra_check.py", "--quick", "--ranks", "2"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CCBENCH_ASTRA_SIM_BIN": str(tmp_path / "none")})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"astra_check: error: no ASTRA-sim binary at {tmp_path / 'none'}/AstraSim_Analytical_"
        f"Congestion_Unaware (set CCBENCH_ASTRA_SIM_BIN to its folder, or build it: "
        f"scripts/build-astra-sim.sh)"], proc.stderr


def test_compare_noise_judge_only_judges_the_runs_left_in_out(tmp_path: Path) -> None:
    """The documented second call judges the launches the first left in --out; with none
    there it says what to run first (it once printed a header and nothing)."""
    import json

    script = ["benchmarks/compare_noise.py", "--out", str(tmp_path), "--judge-only"]
    proc = subprocess.run([PYTHON, *script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "measure them first (python benchmarks/compare_noise.py --pairs 10" in proc.stderr
    lines = Path("tests/fixtures/records-v1.jsonl").read_text().splitlines()
    for i in range(2):                           # two launches, as a measuring call leaves them
        runs = [json.dumps({**json.loads(line), "run_id": f"launch{i}"}) for line in lines]
        (tmp_path / f"run-{i:02d}.jsonl").write_text("\n".join(runs) + "\n")
    proc = subprocess.run([PYTHON, *script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "identical, 1 run(s) per side, 1 comparison(s), 0 exit(s) with status 1" in proc.stdout
    assert "cases: 0 of 1 flagged" in proc.stdout, proc.stdout


@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_bare_mpiexec_keeps_its_records(tmp_path: Path) -> None:
    from conftest import MPIEXEC

    proc = subprocess.run([MPIEXEC, "-n", "2", PYTHON, "-m", "ccbench", "allreduce", "--backend",
                           "mpi", "--sizes", "1K", "--iters", "2", "--warmup", "1", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=NO_RESULTS_VAR)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r.world_size for r in _kept(tmp_path, proc.stderr)] == [2, 2]


def test_a_records_folder_that_cannot_be_made_leaves_the_run_printing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" / "sub"                   # under a file: cannot be made
    proc = run_ccbench_forked(*QUICK, cwd=str(tmp_path), env={"CCBENCH_RESULTS": str(folder)})
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "cannot keep records" in line]
    assert len(warnings) == 1 and "-O FILE.jsonl" in warnings[0], proc.stderr
    assert "ccbench: records in" not in proc.stderr and "# Avg bus bandwidth" in proc.stdout


def test_the_tests_keep_default_records_outside_the_checkout() -> None:
    """A run without -O keeps its records in ccbench-results/ of its working directory, which
    for most tests (and the documented commands' copies) would be the checkout: conftest
    points CCBENCH_RESULTS at a temporary folder of the session instead."""
    root = Path(__file__).resolve().parent.parent
    folder = Path(os.environ["CCBENCH_RESULTS"]).resolve()
    assert folder.is_dir() and root not in folder.parents and folder != root
