"""The backend registry as data: for every backend, the module and class that implement it
and the facts about it that layers which may not import a backend need (report/ and model/
read records, never a backend): the name users see, its plot colour and marker, the
libraries it may turn out to be, the algorithms its library is documented to run.

This is the one module outside ccbench/backends/ that names backends. It imports nothing, so
that every layer may read it; ccbench/backends/ builds its registry from it, and each
backend class takes its display name from its entry. A new backend is its module under
ccbench/backends/ plus one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BACKENDS", "BackendFacts", "Implementation", "facts_of"]


@dataclass(frozen=True)
class Implementation:
    """One library a backend may run on, told apart by what the record says of it."""

    #: text found in the record's library and library_version ("Intel" in "Intel(R) MPI ...")
    marker: str
    #: what reports call it ("Intel MPI")
    name: str
    colour: str
    plot_marker: str


@dataclass(frozen=True)
class BackendFacts:
    """What is known of a backend without importing it."""

    #: the registry name (--backend, the record's `backend`)
    name: str
    #: "module:Class", imported only when the backend is used
    target: str
    #: what doctor, tables and reports show the user
    display_name: str
    colour: str
    plot_marker: str
    #: the libraries it may be (MPI: Intel MPI, MPICH ...), in the order legends show them; a
    #: report labels a series by the one its record names. Empty: the backend is its library.
    implementations: tuple[Implementation, ...] = ()
    #: collective -> (cost-formula key, why): the algorithm its library always runs for that
    #: collective, whatever the size, read from the library's source
    fixed_algorithms: dict[str, tuple[str, str]] = field(default_factory=dict)

    def implementation(self, text: str) -> Implementation | None:
        """The implementation `text` (a record's library and version) names, if any: the
        most specific marker it holds (MVAPICH's text may also say MPICH)."""
        found = [impl for impl in self.implementations if impl.marker in text]
        return max(found, key=lambda impl: len(impl.marker), default=None)


# Colours: Okabe-Ito and Paul Tol's colour-blind-safe sets, chosen so that the series one
# figure shows together differ in hue, not only in lightness (gloo blue, Intel MPI
# vermillion, MPICH green, Open MPI purple, oneCCL near black); report/style.py keeps those of
# the algorithms, against their library's vermillion.
_MPI_LIBRARIES = (
    Implementation("Intel", "Intel MPI", "#D55E00", "s"),          # vermillion
    Implementation("MPICH", "MPICH", "#009E73", "^"),              # bluish green
    Implementation("Open MPI", "Open MPI", "#CC79A7", "D"),        # reddish purple
    Implementation("MVAPICH", "MVAPICH", "#882255", "v"),          # wine
)

BACKENDS: dict[str, BackendFacts] = {facts.name: facts for facts in (
    BackendFacts("gloo", "ccbench.backends.gloo:GlooBackend", "Gloo (torch.distributed)",
                 "#0072B2", "o",                                   # blue
                 fixed_algorithms={"alltoall": (
                     "direct", "gloo's all-to-all posts every send and recv at once "
                               "(gloo/alltoall.cc)")}),
    BackendFacts("mpi", "ccbench.backends.mpi:MPIBackend", "MPI", "#D55E00", "s",
                 implementations=_MPI_LIBRARIES),
    BackendFacts("oneccl", "ccbench.backends.oneccl:OneCCLBackend", "oneCCL",
                 "#1A1A1A", "P"),                                  # near black
    BackendFacts("nccl", "ccbench.backends.nccl:NCCLBackend", "NCCL (torch.distributed)",
                 "#76B900", "X"),
    BackendFacts("nccl-cupy", "ccbench.backends.nccl_cupy:NCCLCupyBackend", "NCCL (CuPy)",
                 "#6699CC", "d"),
    BackendFacts("rccl", "ccbench.backends.nccl:RCCLBackend", "RCCL (torch.distributed)",
                 "#B40000", "*"),
)}


def facts_of(backend: str) -> BackendFacts | None:
    """The entry of a registry name, or of an algorithm's transport (`ring@mpi` -> mpi's);
    None for a backend registered at run time (a plugin) or an unknown name."""
    return BACKENDS.get(backend.rpartition("@")[2])
