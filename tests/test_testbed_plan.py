"""The testbed as data (no root needed): rates, topologies, plans, the Slurm config, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccbench import cli
from ccbench.errors import UsageError
from ccbench.run.launchers import published_address
from ccbench.testbed.slurm import render_conf
from ccbench.testbed.topology import build_plan, parse_topology, root_bridge
from ccbench.units import parse_rate


@pytest.mark.parametrize(("text", "bits"), [("500M", 500 * 10**6), ("1G", 10**9),
                                            ("1gbit", 10**9), ("2.5G", 2_500_000_000),
                                            ("250mbit", 250 * 10**6), ("100K", 10**5)])
def test_rates(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["fast", "1Q", "", "10"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        parse_rate(text)


def test_switch_plan() -> None:
    plan = build_plan(3, parse_rate("1G"), parse_topology("switch"), ranks_per_host=2)
    assert [h.name for h in plan.hosts] == ["h0", "h1", "h2"]
    assert [h.address for h in plan.hosts] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
    assert [b.name for b in plan.bridges] == ["ccb-sw"]
    assert all(lk.rate == 10**9 and lk.bridge == "ccb-sw" for lk in plan.links)
    assert root_bridge(plan) == "ccb-sw"


def test_two_tier_uplinks_carry_the_oversubscription() -> None:
    plan = build_plan(4, parse_rate("1G"), parse_topology("two-tier:2:oversub=2"))
    uplinks = [lk for lk in plan.links if lk.a_bridge]
    # 2 hosts per leaf at 1 Gbit/s, oversubscribed 2:1 -> 1 Gbit/s per uplink
    assert [(lk.a_bridge, lk.bridge, lk.rate) for lk in uplinks] == [
        ("ccb-leaf0", "ccb-spine", 10**9), ("ccb-leaf1", "ccb-spine", 10**9)]
    leaf_of = {lk.a.split(":")[0]: lk.bridge for lk in plan.links if ":" in lk.a}
    assert leaf_of == {"h0": "ccb-leaf0", "h1": "ccb-leaf1", "h2": "ccb-leaf0", "h3": "ccb-leaf1"}
    assert root_bridge(plan) == "ccb-spine"
    assert plan.topology == "two-tier:2:oversub=2"


def test_dual_plane_gives_two_nics_on_two_subnets() -> None:
    plan = build_plan(2, parse_rate("500M"), parse_topology("dual-plane"))
    assert plan.hosts[1].addresses == {"eth0": "10.213.0.2/24", "eth1": "10.213.1.2/24"}
    assert sorted(b.name for b in plan.bridges) == ["ccb-plane0", "ccb-plane1"]


@pytest.mark.parametrize("text", ["ring", "two-tier", "two-tier:x", "two-tier:1",
                                  "two-tier:2:oversub=0.5", "two-tier:2:over=2", "switch:3"])
def test_bad_topologies_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="valid|at least"):
        parse_topology(text)


def test_plan_round_trips_through_json() -> None:
    from ccbench.testbed.topology import Plan

    plan = build_plan(4, parse_rate("1G"), parse_topology("two-tier:2"))
    assert Plan.from_json(plan.to_json()) == plan


def test_slurm_conf_names_each_host_by_its_address(tmp_path: Path) -> None:
    plan = build_plan(2, parse_rate("1G"), parse_topology("switch"), ranks_per_host=2)
    conf = render_conf(plan, tmp_path)
    assert "SlurmctldHost=h0(10.213.0.1)" in conf
    assert "NodeName=h1 NodeAddr=10.213.0.2 CPUs=2" in conf
    assert f"StateSaveLocation={tmp_path}/ctld" in conf     # never the single-node cluster's


def test_without_root_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert cli.main(["testbed", "up", "--hosts", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ccbench: error: ccbench testbed needs root")


@pytest.mark.parametrize(("argv", "needle"), [
    (["testbed", "up", "--link", "fast"], "bad --link rate 'fast'"),
    (["testbed", "up", "--topology", "torus"], "unknown --topology 'torus'"),
    (["testbed", "up", "--hosts", "0"], "--hosts must be 1..64"),
    (["testbed", "launch"], "invalid choice"),
])
def test_bad_arguments_one_line(argv: list[str], needle: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_published_address_is_not_loopback_for_a_remote_peer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CCBENCH_CONTROL_ADDR", raising=False)
    # this host: any non-loopback interface address, or loopback only where there is none
    assert published_address("127.0.0.1") == "127.0.0.1"
    monkeypatch.setenv("CCBENCH_CONTROL_ADDR", "10.1.2.3")
    assert published_address("127.0.0.1") == "10.1.2.3"


@pytest.mark.parametrize(("hosts", "topology", "planes", "spec"), [
    (4, "switch", 1, "switch:4"),
    (8, "two-tier:2:oversub=2", 1, "fat-tree:8:leaf=4:oversub=2"),
    (6, "two-tier:3", 1, "fat-tree:6:leaf=2:oversub=1"),
    (4, "dual-plane", 1, "dual-plane:4:gpus=1:tor=4"),
    (4, "switch", 2, "dual-plane:4:gpus=1:tor=4"),
])
def test_a_testbed_is_a_model_topology(hosts: int, topology: str, planes: int, spec: str) -> None:
    """The testbed and the model name one network alike: the model's topology of the same
    spec has the testbed's hosts and, link for link, its rates (model links are directed)."""
    from ccbench.model.topology import LinkClass, build_topology

    rate = parse_rate("1G")
    plan = build_plan(hosts, rate, parse_topology(topology), planes=planes)
    assert plan.model_spec() == spec
    model = build_topology(spec, None, LinkClass(1e-6, 8 / rate))
    assert model.ranks == len(plan.hosts)
    bits = sorted(round(model.cap[i] * 8) for (u, v), i in model.link_ids.items()
                  if u < v and model.klass[i] != "intra")
    assert bits == sorted(link.rate for link in plan.links)


