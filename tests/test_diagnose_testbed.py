"""`ccbench diagnose` on emulated hosts with injected faults: one small cell of each kind.

    sudo pytest -m testbed tests/test_diagnose_testbed.py

4 hosts, one rank each (`testbed exec` and the local launcher), links at 50 Mbit/s. A
dual-plane (dual-ToR, ECMP) testbed for: healthy (no finding, exit 0), one host's link at
1/3 (--quick), one plane port down, one plane port at 1/4, one host's CPU limited once the
ranks are up (--quick), one host's links set down mid-plan (a finding naming it, and every
process gone: no hang); a two-tier testbed (2 leaves) for one uplink at 1/2 and for
`--planes` where there are none (one line, exit 2); one bad ECMP member, injected by
scripts/diagnose-faults.sh (tc and ip only). The other cells are
benchmarks/diagnose_validation.py's. Each testbed is always taken down. Without root or
iproute2 the tests skip with the reason (fail under CI=true).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import missing_prerequisite

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

HOSTS = 4
LINK = "50M"
STATE = Path("/run/ccbench-testbed")


def _problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges, cgroups)"
    missing = [t for t in ("ip", "tc", "nsenter", "unshare") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 util-linux)"
    if (STATE / "state.json").exists():
        return "a testbed is already up (`ccbench testbed down` first; this test replaces it)"
    return None


def _validation():
    sys.modules.pop("benchmarks.diagnose_validation", None)
    from benchmarks import diagnose_validation

    return diagnose_validation


@pytest.fixture(scope="module")
def validation():
    problem = _problem()
    if problem is not None:
        missing_prerequisite(f"testbed not possible here: {problem}")
    return _validation()


@pytest.fixture(scope="module")
def planes(validation) -> Iterator[None]:
    try:
        validation.testbed_up(HOSTS, LINK, two_tier=False)
        yield
    finally:
        validation.ccbench("testbed", "down", check=False)


@pytest.fixture(scope="module")
def two_tier(validation) -> Iterator[None]:
    try:
        validation.testbed_up(HOSTS, LINK, two_tier=True)
        yield
    finally:
        validation.ccbench("testbed", "down", check=False)


def _check(result: dict, kind: str | None) -> None:
    assert result["ranks_killed"] == 0, result
    if kind is None:
        assert result["findings"] == [] and result["rc"] == 0, result
        return
    assert result["found"], result
    assert result["false"] == [], result
    assert result["rc"] == 1, result


def test_healthy_dual_plane_cluster_has_no_finding(validation, planes) -> None:
    _check(validation.cell(HOSTS, None, None, LINK, 29801), None)


# (kind, victim, --quick, fault set once the plan is printed): --quick and a fault that
# comes while the job runs each have a cell; the CPU cell gets both, as its host, held to 5 %
# of a core from the start, spent ~40 of its ~90 s starting Python and torch
CELLS = [("host-link", "h2", True, False), ("plane-down", "h1", False, False),
         ("plane-slow", "h3", False, False), ("cpu", "h2", True, True),
         ("link-down-mid", "h3", False, False)]


@pytest.mark.parametrize("kind, victim, quick, after_plan",
                         [pytest.param(*cell, id=f"{cell[0]}-{cell[1]}",
                                       # a plane's port down is CI's plane cell; slow with the matrix
                                       marks=[pytest.mark.matrix] if cell[0] == "plane-slow" else [])
                          for cell in CELLS])
def test_injected_fault_is_named(validation, planes, kind: str, victim: str, quick: bool,
                                 after_plan: bool) -> None:
    port = 29810 + [cell[0] for cell in CELLS].index(kind)
    # the CPU quota: 5 % of a core, not the validation's 20 %: with the 2 cores shared by
    # other work (load average 24 seen), an unconstrained host got about 23 % of a core, so a
    # 20 % quota was not slower (results/diagnose/)
    _check(validation.cell(HOSTS, kind, victim, LINK, port, quick=quick, cpu_percent=5.0,
                           after_plan=after_plan), kind)


# before the two-tier tests: the module-scoped dual-plane testbed is replaced by theirs
FAULTS = Path(__file__).resolve().parents[1] / "scripts" / "diagnose-faults.sh"


# a matrix cell: in a fresh clone's .ci/run (a3365d2) it ended with status 3 and no verdict
# once; the bad-ECMP runs of results/diagnose/2026-12-05-intermittent.md named it 5 of 5
@pytest.mark.matrix
def test_bad_ecmp_member_is_named(validation, planes) -> None:
    """h0<->h2 at 16 Mbit/s on plane eth1 only: the pairs pinned to each plane hit it every
    run; named, nothing else. (A flapping port: benchmarks/diagnose_intermittent.py on the
    8-host testbed; in this cell, started by hand with a 2 s flap, it once left no verdict:
    the ranks' own connections cross the flapping port.)"""
    subprocess.run([str(FAULTS), "ecmp", "h0", "h2", "16mbit"], check=True,
                   capture_output=True)
    try:
        run = validation.run_diagnose(HOSTS, ["--link-rate", LINK, "--planes", "eth0,eth1",
                                              "--no-compute"], 29830)
    finally:
        for args in (["clear", "h0", "50mbit"], ["clear", "h2", "50mbit"]):
            subprocess.run([str(FAULTS), *args], check=False, capture_output=True)
    findings = run["verdict"].get("findings")
    assert findings is not None and run["rc"] == 1, run
    member = [f for f in findings if f["pairs"] == [["h0", "h2"]] and "eth1" in f["component"]]
    assert member and len(findings) == 1, findings


def test_slow_uplink_is_named(validation, two_tier) -> None:
    _check(validation.cell(HOSTS, "uplink", "leaf1", LINK, 29820), "uplink")


def test_planes_without_planes_is_one_line_exit_2(validation, two_tier) -> None:
    run = validation.run_diagnose(HOSTS, ["--planes", "eth0,eth1"], 29821)
    assert run["rc"] == 2, run
    errors = [line for line in run["stderr_tail"] if line.startswith("ccbench: error:")]
    assert len(errors) == 1 and "lacks eth1" in errors[0], run
    assert not any("Traceback" in line for line in run["stderr_tail"]), run

