"""A new backend is its module plus one registry line: a backend class defined here and
registered by name alone is listed by `ccbench doctor` with its own display name, verdict,
version and library, and runs a collective in this process (world size 1) with every
element checked. Trace replay's calls outside the registry (send/recv, exchanges, alltoallv)
need nothing more: a backend without them is skipped with its reason, and one that offers
them (`p2p`: `send`/`recv` and `transport`; `replay_extras.uneven_alltoall`) is replayed on them."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_ccbench

import ccbench
from algorithms.transport import ThreadFabric, Transport
from ccbench.backends import REGISTRY
from ccbench.backends.base import (
    AlltoallvCall,
    Backend,
    BackendInfo,
    Library,
    PointToPoint,
    RankContext,
    ReplayExtras,
    in_sequence,
    library_line,
    timed_as,
)
from ccbench.records import load_records
from ccbench.replay.extra import ExtraCall
from ccbench.trace.ops import CommOp, Group

NAME = "copyonly"


def _facts() -> dict[str, Any]:
    return {"found": True, "version": "1.2.3"}


class CopyOnlyBackend(Backend):
    """One rank's allreduce and broadcast, done by numpy (all a world of one needs)."""

    name = NAME
    display_name = "Copy-only (numpy, one rank)"
    libraries = (Library("copylib", _facts, lambda facts: [library_line("copylib",
                                                                        facts["version"])]),)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    @classmethod
    def probe_version(cls) -> str | None:
        return "copylib 1.2.3"

    def info(self) -> BackendInfo:
        return {"library": "copylib", "library_version": "1.2.3", "device": "cpu", "env": {}}

    def _allreduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return functools.partial(np.copyto, recv, send)

    def _broadcast(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return lambda: None

    builders = {"allreduce": _allreduce, "broadcast": _broadcast}
    lacks = {"alltoall": "a world of one is all this backend knows"}

    def barrier(self) -> None:
        return None


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line a new backend adds to ccbench/backends/__init__.py."""
    monkeypatch.setitem(REGISTRY, NAME, f"{__name__}:CopyOnlyBackend")


def test_doctor_lists_it_from_its_own_answers(registered: None) -> None:
    from ccbench.commands.doctor import collect, render_table

    report = collect()
    rows = {row["name"]: row for row in report["backends"]}
    assert rows[NAME] == {"name": NAME, "kind": "library", "display": "Copy-only (numpy, one rank)",
                          "available": True, "reason": None, "version": "copylib 1.2.3"}
    assert report["libraries"]["copylib"] == {"found": True, "version": "1.2.3"}
    table = render_table(report)
    assert any(line.split()[:2] == [NAME, "Copy-only"] and " available    copylib 1.2.3"
               in line for line in table.splitlines()), table
    assert "  copylib  1.2.3" in table.splitlines()


def test_launch_checks_it_once_before_any_rank_starts(registered: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`ccbench launch` asks the backend itself (quiet probes first, then availability) and
    says in one line why it cannot run here."""
    from ccbench.backends import check_launchable
    from ccbench.errors import BackendUnavailable

    probed: list[str] = []
    monkeypatch.setattr(CopyOnlyBackend, "quiet_probes",
                        classmethod(lambda cls: probed.append(cls.name)))
    assert check_launchable([NAME]) == {NAME: False} and probed == [NAME]
    monkeypatch.setattr(CopyOnlyBackend, "unavailable_reason",
                        classmethod(lambda cls: "copylib is not installed"))
    with pytest.raises(BackendUnavailable,
                       match=f"backend '{NAME}' unavailable: copylib is not installed"):
        check_launchable([NAME])


def test_a_collective_runs_through_it_in_process(registered: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.cli import main

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CCBENCH_CONTROL", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "r.jsonl"
    assert main(["allreduce", "--backend", NAME, "--sizes", "8,1K", "-q", "--iters", "2",
                 "--warmup", "1", "--output", str(out)]) == 0
    records = load_records(out)
    assert {(r.backend, r.library, r.collective) for r in records} == {
        (NAME, "copylib", "allreduce")}
    assert len(records) == 4 and all(r.wrong == 0 for r in records)   # 2 sizes x 2 modes


# -- the calls of a trace outside the registry: what a new backend may leave out -----------

def _context() -> RankContext:
    return RankContext(rank=0, world_size=1, local_rank=0, local_world_size=1,
                       launcher="single", store=None, hostname="test")  # type: ignore[arg-type]


def _trace_op(collective: str, **fields: Any) -> CommOp:
    return CommOp(rank=0, index=0, node_id=1, name=collective, collective=collective,
                  dtype="float32", elsize=4, in_bytes=48, out_bytes=48,
                  group=Group("world", (0,)), **fields)


_SEND, _RECV = _trace_op("send", peer=0), _trace_op("recv", peer=0)
_ALLTOALLV = _trace_op("alltoallv", in_splits=(12,), out_splits=(12,))


def test_a_backend_need_not_offer_messages_or_an_uneven_all_to_all() -> None:
    """Nothing beyond the collectives is required: trace replay skips its send/recv,
    exchanges and alltoallv with a reason naming the backend (the base class's answers)."""
    from ccbench.replay.extra import prepare, prepare_exchange

    backend = CopyOnlyBackend(_context())
    assert prepare(backend, _SEND, 0, 10.0) == (
        f"{NAME}: no point-to-point messages, and no transport to carry them")
    assert prepare_exchange(backend, [_SEND, _RECV], 0, 10.0) == (
        f"{NAME}: no non-blocking point-to-point messages to post an exchange with")
    assert prepare(backend, _ALLTOALLV, 0, 10.0) == f"{NAME}: no uneven all-to-all"


class MessagingBackend(CopyOnlyBackend):
    """The same with messages (to itself, through a one-rank in-process fabric) and an
    uneven all-to-all: what trace replay's send/recv, exchanges and alltoallv run on."""

    def __init__(self, ctx: RankContext, copies: bool = True) -> None:
        super().__init__(ctx)
        self.fabric, self.copies = ThreadFabric(1, timeout=10.0), copies

    @property
    def p2p(self) -> PointToPoint[MessagingBackend]:
        return _FabricMessages(self)

    @property
    def replay_extras(self) -> ReplayExtras[MessagingBackend]:
        return _FabricReplay(self)


class _FabricMessages(PointToPoint[MessagingBackend]):
    blocking = True

    def send(self, buf: Any, peer: int, tag: int = 0) -> None:
        self.backend.fabric.put(self.backend.ctx.rank, peer, tag, buf.copy())

    def recv(self, buf: Any, peer: int, tag: int = 0) -> None:
        buf[...] = self.backend.fabric.take(peer, self.backend.ctx.rank, tag, 10.0)

    def transport(self, device: bool) -> Transport | None:
        return None if device else self.backend.fabric.transport(self.backend.ctx.rank)


class _FabricReplay(ReplayExtras[MessagingBackend]):
    def uneven_alltoall(self) -> AlltoallvCall | str:
        copies = self.backend.copies

        def alltoallv(send: Any, recv: Any, s_in: list[int], s_out: list[int]) -> None:
            if copies:                          # one rank: its only block is its own
                np.copyto(recv, send)
            else:                               # a broken one: zeros arrive
                recv.fill(0)
        return alltoallv


def _run(call: ExtraCall | str) -> int:
    assert not isinstance(call, str), call
    call.run()
    return call.check()


def test_what_a_backend_offers_trace_replay_runs_bit_exact() -> None:
    """send/recv are its `p2p.send` and `p2p.recv`; an exchange posts over its `p2p.transport`
    transport (no method of its own needed); alltoallv is its `replay_extras.uneven_alltoall`."""
    from ccbench.replay.extra import prepare, prepare_exchange

    backend = MessagingBackend(_context())
    assert _run(prepare(backend, _SEND, 0, 10.0)) == 0
    assert _run(prepare(backend, _RECV, 0, 10.0)) == 0
    assert _run(prepare_exchange(backend, [_SEND, _RECV], 0, 10.0)) == 0
    assert _run(prepare(backend, _ALLTOALLV, 0, 10.0)) == 0
    assert _run(prepare(MessagingBackend(_context(), copies=False), _ALLTOALLV, 0, 10.0)) > 0


# -- a backend from another distribution: an entry point of group ccbench.backends ---------

PLUGINS = Path(__file__).resolve().parent / "fixtures" / "plugins"


def _with_plugins(*more: Path) -> dict[str, str]:
    """The fixture distributions on the path, as installed ones: `good` adds gloo-plugin,
    `broken` four entry points that must each be skipped with their reason; then `more`."""
    paths = [str(PLUGINS / "good"), str(PLUGINS / "broken"), *map(str, more),
             os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _installed_beside(tmp_path: Path) -> Path:
    """A distribution a user might have installed beside ccbench whose plugins clash with
    the fixtures' names (a broken `gloo`, a second `gloo-plugin`): its rows are its own."""
    info = tmp_path / "ccbench_other_plugins-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ccbench-other-plugins\n"
                                   "Version: 9.9\n")
    (info / "entry_points.txt").write_text("[ccbench.backends]\ngloo = no_such_module:Gloo\n"
                                           "gloo-plugin = no_such_module:Gloo\n"
                                           "missing-lib = no_such_module:Gloo\n")
    return tmp_path


@pytest.mark.parametrize("beside", [False, True], ids=["fixtures", "another-installed"])
def test_doctor_lists_entry_point_backends_and_why_broken_ones_were_skipped(
        beside: bool, tmp_path: Path) -> None:
    """The fixtures' rows, found by where each comes from: plugins installed beside ccbench
    (here `another-installed`, of the same names) add rows and change none of these."""
    env = _with_plugins(*([_installed_beside(tmp_path)] if beside else []))
    proc = run_ccbench("doctor", "--format", "json", timeout=180, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    every = json.loads(proc.stdout)["backends"]

    def one(name: str, kind: str, reason: str | None = None) -> dict[str, Any]:
        """The row of `name` (of kind `kind`) whose reason holds `reason` (None: none)."""
        found = [row for row in every if (row["name"], row["kind"]) == (name, kind)
                 and (reason in (row["reason"] or "") if reason else
                      not (row["reason"] or "").startswith("plugin skipped"))]
        assert len(found) == 1, (name, kind, reason, every)
        return found[0]

    plugin = one("gloo-plugin", "plugin")
    assert plugin["display"] == "Gloo (from a plugin)"
    assert plugin["available"] == one("gloo", "library")["available"]
    where = "from ccbench-broken-plugins 0.2): "
    expected = {
        "missing-lib": "import failed: ModuleNotFoundError: No module named "
                       "'ccbench_no_such_library'",
        "not-a-class": "ccbench_broken_plugins:not_a_class is a function, not a subclass of "
                       "ccbench.backends.base.Backend",
        "unfinished": "ccbench_broken_plugins:Unfinished is abstract: it does not define "
                      "barrier, info",
        # the built-in gloo keeps its name (its own row above): the plugin's is skipped
        "gloo": "its name clashes with the backend 'gloo' already registered",
    }
    for name, reason in expected.items():
        row = one(name, "plugin", where)
        assert row["available"] is False and row["reason"].endswith(where + reason), row
    if beside:
        assert one("gloo", "plugin", "from ccbench-other-plugins 9.9): ")["available"] is False


def test_discover_refuses_unusable_names_and_a_second_plugin_of_one_name() -> None:
    from importlib.metadata import EntryPoint

    from ccbench.backends.plugins import discover

    group = "ccbench.backends"
    good = EntryPoint(NAME, f"{__name__}:CopyOnlyBackend", group)
    plugins, broken = discover(["gloo"], [
        good, EntryPoint(NAME, f"{__name__}:MessagingBackend", group),
        EntryPoint("a,b", f"{__name__}:CopyOnlyBackend", group),
        EntryPoint("other", f"{__name__}:CopyOnlyBackend", group),
        EntryPoint("dotless", "tests_no_module", group)])
    assert [(p.name, p.target) for p in plugins] == [(NAME, good.value)]
    assert [(b.name, b.reason) for b in broken] == [
        (NAME, f"its name clashes with the backend {NAME!r} already registered"),
        ("a,b", "'a,b' is not a usable backend name (letters, digits, _ . + -)"),
        ("other", f"{__name__}:CopyOnlyBackend.name is {NAME!r}, not its entry point's name "
                  "'other'"),
        ("dotless", "'tests_no_module' is not of the form module:Class")]


def test_an_entry_point_backend_runs_under_launch_into_records_and_load(tmp_path: Path
                                                                        ) -> None:
    """The plugin runs natively and carries an algorithm (`ring@gloo-plugin`); each record
    names what it is and what was timed, and a report labels both by the plugin's name as it
    labels a built-in transport's."""
    out = tmp_path / "plugin.jsonl"
    proc = run_ccbench("launch", "-n", "2", "allreduce,sendrecv", "--backend",
                       "gloo-plugin,ring@gloo-plugin", "--sizes", "8,1K", "--iters", "2",
                       "--warmup", "1", "-q", "--output", str(out), timeout=300,
                       env=_with_plugins())
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    records = load_records(out)
    native = [r for r in records if r.backend == "gloo-plugin"]
    ring = [r for r in records if r.backend == "ring@gloo-plugin"]
    assert {(r.library, r.world_size) for r in records} == {("gloo", 2)}
    # allreduce: 2 sizes x 2 modes; sendrecv out of place only; ring has no sendrecv schedule
    assert len(native) == 6 and len(ring) == 4 and all(r.wrong == 0 for r in records)
    frame = ccbench.load(out)
    assert sorted(frame["backend"].unique()) == ["gloo-plugin", "ring@gloo-plugin"]
    # a report names its series by the plugin's display name, not as the built-in gloo
    from ccbench.backends.torch_dist import TORCH_TIMED_CALL
    from ccbench.report.data import series_label, short_version

    assert {series_label(r) for r in native} == {"Gloo (from a plugin)"}
    assert {r.environment["backend_display_name"] for r in ring} == {
        "ring over Gloo (from a plugin)"}
    # the legend's `<backend> (<version>)`: the transport's display name, as ring@gloo's
    assert {short_version(r) for r in ring} == {short_version(native[0])}
    assert short_version(native[0]).startswith("Gloo (from a plugin) ")
    # what was timed: the library call, the builder's own chain, or the schedule
    calls = {(r.backend, r.collective): r.method["timed_call"] for r in records}
    assert calls["gloo-plugin", "allreduce"] == TORCH_TIMED_CALL
    assert calls["gloo-plugin", "sendrecv"].startswith("torch.distributed batch_isend_irecv")
    assert calls["ring@gloo-plugin", "allreduce"].startswith("ccbench's ring schedule")
    assert "over Gloo (from a plugin)" in calls["ring@gloo-plugin", "allreduce"]
    assert not any("allreduce_out_of_place" in r.method for r in ring)
    old = native[0].environment.pop("backend_display_name")       # a record without it
    assert old == "Gloo (from a plugin)" and series_label(native[0]) == "gloo-plugin (gloo)"
    ring[0].environment.pop("transport_display_name")
    assert short_version(ring[0]).startswith("gloo-plugin (gloo) ")


def test_a_distribution_whose_entry_points_cannot_be_read_is_listed_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """importlib.metadata raises on a malformed entry_points.txt: ccbench skips that one
    distribution, says why, and still finds the others' backends."""
    from ccbench.backends.plugins import discover

    bad = tmp_path / "bad_backends-0.3.dist-info"
    bad.mkdir()
    (bad / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-backends\nVersion: 0.3\n")
    (bad / "entry_points.txt").write_text("[ccbench.backends]\nthis line has no equals sign\n")
    # only these two distributions on the path: a plugin the user has installed is not seen
    monkeypatch.setattr(sys, "path", [str(PLUGINS / "good"), str(tmp_path)])
    plugins, broken = discover(["gloo"])
    assert [(p.name, p.distribution) for p in plugins] == [("gloo-plugin",
                                                            "ccbench-gloo-plugin 0.1")]
    assert [(b.name, b.target, b.distribution) for b in broken] == [
        ("bad_backends", "entry_points.txt", "bad-backends 0.3")]
    assert broken[0].reason.startswith("its entry points cannot be read: "), broken[0]


def test_asking_for_a_skipped_plugin_says_why_it_was_skipped(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """`--backend <a broken plugin>` is one line with the reason doctor shows (exit 2), not
    'unknown backend'."""
    import ccbench.backends as backends
    from ccbench.backends.plugins import BrokenPlugin
    from ccbench.errors import BackendUnavailable

    skipped = BrokenPlugin("halfdone", "halfdone:Backend", "halfdone 0.1",
                           "import failed: ModuleNotFoundError: No module named 'halflib'")
    monkeypatch.setattr(backends, "BROKEN_PLUGINS", [skipped])
    with pytest.raises(BackendUnavailable) as caught:
        backends.parse_backends("halfdone")
    assert str(caught.value) == (
        "backend 'halfdone' unavailable: plugin skipped (halfdone:Backend from halfdone 0.1): "
        "import failed: ModuleNotFoundError: No module named 'halflib'")


def test_every_path_that_resolves_a_name_says_why_a_plugin_was_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--backend <broken>`, `<algorithm>@<broken>` and a sweep file's `backends:` each give
    the plugin's reason in one line, never 'unknown transport' or 'unknown backend'."""
    import ccbench.backends as backends
    from ccbench.backends.plugins import BrokenPlugin
    from ccbench.errors import BackendUnavailable, UsageError
    from ccbench.sweep.spec import sweep_from_dict

    skipped = BrokenPlugin("halfdone", "halfdone:Backend", "halfdone 0.1",
                           "import failed: ModuleNotFoundError: No module named 'halflib'")
    monkeypatch.setattr(backends, "BROKEN_PLUGINS", [skipped])
    why = ("backend 'halfdone' unavailable: plugin skipped (halfdone:Backend from halfdone "
           "0.1): import failed: ModuleNotFoundError: No module named 'halflib'")
    for name in ("halfdone", "ring@halfdone", "ring:64K@halfdone"):
        with pytest.raises(BackendUnavailable) as caught:
            backends.parse_backends(name)
        assert str(caught.value) == why, name
    for listed in (["halfdone"], ["gloo", "ring@halfdone"]):
        with pytest.raises(UsageError) as failed:
            sweep_from_dict({"collectives": ["allreduce"], "backends": listed,
                             "sizes": "1K"}, where="s.yaml")
        assert str(failed.value) == f"s.yaml: backends: {why}", listed
    # a name no plugin has stays an unknown one
    with pytest.raises(UsageError, match=r"unknown transport 'nothere' \(valid: "):
        backends.parse_backends("ring@nothere")


def test_a_skipped_plugin_as_a_transport_is_one_line_from_the_command_line() -> None:
    proc = run_ccbench("allreduce", "--backend", "ring@missing-lib", "--sizes", "1K", "-q",
                       timeout=180, env=_with_plugins())
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0] == ("ccbench: error: backend 'missing-lib' unavailable: plugin skipped "
                        "(ccbench_broken_import:Backend from ccbench-broken-plugins 0.2): "
                        "import failed: ModuleNotFoundError: No module named "
                        "'ccbench_no_such_library'"), proc.stderr


CHAIN_CALL = "two numpy copies through a scratch buffer: not one library call"


class ChainedBackend(CopyOnlyBackend):
    """A backend whose broadcast is not one library call: its builder says what it times."""

    name = "chained"
    display_name = "Chained copies"

    def info(self) -> BackendInfo:
        return {**super().info(), "timed_call": "copylib's copy with its arguments bound"}

    @timed_as(CHAIN_CALL)
    def _chain(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        scratch = np.empty_like(recv)
        return in_sequence(functools.partial(np.copyto, scratch, recv),
                           functools.partial(np.copyto, recv, scratch))

    builders = {**CopyOnlyBackend.builders, "broadcast": _chain}


def test_a_builder_says_what_it_times_and_its_records_carry_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.cli import main

    monkeypatch.setitem(REGISTRY, "chained", f"{__name__}:ChainedBackend")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CCBENCH_CONTROL", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "r.jsonl"
    assert main(["allreduce,broadcast", "--backend", "chained", "--sizes", "1K", "-q",
                 "--iters", "2", "--warmup", "1", "--output", str(out)]) == 0
    calls = {(r.collective, r.method["timed_call"]) for r in load_records(out)}
    assert calls == {("allreduce", "copylib's copy with its arguments bound"),
                     ("broadcast", CHAIN_CALL)}
    backend = ChainedBackend(_context())
    assert backend.describe_call("broadcast") == CHAIN_CALL
    assert backend.describe_call("allreduce") is None
