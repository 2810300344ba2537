"""ASTRA-sim unit conversions, Chakra ET round trip, golden files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ccbench.errors import UsageError
from ccbench.formats.astra import GIB, astra_bandwidth, astra_comm_size, export_astra, export_measured
from ccbench.formats.chakra import (
    COLL_TYPES,
    NODE_TYPES,
    comm_coll_node,
    decode_varint,
    encode_varint,
    node_attrs,
    read_trace,
    write_trace,
)
from ccbench.model.synthetic import synthetic_records

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("CCBENCH_REGEN_GOLDEN") == "1"


def _model(alpha=10e-6, beta=1e-10, gamma=2.5e-11):
    def fit(coll, algo):
        return {"backend": "mpi", "library": "x", "transport": "mpi", "device": "cpu",
                "collective": coll, "algorithm": "native", "scope": "all-world-sizes",
                "world_sizes": [2, 4], "model_algorithm": algo, "alpha": alpha, "beta": beta,
                "gamma": gamma if coll == "allreduce" else 0.0, "gamma_source": "fitted",
                "pieces": None, "goodness": {"points": 10}, "notes": []}
    return {"schema": "ccbench.model", "version": 1,
            "fits": [fit("allgather", "ring"), fit("allreduce", "rabenseifner"),
                     fit("alltoall", "pairwise")]}


def _check_golden(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if REGEN or not path.exists():
        path.write_bytes(data)
    assert data == path.read_bytes(), f"{name} differs from the golden file"


def test_astra_bandwidth_is_gib():
    # 10 GB/s in ccbench units (1e9) is 10e9 / 2^30 = 9.3132 "GB/s" for ASTRA-sim
    assert astra_bandwidth(1 / 10e9) == pytest.approx(10e9 / GIB)
    assert astra_bandwidth(1 / 10e9) == pytest.approx(9.31323, rel=1e-5)
    with pytest.raises(UsageError):
        astra_bandwidth(0.0)


def test_astra_comm_size_semantics():
    assert astra_comm_size("allgather", 1 << 20, 4) == (1 << 20) // 4
    assert astra_comm_size("allreduce", 1 << 20, 4) == 1 << 20
    assert astra_comm_size("reduce-scatter", 1 << 20, 4) == 1 << 20
    assert astra_comm_size("alltoall", 1 << 20, 4) == 1 << 20
    assert astra_comm_size("allgather", 996, 3) == 332     # the laid-out size S, 83 x 3 x 4 B


def test_export_astra_files(tmp_path):
    m = export_astra(_model(), tmp_path, 8, None, "allgather", [1 << 20, 1 << 22])
    net = (tmp_path / "network.yml").read_text()
    assert "topology: [ Switch ]" in net and "npus_count: [ 8 ]" in net
    # Switch: 2 hops per message and 1 ns of endpoint delay per step, so latency per
    # hop = (alpha - 1 ns) / 2
    assert m["dims"][0]["latency_ns"] == pytest.approx(4999.5)
    assert "bandwidth: [ 9.31322575 ]" in net
    sysconf = json.loads((tmp_path / "system.json").read_text())
    assert sysconf["endpoint-delay"] == 1      # 0 aborts ASTRA-sim
    assert sysconf["all-gather-implementation"] == ["ring"]
    assert sysconf["all-to-all-implementation"] == ["direct1"]
    assert m["fit_used"].startswith("mpi/x allgather fit (measured algorithm native, formula ring")
    m = export_astra(_model(), tmp_path / "ar", 8, None, "allreduce", [1 << 20])
    sysconf = json.loads((tmp_path / "ar" / "system.json").read_text())
    assert sysconf["all-reduce-implementation"] == ["halvingDoubling"]
    # halvingDoubling reduces n (p-2)/(2p) at 3 x bytes / local-mem-bw (x 1e9);
    # the formula charges gamma n (p-1)/p
    assert sysconf["local-mem-bw"] == pytest.approx(3 * (6 / 14) / 2.5e-11 / 1e9, rel=1e-6)
    for rank in range(8):
        gm, nodes = read_trace(tmp_path / f"workload.{rank}.et")
        assert [node_attrs(n)["comm_size"] for n in nodes] == [(1 << 20) // 8, (1 << 22) // 8]
        assert all(n.type == NODE_TYPES["COMM_COLL_NODE"] for n in nodes)
        assert all(node_attrs(n)["is_cpu_op"] is False for n in nodes)
        assert list(nodes[1].ctrl_deps) == [0]
    _check_golden("astra_network.yml", net.encode())
    _check_golden("astra_system.json", (tmp_path / "system.json").read_bytes())
    _check_golden("chakra_allgather_8.0.et", (tmp_path / "workload.0.et").read_bytes())


def test_export_astra_two_dims(tmp_path):
    m = export_astra(_model(), tmp_path, 32, "dual-plane:32", intra_beta=1 / 300e9)
    net = (tmp_path / "network.yml").read_text()
    assert "topology: [ Switch, Switch ]" in net and "npus_count: [ 8, 4 ]" in net
    assert m["dims"][0]["bandwidth"] == pytest.approx(300e9 / GIB)
    assert m["dims"][1]["bandwidth"] == pytest.approx(2 * 10e9 / GIB)   # two NIC ports
    sysconf = json.loads((tmp_path / "system.json").read_text())
    assert sysconf["all-gather-implementation"] == ["ring", "ring"]
    assert any("dimension by dimension" in n for n in m["system_notes"])


def test_export_refuses_to_guess_the_backend(tmp_path):
    model = _model()
    other = [dict(f, backend="gloo", library="gloo") for f in model["fits"]]
    model["fits"] += other
    with pytest.raises(UsageError, match="2 backends.*--backend"):
        export_astra(model, tmp_path, 4, None, "allgather", [1024])
    m = export_astra(model, tmp_path, 4, None, "allgather", [1024], backend="gloo")
    assert m["fit_used"].startswith("gloo/gloo allgather fit")


def test_export_astra_refuses_broadcast(tmp_path):
    with pytest.raises(UsageError, match="no broadcast"):
        export_astra(_model(), tmp_path, 4, None, "broadcast", [1024])


def test_varint():
    for v in (0, 1, 127, 128, 300, 2 ** 32, 2 ** 63 - 1):
        enc = encode_varint(v)
        assert decode_varint(enc, 0) == (v, len(enc))


def test_chakra_round_trip(tmp_path):
    nodes = [comm_coll_node(0, "ar", "allreduce", 1 << 20, duration_us=12),
             comm_coll_node(1, "a2a", "alltoall", 4096, deps=[0], start_us=12, duration_us=5,
                            pg_name="0", involved_dim=[True, False])]
    path = tmp_path / "t.0.et"
    write_trace(path, nodes, metadata={"source": "test", "ranks": 2})
    gm, back = read_trace(path)
    assert gm.version == "0.0.4" and {a.name for a in gm.attr} == {"source", "ranks"}
    assert [n.id for n in back] == [0, 1] and [n.name for n in back] == ["ar", "a2a"]
    assert node_attrs(back[0]) == {"is_cpu_op": False, "comm_type": COLL_TYPES["ALL_REDUCE"],
                                   "comm_size": 1 << 20}
    assert node_attrs(back[1])["involved_dim"] == [True, False]
    assert back[1].duration_micros == 5 and back[1].start_time_micros == 12
    assert list(back[1].ctrl_deps) == [0]
    gz = tmp_path / "t.0.et.gz"
    write_trace(gz, nodes)
    assert [n.name for n in read_trace(gz)[1]] == ["ar", "a2a"]
    _check_golden("chakra_roundtrip.0.et", path.read_bytes())
    # the golden file parses too
    assert len(read_trace(GOLDEN / "chakra_roundtrip.0.et")[1]) == 2


def test_chakra_truncated(tmp_path):
    path = tmp_path / "bad.et"
    write_trace(path, [comm_coll_node(0, "x", "allreduce", 8)])
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(UsageError, match="truncated"):
        read_trace(path)


def test_export_measured(tmp_path):
    recs = synthetic_records("allgather", "ring", [4], [1024, 4096], 1e-5, 1e-10, 0.0,
                             iterations=5)
    prefixes = export_measured(recs, tmp_path)
    assert len(prefixes) == 1
    gm, nodes = read_trace(prefixes[0] + ".3.et")
    assert len(nodes) == 10
    durs = [n.duration_micros for n in nodes]
    assert durs == [max(1, round(s)) for r in recs for s in r.samples_us]
    assert node_attrs(nodes[0])["comm_size"] == 1024 // 4
    assert nodes[5].start_time_micros > nodes[4].start_time_micros


def test_export_measured_reduce_one_file_per_op(tmp_path):
    """Chakra has REDUCE: a measured reduce is written with its whole buffer as comm_size, and
    cases that differ only in the op do not overwrite each other."""
    import dataclasses

    recs = synthetic_records("reduce", "tree", [3], [3000], 1e-5, 1e-10, 1e-11, iterations=2)
    assert recs and all(r.op == "sum" for r in recs)
    both = recs + [dataclasses.replace(r, op="max") for r in recs]
    prefixes = export_measured(both, tmp_path)
    assert len(prefixes) == 2 and len(set(prefixes)) == 2
    _, nodes = read_trace(prefixes[0] + ".2.et")
    attrs = node_attrs(nodes[0])
    assert attrs["comm_type"] == COLL_TYPES["REDUCE"]
    assert attrs["comm_size"] == recs[0].size_used


def test_astra_refuses_reduce_in_one_line(tmp_path):
    from ccbench.model.synthetic import known_model

    with pytest.raises(UsageError, match="ASTRA-sim has no reduce implementation"):
        export_astra(known_model(5e-6, 1e-10, 2e-11), tmp_path, 8, None, "reduce", [1 << 20])


def test_export_says_when_it_extrapolates(tmp_path):
    from ccbench.model.synthetic import known_model

    model = known_model(5e-6, 1e-10, 2e-11)
    m = export_astra(model, tmp_path, 64, None, "allreduce", [1 << 20, 1 << 31])
    assert "extrapolated 16x in ranks from a fit at 2,4 ranks" in m["flags"]
    assert any("2 GiB is 2x above the largest size" in f for f in m["flags"])
    assert any(n.startswith("warning: extrapolated 16x") for n in m["system_notes"])
