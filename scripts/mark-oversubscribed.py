"""Mark records taken before ccbench recorded oversubscription: method.oversubscribed and
method.cores_per_node, from the machine's core count (results/hardware.md says which).

    python scripts/mark-oversubscribed.py --cores 2 results/data/*.jsonl.gz

A record that already has method.oversubscribed is left as it is. Every other field and
the line order stay the same; the file is rewritten in place (gzip when it ends in .gz).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def mark(path: Path, cores: int) -> tuple[int, int]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    out, marked, over = [], 0, 0
    for line in lines:
        if not line.strip():
            continue
        rec = json.loads(line)
        method = rec.setdefault("method", {})
        if "oversubscribed" not in method:
            per_node = int(rec.get("ranks_per_node") or rec["world_size"])
            method["oversubscribed"] = per_node > cores
            method["cores_per_node"] = cores
            method["oversubscribed_source"] = (f"marked after the run: {per_node} ranks per "
                                               f"node on a {cores}-core machine")
            marked += 1
            over += method["oversubscribed"]
        out.append(json.dumps(rec, separators=(",", ":")))
    data = ("\n".join(out) + "\n").encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data, mtime=0))
    else:
        path.write_bytes(data)
    return marked, over


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, required=True, help="cores per node of the machine")
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args()
    for path in args.files:
        marked, over = mark(path, args.cores)
        print(f"{path}: marked {marked} records, {over} oversubscribed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
