"""The algorithm a library runs when the record says "native", where it is known.

`calibrate` prices a native record with the formula of the algorithm its library really
runs, instead of choosing among every candidate by fit quality, when that algorithm is
fixed:

* gloo's all-to-all (torch `all_to_all_single` -> gloo/alltoall.cc) posts every send and
  every recv at once and then waits for all of them: the `direct` schedule, whatever the
  size or world size. On one switch it costs like pairwise; where links beyond the rank's
  own are shared (an oversubscribed spine) only a replay of the direct schedule prices it.
  A backend's fixed algorithms are facts of its entry in ccbench/backend_facts.py.
* Intel MPI chooses its algorithm per size and world size from tuning tables ccbench
  cannot see, unless I_MPI_ADJUST_<COLLECTIVE> fixes it: the records keep the variable
  (environment.variables, read by the MPI backend from the rank's environment), and the
  ids below are Intel MPI 2021's. A value with size ranges ("8:0-1024;...") or an id
  without a formula here leaves the record native. ccbench's reduce-scatter calls
  MPI_Reduce_scatter_block, which I_MPI_ADJUST_REDUCE_SCATTER_BLOCK governs (not
  I_MPI_ADJUST_REDUCE_SCATTER, MPI_Reduce_scatter's). Measured on the testbed (3 hosts,
  100 Mbit/s): below 1 MiB Intel MPI ran the same path, at 0.3-0.4 of the link, under every
  id (0-4), so that id fixes its algorithm from 1 MiB only and is not mapped here.
* MPICH reads MPIR_CVAR_<COLLECTIVE>_INTRA_ALGORITHM (its algorithms are in its open
  source, src/mpi/coll/) and honours it at every size. `scattered` all-to-all posts
  MPIR_CVAR_ALLTOALL_THROTTLE (default 32) sends and receives at a time: the direct schedule
  while the world size is at most that.
"""

from __future__ import annotations

from typing import Any

from ccbench.backend_facts import BACKENDS

__all__ = ["INTEL_MPI_ADJUST", "MPICH_CVARS", "library_algorithm"]


#: collective -> (variable, {id: (formula key, Intel MPI's name)})
INTEL_MPI_ADJUST: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "allreduce": ("I_MPI_ADJUST_ALLREDUCE", {
        "1": ("recursive-doubling", "recursive doubling"),
        "2": ("rabenseifner", "Rabenseifner's"),
        "8": ("ring", "ring")}),
    "allgather": ("I_MPI_ADJUST_ALLGATHER", {
        "1": ("recursive-doubling", "recursive doubling"),
        "2": ("bruck", "Bruck's"),
        "3": ("ring", "ring")}),
    "alltoall": ("I_MPI_ADJUST_ALLTOALL", {
        "1": ("bruck", "Bruck's"),
        "2": ("direct", "Isend/Irecv + waitall"),
        "3": ("pairwise", "pairwise exchange")}),
}


#: collective -> (variable, {value: (formula key, MPICH's name)})
MPICH_CVARS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "allreduce": ("MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM", {
        "recursive_doubling": ("recursive-doubling", "recursive doubling"),
        "reduce_scatter_allgather": ("rabenseifner", "reduce-scatter + allgather"),
        "ring": ("ring", "ring")}),
    "allgather": ("MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM", {
        "brucks": ("bruck", "Bruck's"),
        "ring": ("ring", "ring")}),
    "reduce-scatter": ("MPIR_CVAR_REDUCE_SCATTER_BLOCK_INTRA_ALGORITHM", {
        # p-1 steps of n/p each, every step a reduction of n/p: the ring formula's cost
        "pairwise": ("ring", "pairwise exchange")}),
    "alltoall": ("MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM", {
        "brucks": ("bruck", "Bruck's"),
        "scattered": ("direct", "Isend/Irecv, all at once up to MPIR_CVAR_ALLTOALL_THROTTLE"),
        "pairwise": ("pairwise", "pairwise exchange")}),
}
_MPICH_THROTTLE = "MPIR_CVAR_ALLTOALL_THROTTLE"


def _variables(environment: dict[str, Any]) -> dict[str, Any]:
    found = environment.get("variables")
    if isinstance(found, dict):
        return found
    backend = environment.get("backend")
    if isinstance(backend, dict) and isinstance(backend.get("env"), dict):
        return backend["env"]
    return {}


def library_algorithm(record: Any) -> tuple[str, str] | None:
    """(formula key, why) for a native record whose library's algorithm is fixed, else None."""
    if record.algorithm != "native":
        return None
    facts = BACKENDS.get(record.backend)
    if facts is not None and record.collective in facts.fixed_algorithms:
        return facts.fixed_algorithms[record.collective]
    library = str(record.library).lower()
    variables = _variables(record.environment or {})
    if "intel" in library:
        return _fixed_by(INTEL_MPI_ADJUST, "Intel MPI", record.collective, variables)
    if "mpich" in library:
        known = _fixed_by(MPICH_CVARS, "MPICH", record.collective, variables)
        throttle = str(variables.get(_MPICH_THROTTLE, "32")).strip()
        all_at_once = throttle == "0" or (throttle.isdigit()
                                          and record.world_size <= int(throttle))
        if known and known[0] == "direct" and not all_at_once:
            return None                    # posted in batches: neither direct nor pairwise
        return known
    return None


def _fixed_by(table: dict[str, tuple[str, dict[str, tuple[str, str]]]], library: str,
              collective: str, variables: dict[str, Any]) -> tuple[str, str] | None:
    if collective not in table:
        return None
    name, ids = table[collective]
    value = str(variables.get(name, "")).strip()
    if value not in ids:
        return None
    formula, what = ids[value]
    return formula, f"{library} with {name}={value} ({what})"
