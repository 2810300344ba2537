"""The rendered sbatch text against golden files (tests/golden/sbatch_*.txt).

On a mismatch the test prints a unified diff. To accept a deliberate change:
    CCBENCH_UPDATE_GOLDEN=1 pytest tests/test_sweep_sbatch.py
"""

from __future__ import annotations

import difflib
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from ccbench.errors import UsageError
from ccbench.sweep import load_sweep, sweep_from_dict
from ccbench.sweep.slurm import (
    SlurmOptions,
    array_jobs,
    array_spec,
    parse_squeue,
    render_sbatch,
    sbatch_quote,
)

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"
FIXED = dict(workdir="/home/me/ccbench", python="/opt/venv/bin/python")


#: the plan file's digest in the golden files: it hashes the sweep as loaded (`collectives:
#: all` is the registry's list), so a new collective must not change the golden text
DIGEST = "DIGEST"


def render_all(sweep, options: SlurmOptions) -> str:  # type: ignore[no-untyped-def]
    plan = f"{sweep.results}/plan-{sweep.digest()}.json"
    text = "\n".join(render_sbatch(sweep, job, options, plan=plan, **FIXED)
                     for job in array_jobs(sweep.tasks()))
    assert f"plan-{sweep.digest()}.json" in text           # each task runs the sweep's plan
    return text.replace(sweep.digest(), DIGEST)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"sbatch_{name}.txt"
    if os.environ.get("CCBENCH_UPDATE_GOLDEN"):
        path.write_text(text)
    expected = path.read_text() if path.exists() else ""
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True),
                                            text.splitlines(keepends=True),
                                            fromfile=str(path), tofile="rendered"))
        pytest.fail(f"rendered sbatch differs from {path.name}:\n{diff}", pytrace=False)


@pytest.mark.parametrize("example", ["allreduce-nodes", "cpu-backends", "calibration"])
def test_examples_golden(example: str) -> None:
    sweep = load_sweep(ROOT / "slurm" / "sweeps" / f"{example}.yaml")
    check_golden(example, render_all(sweep, SlurmOptions.merged(sweep.slurm, {})))


def test_options_golden() -> None:
    sweep = sweep_from_dict({"name": "small", "backends": ["gloo", "mpi"], "sizes": "8-64",
                             "ranks_per_node": [2], "env": {"I_MPI_WAIT_MODE": "1"}})
    options = SlurmOptions(partition="debug", account="proj1", time="00:10:00",
                           gpus_per_node=2, max_parallel=3, qos="short")
    check_golden("small", render_all(sweep, options))


def test_hostile_values_stay_inert() -> None:
    """A partition like `x; rm -rf /tmp/y` is one quoted sbatch value; shell metacharacters in
    the script body are shlex-quoted; a newline (a new script line) is refused."""
    hostile = "x; rm -rf /tmp/y"
    sweep = sweep_from_dict({"name": "h", "results": "out/$(touch pwned) dir",
                             "env": {"NOTE": "'; touch pwned; '"}})
    options = SlurmOptions(partition=hostile, account='a"b#c\\d')
    text = render_all(sweep, options)
    check_golden("hostile", text)
    assert '#SBATCH --partition="x; rm -rf /tmp/y"\n' in text
    assert '#SBATCH --account="a\\"b\\#c\\\\d"\n' in text
    body = [line for line in text.splitlines() if not line.startswith("#")]
    export = next(line for line in body if line.startswith("export NOTE="))
    assert shlex.split(export) == ["export", "NOTE='; touch pwned; '"]
    command = shlex.split(next(line for line in body if line.startswith("exec ")))
    assert command[6] == f"out/$(touch pwned) dir/plan-{DIGEST}.json"
    # the body really is inert: bash -n parses it, and running the exports and echo
    # (with sbatch's variables set) creates nothing
    script = "\n".join(line for line in text.splitlines() if not line.startswith("exec "))
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "1",
                               "SLURM_JOB_NODELIST": "n1", "PATH": os.environ["PATH"]},
                          cwd=GOLDEN)
    assert proc.returncode == 0, proc.stderr
    assert not (GOLDEN / "pwned").exists()
    with pytest.raises(UsageError, match="control characters"):
        sbatch_quote("debug\n#SBATCH --wrap=evil")


def test_sbatch_quote_matches_sbatch_parser() -> None:
    # sbatch: blanks split, "..." groups, backslash escapes the next character, '#' ends the line
    assert sbatch_quote("plain") == '"plain"'
    assert sbatch_quote('a b"c#d\\e') == '"a b\\"c\\#d\\\\e"'


def test_array_spec_and_squeue_parsing() -> None:
    assert array_spec([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert array_spec([4]) == "4"
    queued = parse_squeue("41|3|RUNNING|41_3\n41|4-6,9%2|PENDING|41_[4-6,9%2]\n")
    assert queued == {3: ("RUNNING", "41"), 4: ("PENDING", "41"), 5: ("PENDING", "41"),
                      6: ("PENDING", "41"), 9: ("PENDING", "41")}


def test_dry_run_prints_and_submits_nothing(tmp_path: Path) -> None:
    import sys

    sweep_file = tmp_path / "dry.yaml"
    sweep_file.write_text("backends: [gloo]\nsizes: 8-16\nranks_per_node: [2, 3]\n")
    proc = subprocess.run([sys.executable, "-m", "ccbench", "sweep", str(sweep_file), "--slurm",
                           "--dry-run", "--partition", "x; rm -rf /tmp/y", "--max-parallel", "2"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 2
    assert '#SBATCH --partition="x; rm -rf /tmp/y"' in proc.stdout
    assert "#SBATCH --array=0%2" in proc.stdout and "#SBATCH --array=1%2" in proc.stdout
    assert "# would run: sbatch --parsable results/dry/jobs/array-1x2.sbatch" in proc.stdout
    assert not (tmp_path / "results").exists()
