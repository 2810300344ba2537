"""--group and --groups-file: one definition for the three commands that read a trace
(`replay`, `simulate --trace`, `export astra-sim --trace`), settling the process groups a
trace does not name (ccbench.formats.named)."""

from __future__ import annotations

import argparse

__all__ = ["add_group_options", "group_settings"]


def add_group_options(parser: argparse.ArgumentParser, only: str = "") -> None:
    """Add the two options (`only`: the option they need besides, said in the help)."""
    with_what = f" (with {only})" if only else ""
    parser.add_argument("--group", action="append", default=[], metavar="NODE=RANKS",
                        help=f"settle an op's process group{with_what}: NODE_ID=0,2 (that "
                             f"node id on each listed rank) or RANK:NODE_ID=0,2; repeatable")
    parser.add_argument("--groups-file", default=None, metavar="FILE",
                        help=f"JSON {{\"NODE\": [ranks], \"RANK:NODE\": [ranks]}}{with_what}: "
                             f"--group entries from a file")


def group_settings(args: argparse.Namespace) -> dict[str, list[int]] | None:
    """What the options say, for load_trace's `group_settings` (None: nothing given)."""
    from ccbench.formats.named import parse_group_settings

    return parse_group_settings(args.group, args.groups_file) or None
