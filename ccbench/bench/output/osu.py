"""The table of a run named by an OSU program (osu_allreduce ...): OSU's columns."""

from __future__ import annotations

from ccbench.bench.output.table import TableWriter
from ccbench.records import Record

__all__ = ["OsuWriter"]


class OsuWriter(TableWriter):
    """OSU's columns, for a run named by an OSU program (osu_allreduce ...): `# Size  Avg
    Latency(us)`, with -f also Min, Max and Iterations. One statistic throughout, as OSU's:
    each rank's own time per call (its median), averaged over the ranks, and the smallest and
    largest of them, so min <= avg <= max. OSU measures out of place: in-place rows only for a
    collective that has no other mode."""

    def header(self, title: str) -> None:
        print(f"# {title}\n# latency: each rank's median time per call; Avg over the ranks"
              f"{', Min and Max of them' if self.full else ''}", file=self.stream)
        extra = (f"{'Min Latency(us)':>18}{'Max Latency(us)':>18}{'Iterations':>12}"
                 if self.full else "")
        print(f"# {'Size':<10}{'Avg Latency(us)':>18}{extra}", file=self.stream, flush=True)

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        if record.inplace and False in modes:
            return
        ranks = record.rank_median_us or [record.time_us["median"]]
        extra = (f"{min(ranks):>18.2f}{max(ranks):>18.2f}{record.iterations:>12}"
                 if self.full else "")
        print(f"{record.size_used:<12}{sum(ranks) / len(ranks):>18.2f}{extra}",
              file=self.stream, flush=True)

    def footer(self, num_wrong: int | None) -> None:
        if num_wrong:
            print(f"# {num_wrong} wrong values: FAILED", file=self.stream, flush=True)
