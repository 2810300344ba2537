"""mpi: MPI collectives through mpi4py on numpy buffers (MPICH, Open MPI or Intel MPI:
whichever libmpi mpi4py loads; MPI.Get_library_version() goes into every record)."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ccbench.backends.base import Backend, HostBuffers, RankContext
from ccbench.errors import RunFailure


def _library_name(version: str) -> str:
    for marker, name in (("Intel", "Intel MPI"), ("Open MPI", "Open MPI"),
                         ("MPICH", "MPICH"), ("MVAPICH", "MVAPICH")):
        if marker in version:
            return name
    return version.split()[0] if version else "MPI"


def _raw(buf: np.ndarray) -> np.ndarray:
    """bfloat16 has no MPI datatype; moving it needs none: send its 16-bit patterns."""
    return buf.view(np.uint16) if buf.dtype.name == "bfloat16" else buf


class MPIBackend(HostBuffers, Backend):
    name = "mpi"
    needs_mpi_launcher = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install 'ccbench[mpi]')"
        try:
            from mpi4py import MPI  # noqa: F401  (loads libmpi)
        except (ImportError, RuntimeError) as exc:
            return f"mpi4py cannot load an MPI library: {exc}"
        return None

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD.Dup()
        if self.comm.Get_size() != ctx.world_size:
            raise RunFailure(f"MPI world has {self.comm.Get_size()} ranks but the launcher "
                             f"said {ctx.world_size}: start the mpi backend with mpiexec")
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}
        self._probed: dict[tuple[str, str], str | None] = {}
        self.version = MPI.Get_library_version().strip()

    def unsupported(self, collective: str, dtype: np.dtype, op: str | None) -> str | None:
        if op is None:
            return None
        if dtype.name == "bfloat16":
            return "unsupported by mpi: MPI has no bfloat16 datatype to reduce"
            return None
        key = (dtype.name, op)
        if key not in self._probed:       # every rank probes the same keys in the same order
            one = np.ones(1, dtype=dtype)
            out = np.empty_like(one)
            try:
                self.comm.Allreduce(one, out, op=self._ops[op])
                self._probed[key] = None
            except self.MPI.Exception as exc:
                reason = exc.Get_error_string().splitlines()[0]
                self._probed[key] = f"unsupported by mpi: {op} on {dtype.name} ({reason})"
        return self._probed[key]

    def info(self) -> dict[str, Any]:
        first_line = self.version.splitlines()[0] if self.version else ""
        prefixes = ("MPIR_", "MPICH_", "OMPI_MCA_", "I_MPI_", "FI_", "UCX_", "PMI_", "HYDRA_")
        return {"library": _library_name(self.version), "library_version": first_line,
                "device": "cpu",
                "env": {k: v for k, v in os.environ.items()
                        if k.startswith(prefixes) and "RANK" not in k}}

    def bind(self, collective: str, send: Any, recv: Any, op: str | None, root: int
             ) -> Callable[[], None]:
        """mpi4py's own bound call for the common cases (a Python frame less per op)."""
        comm, in_place = self.comm, self.MPI.IN_PLACE
        if collective == "allreduce":
            return functools.partial(comm.Allreduce, in_place if send is recv else send, recv,
                                     self._ops[op or "sum"])
        if collective == "broadcast":
            return functools.partial(comm.Bcast, _raw(recv), root)
        if collective == "alltoall" and send is not recv:
            return functools.partial(comm.Alltoall, _raw(send), _raw(recv))
        return super().bind(collective, send, recv, op, root)

    def broadcast(self, buf: Any, root: int) -> None:
        self.comm.Bcast(_raw(buf), root=root)

    def allreduce(self, send: Any, recv: Any, op: str) -> None:
        self.comm.Allreduce(self.MPI.IN_PLACE if send is recv else send, recv, op=self._ops[op])

    def allgather(self, send: Any, recv: Any) -> None:
        if np.may_share_memory(send, recv):       # my shard already sits in the output
            self.comm.Allgather(self.MPI.IN_PLACE, _raw(recv))
        else:
            self.comm.Allgather(_raw(send), _raw(recv))

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> None:
        if np.may_share_memory(send, recv):
            # MPI's in-place result lands at the start of the buffer; ccbench's (and NCCL's)
            # convention is this rank's slice, so move it there (one block copy)
            self.comm.Reduce_scatter_block(self.MPI.IN_PLACE, send, op=self._ops[op])
            if self.comm.Get_rank() != 0:
                recv[...] = send[:recv.size]
        else:
            self.comm.Reduce_scatter_block(send, recv, op=self._ops[op])

    def alltoall(self, send: Any, recv: Any) -> None:
        self.comm.Alltoall(self.MPI.IN_PLACE if send is recv else _raw(send), _raw(recv))

    def send(self, buf: Any, peer: int, tag: int = 0) -> None:
        self.comm.Send(buf, dest=peer, tag=tag)

    def recv(self, buf: Any, peer: int, tag: int = 0) -> None:
        self.comm.Recv(buf, source=peer, tag=tag)

    def barrier(self) -> None:
        self.comm.Barrier()

    def finalize(self) -> None:
        self.comm.Free()