@pytest.mark.parametrize(("hosts", "topology", "ranks_per_host"),
                         [(4, "switch", 2), (7, "two-tier:3", 1)])
def test_no_model_topology_where_none_is_the_same(hosts: int, topology: str,
                                                  ranks_per_host: int) -> None:
    plan = build_plan(hosts, parse_rate("1G"), parse_topology(topology), ranks_per_host)
    assert plan.model_spec() is None


def _up_args(line: str):
    import argparse
    import shlex

    from ccbench.commands import testbed as command

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    words = shlex.split(line)
    assert words[:2] == ["ccbench", "testbed"], line
    return parser.parse_args(words[1:])


def test_rails_give_a_rank_per_rail_by_default() -> None:
    """`testbed up --rails 2` gave Slurm 1 CPU per node, so `srun --ntasks-per-node 2` (one
    rank per rail, what `diagnose --rails` runs) waited for ever: "Requested partition
    configuration not available now". Without --ranks-per-host, rails give R."""
    from ccbench.commands.testbed import plan_of

    assert plan_of(_up_args("ccbench testbed up --hosts 4 --rails 2 --planes 2")
                   ).ranks_per_host == 2
    assert plan_of(_up_args("ccbench testbed up --hosts 4 --rails 3")).ranks_per_host == 3
    assert plan_of(_up_args("ccbench testbed up --hosts 4 --planes 2")).ranks_per_host == 1
    assert plan_of(_up_args("ccbench testbed up --hosts 4 --rails 2 --ranks-per-host 1")
                   ).ranks_per_host == 1


def test_the_documented_rails_commands_fit_each_other() -> None:
    """docs/testbed.md's rails block: the testbed it builds has as many CPUs per node as
    its srun asks tasks per node, one per rail."""
    import re
    import shlex

    from ccbench.commands.testbed import plan_of

    text = (Path(__file__).resolve().parents[1] / "docs" / "testbed.md").read_text()
    blocks = [b for b in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
              if "--rails" in b and "srun" in b]
    assert blocks, "docs/testbed.md has no rails block with its srun"
    for block in blocks:
        lines = block.splitlines()
        up = next(line for line in lines if line.startswith("ccbench testbed up"))
        srun = shlex.split(next(line for line in lines if line.startswith("srun ")))
        plan = plan_of(_up_args(up))
        per_node = int(srun[srun.index("--ntasks-per-node") + 1])
        assert plan.ranks_per_host == per_node == plan.options["rails"], block
        assert f"-N{len(plan.hosts)}" in srun, block
