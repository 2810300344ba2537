"""Common code of the torch.distributed backends (gloo here; nccl and rccl subclass it)."""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib.util
import itertools
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from ccbench.backends.base import (
    AlltoallvCall,
    Backend,
    Library,
    PointToPoint,
    RankContext,
    ReplayExtras,
    SubCommunicators,
    found_or_why,
    in_sequence,
    library_line,
    timed_as,
)
from ccbench.backends.buffers import TorchBuffers
from ccbench.backends.p2p import raw_bytes
from ccbench.collectives.sendrecv import peers as sendrecv_peers
from ccbench.run.addresses import interface_of, loopback_interface, published_address
from ccbench.sysinfo import node_cores, usable_cores

#: process groups this rank has created (every rank creates them in the same order)
_GROUPS = itertools.count()


def _torch_facts() -> dict[str, Any]:
    missing = torch_missing_reason()
    if missing:
        return {"found": False, "reason": missing}
    import torch
    import torch.distributed as dist

    from ccbench.backends.nccl import nccl_version

    nccl, why = nccl_version()
    return {"found": True, "version": torch.__version__,
            "cuda_build": torch.version.cuda, "hip_build": getattr(torch.version, "hip", None),
            "distributed": dist.is_available(),
            "gloo": dist.is_available() and dist.is_gloo_available(),
            "nccl": nccl, "nccl_reason": why}


def _torch_lines(torch: dict[str, Any]) -> list[str]:
    """torch and the process-group libraries it bundles (gloo, NCCL or RCCL)."""
    if not torch.get("found"):
        return [library_line("torch", found_or_why(torch, ""))]
    build = (f"CUDA {torch['cuda_build']}" if torch.get("cuda_build") else
             f"ROCm/HIP {torch['hip_build']}" if torch.get("hip_build") else "CPU-only")
    return [library_line("torch", f"{torch['version']} ({build} build)"),
            library_line("gloo", f"{'yes' if torch.get('gloo') else 'no'} (bundled with torch)"),
            library_line("nccl", torch.get("nccl") or f"none: {torch.get('nccl_reason')}")]


#: torch, for every torch.distributed backend
TORCH = Library("torch", _torch_facts, _torch_lines)


def torch_missing_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install 'ccbench[torch]')"
    return None


