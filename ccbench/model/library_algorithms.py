"""The algorithm a library runs when the record says "native", where it is known.

`calibrate` prices a native record with the formula of the algorithm its library really
runs, instead of choosing among every candidate by fit quality, when that algorithm is
fixed:

* gloo's all-to-all (torch `all_to_all_single` -> gloo/alltoall.cc) posts every send and
  every recv at once and then waits for all of them: the `direct` schedule, whatever the
  size or world size. On one switch it costs like pairwise; where links beyond the rank's
  own are shared (an oversubscribed spine) only a replay of the direct schedule prices it.
* Intel MPI chooses its algorithm per size and world size from tuning tables ccbench
  cannot see, unless I_MPI_ADJUST_<COLLECTIVE> fixes it: the records keep the variable
  (environment.variables, read by the MPI backend from the rank's environment), and the
  ids below are Intel MPI 2021's. A value with size ranges ("8:0-1024;...") or an id
  without a formula here leaves the record native.
"""

from __future__ import annotations

from typing import Any

__all__ = ["INTEL_MPI_ADJUST", "library_algorithm"]

GLOO_ALLTOALL = ("direct", "gloo's all-to-all posts every send and recv at once "
                 "(gloo/alltoall.cc)")

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
    "reduce-scatter": ("I_MPI_ADJUST_REDUCE_SCATTER", {
        "1": ("recursive-halving", "recursive halving"),
        # p-1 steps of n/p each, every step a reduction of n/p: the ring formula's cost
        "2": ("ring", "pairwise exchange")}),
    "alltoall": ("I_MPI_ADJUST_ALLTOALL", {
        "1": ("bruck", "Bruck's"),
        "2": ("direct", "Isend/Irecv + waitall"),
        "3": ("pairwise", "pairwise exchange")}),
}


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
    if record.backend == "gloo" and record.collective == "alltoall":
        return GLOO_ALLTOALL
    if "intel" in str(record.library).lower() and record.collective in INTEL_MPI_ADJUST:
        name, table = INTEL_MPI_ADJUST[record.collective]
        value = str(_variables(record.environment or {}).get(name, "")).strip()
        if value in table:
            formula, what = table[value]
            return formula, f"Intel MPI with {name}={value} ({what})"
    return None
