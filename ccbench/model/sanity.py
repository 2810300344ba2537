"""What a prediction stands on, and where it leaves the ground: flags for `simulate`/`export`.

Every prediction says which fit it used, which world sizes and sizes that fit saw, and
flags what it cannot vouch for:

* extrapolation: a rank count or a size outside what the fit saw ("extrapolated 512x in
  ranks from a fit at 2 ranks"); constants borrowed from another collective's fit; a
  formula other than the fitted one; the fit's own flags (gamma not identified, too few
  points).
* physics: busbw above the topology's bottleneck link rate (no schedule of these
  collectives beats it), links with no rate at all (a fit whose beta is 0: nothing to
  check busbw against, and no contention), and a per-step latency far above the fit's
  small-message alpha (an intercept of a large-message piece read as a latency paid on
  every step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ccbench.units import size_text

if TYPE_CHECKING:
    from ccbench.model.fit import FitEntry

__all__ = ["ALPHA_RATIO", "fit_scope", "prediction_flags", "row_flags"]

ALPHA_RATIO = 10.0     # a per-step alpha this many times the small-message alpha is flagged


def _size_text(n: float) -> str:
    return size_text(n, digits=4)


def fit_scope(fit: FitEntry) -> str:
    worlds = ",".join(map(str, fit.get("world_sizes") or [])) or "?"
    sizes = fit.get("sizes")
    seen = (f"sizes {_size_text(sizes[0])}-{_size_text(sizes[1])}" if sizes else
            "sizes not recorded (model from an older ccbench)")
    return f"fitted at {worlds} ranks, {seen}"


def prediction_flags(fit: FitEntry, why: str, collective: str, algorithm: str,
                     ranks: int) -> list[str]:
    """Flags that hold for every size of one prediction."""
    flags: list[str] = []
    worlds = fit.get("world_sizes") or []
    if worlds and ranks > max(worlds):
        flags.append(f"extrapolated {ranks / max(worlds):.3g}x in ranks from a fit at "
                     f"{','.join(map(str, worlds))} ranks")
    elif worlds and ranks < min(worlds):
        flags.append(f"extrapolated below the fit's world sizes ({ranks} ranks, fit at "
                     f"{','.join(map(str, worlds))})")
    if fit["collective"] != collective:
        flags.append(f"no {collective} fit: constants of the {fit['collective']} fit")
    elif algorithm != fit["model_algorithm"]:
        flags.append(f"formula {algorithm} with constants fitted for {fit['model_algorithm']}")
    flags.extend(fit.get("flags") or [])
    if not fit.get("sizes"):
        flags.append("the model does not say which sizes the fit saw (older ccbench): size "
                     "extrapolation cannot be checked")
    del why
    return flags


def _smallest_alpha(fit: FitEntry) -> float:
    alphas = [p["alpha"] for p in fit.get("pieces") or []] or [fit["alpha"]]
    positive = [a for a in alphas if a > 0]
    return min(positive) if positive else 0.0


def row_flags(fit: FitEntry, size_used: float, alpha: float, steps: float,
              busbw_gbps: Sequence[float], link_gbps: float, ranks: int) -> list[str]:
    """Flags of one size: size extrapolation, busbw against the link, alpha per step."""
    flags: list[str] = []
    sizes = fit.get("sizes")
    if sizes:
        lo, hi = sizes
        if size_used > hi:
            flags.append(f"size {_size_text(size_used)} is {size_used / hi:.3g}x above the "
                         f"largest size the fit saw ({_size_text(hi)})")
        elif size_used < lo:
            flags.append(f"size {_size_text(size_used)} is below the smallest size the fit saw "
                         f"({_size_text(lo)})")
    fastest = max(busbw_gbps) if busbw_gbps else 0.0
    if link_gbps > 0 and fastest > link_gbps * (1 + 1e-6):
        flags.append(f"busbw {fastest:.4g} GB/s above the bottleneck link rate "
                     f"{link_gbps:.4g} GB/s: not physically possible on this topology")
    if link_gbps == float("inf"):
        flags.append("the links have no rate: the fit's beta is 0 (its per-byte cost went to "
                     "gamma or the intercept), so bytes cross links in no time, busbw cannot "
                     "be checked against a link and the replay sees no contention "
                     "(give --inter-bw)")
    base = _smallest_alpha(fit)
    if base > 0 and alpha > ALPHA_RATIO * base:
        flags.append(f"per-step latency {alpha * 1e6:.4g} us is {alpha / base:.3g}x the fit's "
                     f"small-message alpha ({base * 1e6:.4g} us), charged {steps:g} times at "
                     f"{ranks} ranks: likely a large-message intercept, not a latency")
    return flags