def intra_op_threads(ranks_on_node: int) -> int:
    """torch's intra-op pool (the out-of-place copy, local reductions) for one rank: the cores it
    is pinned to, else its share of the node. torch's default, every core for every rank,
    makes the ranks of one node compete for cores with the library's own threads."""
    pinned, cores = usable_cores(), node_cores()
    if pinned < cores:
        return pinned
    return max(1, cores // max(1, ranks_on_node))


def _interface_where_the_ranks_are(multi_host: bool, peer: str | None) -> str | None:
    """The interface gloo should listen on. Left alone, it takes the address the host name
    resolves to, falling back to loopback where that address is not one of this host's
    (Debian's 127.0.1.1, a stale /etc/hosts line): the peers then dial 127.0.0.1 and are
    refused. So: loopback for a run on this host; across hosts, the interface that routes to
    the rendezvous `peer`, unless that address lives on loopback (a /32 host address of a
    dual-ToR host: there only the host name names it, None)."""
    loopback = loopback_interface()
    if not multi_host:
        return loopback
    name = interface_of(published_address(peer))
    return None if name == loopback else name


@contextlib.contextmanager
def _interface_while_creating(variable: str | None, name: str | None) -> Iterator[None]:
    """The library reads its interface variable when it creates a group: set it for that
    moment only, so this process's environment, and every process it starts, stays the user's
    (a setting the user or a caller made stands)."""
    if variable is None or name is None or variable in os.environ:
        yield
        return
    os.environ[variable] = name
    try:
        yield
    finally:
        os.environ.pop(variable, None)


TORCH_TIMED_CALL = ("torch.distributed's function with its arguments bound up front "
                    "(functools.partial): one Python call into torch per operation")


class TorchDistBackend(Backend):
    """One torch.distributed process group; buffers are torch tensors on `self.device`."""

    process_group_backend: ClassVar[str]
    libraries = (TORCH,)

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        if "OMP_NUM_THREADS" not in os.environ:      # the user's explicit choice stands
            torch.set_num_threads(intra_op_threads(ctx.local_world_size))
        self.device = self._device()
        self.buffers = TorchBuffers(torch, self.device)
        self._ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                     "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT,
                     "avg": dist.ReduceOp.AVG}
        # the library's own timeout stays above ccbench's, so the watchdog speaks first
        timeout = datetime.timedelta(seconds=ctx.options.timeout + 30)
        self._interface = _interface_where_the_ranks_are(ctx.options.multi_host,
                                                         self._rendezvous_host())
        if not dist.is_initialized():
            rendezvous = ({"init_method": "env://"} if ctx.launcher == "torchrun"
                          else {"store": self._store(timeout)})
            with self._creating_groups():
                dist.init_process_group(self.process_group_backend, rank=ctx.rank,
                                        world_size=ctx.world_size, timeout=timeout,
                                        **rendezvous)
        self.group: Any = None       # a sub-communicator (trace replay); None: every rank
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                                or dist.reduce_scatter_tensor)

    def _creating_groups(self) -> contextlib.AbstractContextManager[None]:
        return _interface_while_creating(self.interface_variable, self._interface)

    def _rendezvous_host(self) -> str | None:
        """The host the ranks meet at: torchrun's MASTER_ADDR, else the control store's."""
        if self.ctx.launcher == "torchrun":
            return os.environ.get("MASTER_ADDR")
        address = getattr(self.ctx.store, "address", None)
        return str(address[0]) if address else None

    def _device(self) -> Any:
        return self.torch.device("cpu")

    def _store(self, timeout: datetime.timedelta) -> Any:
        """torch's rendezvous store, hosted by rank 0 on a socket bound where the ranks are
        (loopback for a run on this host, the published address across hosts: torch's own
        binds every interface), its address published in the control store."""
        # one key per process group of the run: a later backend (gloo after ring@gloo, which
        # destroyed the group) must not read the address of the previous one
        key = f"torch/{self.process_group_backend}/address/{next(_GROUPS)}"
        if self.ctx.rank == 0:
            host = published_address() if self.ctx.options.multi_host else "127.0.0.1"
            listener = socket.create_server((host, 0), backlog=1024)
            port = listener.getsockname()[1]
            store = self.dist.TCPStore(host, port, self.ctx.world_size, is_master=True,
                                       timeout=timeout, wait_for_workers=False,
                                       master_listen_fd=listener.detach())
            self.ctx.store.set(key, f"{host}:{port}")
            return store
        host, _, port_text = str(self.ctx.store.get(key, timeout=self.ctx.options.timeout)
                                 ).rpartition(":")
        return self.dist.TCPStore(host, int(port_text), self.ctx.world_size, is_master=False,
                                  timeout=timeout)

    # -- the collectives: torch.distributed's own functions with their arguments bound -------
    def _in_group(self) -> dict[str, Any]:
        """The keyword a sub-communicator's call takes (trace replay); none on every rank."""
        return {} if self.group is None else {"group": self.group}

    def _broadcast(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if self.group is None:
            return functools.partial(self.dist.broadcast, recv, root)
        return functools.partial(self.dist.broadcast, recv, group=self.group, group_src=root)

    def _allreduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        call = functools.partial(self.dist.all_reduce, recv, self._ops[op], **self._in_group())
        if send is recv:
            return call
        return in_sequence(functools.partial(recv.copy_, send), call)   # no out-of-place one

    def _allgather(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return functools.partial(self._all_gather, recv, send, **self._in_group())

    def _reduce_scatter_call(self, send: Any, recv: Any, op: str, root: int
                             ) -> Callable[[], None]:
        return functools.partial(self._reduce_scatter, recv, send, self._ops[op],
                                 **self._in_group())

    def _alltoall(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if send is not recv:
            return functools.partial(self.dist.all_to_all_single, recv, send, **self._in_group())
        all_to_all, group = self.dist.all_to_all_single, self._in_group()

        def in_place() -> None:                  # all_to_all_single cannot alias its buffers
            all_to_all(recv, send.clone(), **group)
        return in_place

    def _reduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if self.group is None:
            call = functools.partial(self.dist.reduce, recv, root, self._ops[op])
        else:
            call = functools.partial(self.dist.reduce, recv, op=self._ops[op], group=self.group,
                                     group_dst=root)
        if send is recv:
            return call
        return in_sequence(functools.partial(recv.copy_, send), call)   # in place only

    @timed_as("torch.distributed batch_isend_irecv of an isend to rank+1 and an irecv from "
              "rank-1, then a wait on each (no sendrecv function in torch.distributed): "
              "several Python calls into torch per operation")
    def _sendrecv(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return functools.partial(self._send_and_receive, send, recv)

    def _gather(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        """The root's blocks are views of its receive buffer: torch fills them in place."""
        me = self.ctx.rank if self.group is None else self.dist.get_rank(self.group)
        blocks = list(recv.split(send.numel())) if me == root else None
        if self.group is None:
            return functools.partial(self.dist.gather, send, blocks, root)
        return functools.partial(self.dist.gather, send, blocks, group=self.group,
                                 group_dst=root)

    def _scatter(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        """The root's blocks are views of its send buffer."""
        me = self.ctx.rank if self.group is None else self.dist.get_rank(self.group)
        blocks = list(send.split(recv.numel())) if me == root else None
        if self.group is None:
            return functools.partial(self.dist.scatter, recv, blocks, root)
        return functools.partial(self.dist.scatter, recv, blocks, group=self.group,
                                 group_src=root)

    builders = {"broadcast": _broadcast, "allreduce": _allreduce, "allgather": _allgather,
                "reduce-scatter": _reduce_scatter_call, "alltoall": _alltoall,
                "reduce": _reduce, "sendrecv": _sendrecv, "gather": _gather,
                "scatter": _scatter}

    def local_copy(self, collective: str, send: Any, recv: Any) -> Callable[[], Any] | None:
        """The copy the timed call makes besides the library call (torch has no out-of-place
        all_reduce or reduce; all_to_all_single cannot alias), timed alone so records can show
        it."""
        if collective in ("allreduce", "reduce") and send is not recv:
            return functools.partial(recv.copy_, send)
        if collective == "alltoall" and send is recv:
            return send.clone
        return None

    def _send_and_receive(self, send: Any, recv: Any) -> None:
        world = self.ctx.world_size if self.group is None else self.dist.get_world_size(self.group)
        if world == 1:                       # a rank cannot message itself here: nccl-tests'
            recv.copy_(send)                 # one-rank sendrecv is a local copy too
            return
        me = self.ctx.rank if self.group is None else self.dist.get_rank(self.group)
        dst, src = sendrecv_peers(me, world)
        dist = self.dist
        if self.group is None:
            ops = [dist.P2POp(dist.isend, send, dst), dist.P2POp(dist.irecv, recv, src)]
        else:
            ops = [dist.P2POp(dist.isend, send, group=self.group, group_peer=dst),
                   dist.P2POp(dist.irecv, recv, group=self.group, group_peer=src)]
        for work in dist.batch_isend_irecv(ops):   # one group: NCCL needs both posted at once
            work.wait()

    @property
    def p2p(self) -> PointToPoint[TorchDistBackend]:
        return TorchMessages(self)

    @property
    def replay_extras(self) -> ReplayExtras[TorchDistBackend]:
        return _TorchReplay(self)

    @property
    def groups(self) -> SubCommunicators[TorchDistBackend]:
        return _TorchGroups(self)

    def barrier(self) -> None:
        self.dist.barrier(group=self.group)

    def finalize(self) -> None:
        if self.group is not None:   # a sub-communicator: the whole one is finalised once
            return
        if self.dist.is_initialized():
            self.dist.destroy_process_group()

    def _env(self, *prefixes: str) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k.startswith(prefixes)}


class TorchMessages(PointToPoint[TorchDistBackend]):
    """torch.distributed's send and recv on the backend's group (a library whose transport
    serves the algorithms/ schedules adds it: gloo, nccl)."""

    blocking = True

    def send(self, buf: Any, peer: int, tag: int = 0) -> None:
        backend = self.backend
        if backend.group is None:
            backend.dist.send(buf, dst=peer, tag=tag)
        else:
            backend.dist.send(buf, group=backend.group, group_dst=peer, tag=tag)

    def recv(self, buf: Any, peer: int, tag: int = 0) -> None:
        backend = self.backend
        if backend.group is None:
            backend.dist.recv(buf, src=peer, tag=tag)
        else:
            backend.dist.recv(buf, group=backend.group, group_src=peer, tag=tag)


class _TorchReplay(ReplayExtras[TorchDistBackend]):
    def uneven_alltoall(self) -> AlltoallvCall | str:
        """all_to_all_single with split sizes, on this communicator's group."""
        dist, group = self.backend.dist, self.backend.group
        return lambda send, recv, s_in, s_out: dist.all_to_all_single(
            recv, send, s_out, s_in, group=group)


class _TorchGroups(SubCommunicators[TorchDistBackend]):
    def split(self, groups: Sequence[Sequence[int]], timeout: float
              ) -> list[Backend | str | None]:
        """`new_group` per group (every rank creates every group); calls pass `group=`."""
        backend = self.backend
        out: list[Backend | str | None] = []
        for ranks in groups:
            with backend._creating_groups():
                group = backend.dist.new_group(list(ranks))
            if backend.ctx.rank not in ranks:
                out.append(None)
                continue
            sub = self.on_group(ranks)
            sub.group = group
            out.append(sub)
        return out


# -- point to point: algorithms.transport over isend/irecv -------------------------------------

def _host_tensor(torch: Any) -> Callable[[Any], Any]:
    def tensor_of(buf: Any) -> Any:
        return torch.from_numpy(raw_bytes(buf))
    return tensor_of


class _TorchRequest:
    __slots__ = ("on_stream", "work")

    def __init__(self, work: Any, on_stream: bool) -> None:
        self.work, self.on_stream = work, on_stream

    def wait(self, timeout: float | None = None) -> None:
        # on a device, wait() orders the current stream after the transfer; with a timeout
        # torch would block the host instead, so the op timeout is left to NCCL's watchdog
        # (process-group timeout) and ccbench's
        if timeout is None or self.on_stream:
            self.work.wait()
        else:
            self.work.wait(datetime.timedelta(seconds=timeout))


class TorchTransport:
    """algorithms.transport over torch.distributed isend/irecv. `tensor_of` makes the uint8
    tensor sharing a slice's memory (host: torch.from_numpy; device: torch.as_tensor on the
    CuPy array); `on_stream`: the process group orders waits on the device stream (NCCL)."""

    def __init__(self, dist: Any, tensor_of: Callable[[Any], Any], *, on_stream: bool = False,
                 group: Any = None) -> None:
        self.dist, self.tensor_of, self.on_stream, self.group = dist, tensor_of, on_stream, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    @classmethod
    def host(cls, dist: Any, torch: Any, group: Any = None) -> TorchTransport:
        return cls(dist, _host_tensor(torch), group=group)

    def isend(self, buf: Any, peer: int, tag: int) -> _TorchRequest:
        return _TorchRequest(self.dist.isend(self.tensor_of(buf), peer, group=self.group,
                                             tag=tag), self.on_stream)

    def irecv(self, buf: Any, peer: int, tag: int) -> _TorchRequest:
        return _TorchRequest(self.dist.irecv(self.tensor_of(buf), peer, group=self.group,
                                             tag=tag), self.on_stream)


class GroupedTorchTransport(TorchTransport):
    """TorchTransport whose steps are prepared once and posted as one batch_isend_irecv."""

    def prepare(self, sends: list[tuple[Any, int, int]],
                recvs: list[tuple[Any, int, int]]) -> _TorchPrepared:
        dist, group = self.dist, self.group
        ops = [dist.P2POp(dist.irecv, self.tensor_of(b), peer, group, tag)
               for b, peer, tag in recvs]
        ops += [dist.P2POp(dist.isend, self.tensor_of(b), peer, group, tag)
                for b, peer, tag in sends]
        return _TorchPrepared(dist, ops, len(recvs), self.on_stream)


class _TorchPrepared:
    __slots__ = ("dist", "num_recvs", "on_stream", "ops", "works")

    def __init__(self, dist: Any, ops: list[Any], num_recvs: int, on_stream: bool) -> None:
        self.dist, self.ops, self.num_recvs, self.on_stream = dist, ops, num_recvs, on_stream
        self.works: list[_TorchRequest | None] = []

    def start(self) -> None:
        self.works = [_TorchRequest(w, self.on_stream)
                      for w in self.dist.batch_isend_irecv(self.ops) or ()]

    def wait_recv(self, i: int, timeout: float | None) -> None:
        if len(self.works) != len(self.ops):   # a coalesced group: one work for all its ops
            self.wait_all(timeout)
            return
        work = self.works[i]
        if work is not None:
            # each work is waited for once: a second wait on a finished gloo receive blocks
            self.works[i] = None
            work.wait(timeout)

    def wait_all(self, timeout: float | None) -> None:
        works, self.works = self.works, []
        for work in works:
            if work is not None:
                work.wait(timeout)

    def free(self) -> None:
        self.ops, self.works = [], []
