"""The wheel holds everything the commands need: built from the checkout, installed into a
fresh virtual environment outside it, it renders a Slurm sweep and runs a benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SWEEP = """\
name: wheel-check
collectives: [allreduce]
backends: [gloo]
sizes: 1K-4K
ranks_per_node: [2]
"""


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


@pytest.mark.slow
def test_installed_wheel_renders_a_slurm_sweep_and_runs_a_benchmark(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    dist = tmp_path / "dist"
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-q", "-w", str(dist), str(ROOT)], tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = dist.glob("ccbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ccbench/sweep/templates/array.sbatch" in names and "ccbench/py.typed" in names

    # a fresh venv; the wheel without its dependencies, which come from this environment's
    # site-packages through a .pth line (no download; a plain path line loads none of that
    # directory's own .pth files, so an editable ccbench there stays out)
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path,
                env).returncode == 0
    python = venv / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; "
                         "print(sysconfig.get_paths()['purelib'])"], tmp_path, env).stdout.strip())
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                 "-q", str(wheel)], tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    where = _run([str(python), "-c", "import ccbench; print(ccbench.__file__)"], tmp_path, env)
    assert where.stdout.startswith(str(purelib)), where.stdout + where.stderr

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "sweep.yaml").write_text(SWEEP)
    env = {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    ccbench = str(venv / "bin" / "ccbench")
    proc = _run([ccbench, "sweep", "sweep.yaml", "--slurm", "--dry-run"], work, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "#SBATCH" in proc.stdout and "--array=" in proc.stdout
    proc = _run([ccbench, "launch", "-n", "2", "allreduce", "--sizes", "1K-64K"], work, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Out of bounds values : 0 OK" in proc.stdout
