"""Analysis of the testbed runs (benchmarks/testbed_validation.py analyze): calibrate on two
world sizes of the single switch, predict the other world sizes and the two-tier runs,
error tables and figures (prediction against measurement, with the ratio) in results/testbed/.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ccbench.model.fit import calibrate
from ccbench.model.modelfile import build_model
from ccbench.model.simulate import simulate
from ccbench.record import load_records

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "testbed"
DATA = OUT / "data"
# TCP over Ethernet, MTU 1500, TCP timestamps: 1448 payload bytes per 1514-byte frame as the
# tbf qdisc counts it (Ethernet header, no preamble / FCS / gap: tbf sees the skb)
PAYLOAD_PER_FRAME, FRAME_BYTES = 1448, 1514
EFFICIENCY = PAYLOAD_PER_FRAME / FRAME_BYTES


def _rate_bps(text: str) -> float:
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}
    return float(text[:-1]) * scale[text[-1].upper()] if text[-1].upper() in scale else float(text)


def _median_s(r) -> float:
    return float(np.median(r.samples_us)) * 1e-6 if r.samples_us else r.time_us["median"] * 1e-6


def _files(tag: str) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(DATA.glob(f"{tag}-*-n*.jsonl")):
        backend = path.name[len(tag) + 1:].rsplit("-n", 1)[0]
        out[backend].append(path)
    return out


def _fit_for(model: dict[str, Any], backend: str, collective: str) -> dict[str, Any]:
    fits = [f for f in model["fits"] if f["backend"] == backend and f["collective"] == collective]
    across = [f for f in fits if f["scope"] == "all-world-sizes"]
    return (across or fits)[0]


def analyze(train: list[int], link: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    link_bps = _rate_bps(link)
    payload_Bps = link_bps / 8 * EFFICIENCY
    rows: list[dict[str, Any]] = []
    lines = [f"# Cost model against the testbed: calibrated on {','.join(map(str, train))} "
             f"hosts, links {link}bit/s\n"]
    models = {}
    for backend, paths in _files("switch").items():
        recs = load_records(*paths)
        fits = calibrate([r for r in recs if r.world_size in train], bootstrap=0)
        model = build_model(fits, recs, [str(p) for p in paths])
        models[backend] = model
        (OUT / f"model-{backend}.json").write_text(json.dumps(model, indent=1) + "\n")
        for r in recs:
            fit = _fit_for(model, r.backend, r.collective)
            pred = simulate(model, r.collective, r.world_size, f"switch:{r.world_size}",
                            [r.size_asked], fit["model_algorithm"], backend=r.backend)
            p = pred["rows"][0]["time_us"] * 1e-6
            m = _median_s(r)
            rows.append({"topology": "switch", "backend": r.backend, "collective": r.collective,
                         "world_size": r.world_size, "size": r.size_used,
                         "role": "train" if r.world_size in train else "predicted",
                         "measured_s": m, "predicted_s": p, "ratio": p / m,
                         "rel_err": abs(p - m) / m, "formula": fit["model_algorithm"]})
    # two-tier: the single-switch model, replayed on the matching fat tree
    for tag_path in sorted(DATA.glob("twotier*-n*-testbed.json")):
        tag = tag_path.name.split("-n")[0]
        leaves, oversub = tag[len("twotier"):].split("x")
        for backend, paths in _files(tag).items():
            if backend not in models:
                continue
            for r in load_records(*paths):
                p_ranks = r.world_size
                topo = f"fat-tree:{p_ranks}:leaf={p_ranks // int(leaves)}:oversub={oversub}"
                fit = _fit_for(models[backend], r.backend, r.collective)
                pred = simulate(models[backend], r.collective, p_ranks, topo, [r.size_asked],
                                fit["model_algorithm"], fidelity="replay", backend=r.backend)
                p = pred["rows"][0]["time_us"] * 1e-6
                m = _median_s(r)
                rows.append({"topology": topo, "backend": r.backend, "collective": r.collective,
                             "world_size": p_ranks, "size": r.size_used, "role": "predicted",
                             "measured_s": m, "predicted_s": p, "ratio": p / m,
                             "rel_err": abs(p - m) / m, "formula": fit["model_algorithm"]})
    with open(OUT / "errors.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    # beta against the link
    lines.append(f"\n## Fitted bandwidth against the configured link\n\nConfigured {link}bit/s = "
                 f"{link_bps / 8 / 1e6:.3f} MB/s; TCP/IP over Ethernet (MTU 1500, TCP "
                 f"timestamps) carries {PAYLOAD_PER_FRAME} payload bytes per "
                 f"{FRAME_BYTES}-byte frame as tbf counts it ({EFFICIENCY:.1%}): "
                 f"{payload_Bps / 1e6:.3f} MB/s of payload.\n")
    lines.append("| backend | collective | formula | alpha us | 1/beta MB/s | / payload rate |")
    lines.append("|---|---|---|---|---|---|")
    for backend, model in models.items():
        for f in model["fits"]:
            if f["scope"] != "all-world-sizes":
                continue
            bw = 1 / f["beta"] if f["beta"] > 0 else float("inf")
            lines.append(f"| {backend} | {f['collective']} | {f['model_algorithm']} | "
                         f"{f['alpha'] * 1e6:.0f} | {bw / 1e6:.3f} | {bw / payload_Bps:.3f} |")
    # error table
    groups: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        if row["role"] != "predicted":
            continue
        groups[(row["topology"].split(":")[0], row["backend"], row["collective"])].append(
            row["rel_err"])
        groups[(row["topology"].split(":")[0], row["backend"], row["collective"],
                row["world_size"])].append(row["rel_err"])
    lines.append("\n## Prediction error (held-out world sizes; two-tier from the switch model)\n")
    lines.append("| network | backend | collective | ranks | points | median | p90 | max |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for key in sorted(groups, key=lambda k: tuple(map(str, k))):
        e = np.array(groups[key])
        ranks = str(key[3]) if len(key) > 3 else "all held out"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {ranks} | {len(e)} | "
                     f"{np.median(e):.1%} | {np.percentile(e, 90):.1%} | {e.max():.1%} |")
    (OUT / "errors.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _figures(rows, plt)


def _figures(rows: list[dict[str, Any]], plt) -> None:
    by: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by[(row["topology"].split(":")[0], row["backend"])].append(row)
    for (net, backend), sub in sorted(by.items()):
        collectives = sorted({r["collective"] for r in sub})
        fig, axes = plt.subplots(2, len(collectives), figsize=(4.2 * len(collectives), 6.4),
                                 sharex=True, squeeze=False,
                                 gridspec_kw={"height_ratios": [2.2, 1]})
        worlds = sorted({r["world_size"] for r in sub})
        cmap = plt.get_cmap("viridis")
        for j, coll in enumerate(collectives):
            top, bottom = axes[0][j], axes[1][j]
            for k, p in enumerate(worlds):
                pts = sorted((r for r in sub if r["collective"] == coll and r["world_size"] == p),
                             key=lambda r: r["size"])
                if not pts:
                    continue
                c = cmap(k / max(1, len(worlds) - 1) * 0.85)
                train = pts[0]["role"] == "train"
                xs = [r["size"] for r in pts]
                top.plot(xs, [r["measured_s"] * 1e3 for r in pts], "o", color=c,
                         mfc="white" if train else c, label=f"{p} ranks" + (" (fit)" if train else ""))
                top.plot(xs, [r["predicted_s"] * 1e3 for r in pts], "-", color=c)
                bottom.plot(xs, [r["ratio"] for r in pts], "o-" if not train else "o:", color=c,
                            mfc="white" if train else c)
            top.set_xscale("log", base=2)
            top.set_yscale("log")
            top.set_title(coll)
            bottom.axhspan(0.9, 1.1, color="0.9", zorder=0)
            bottom.axhline(1.0, color="0.4", lw=0.8)
            bottom.set_ylim(0.5, 1.5)
            bottom.set_xlabel("size (bytes)")
            if j == 0:
                top.set_ylabel("time per operation (ms)")
                bottom.set_ylabel("predicted / measured")
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"{backend} on the testbed ({net}): markers measured (open: fitted on), "
                     f"lines predicted; band = 10 %", fontsize=10)
        fig.tight_layout()
        fig.savefig(OUT / f"{net}-{backend}.png", dpi=110)
        plt.close(fig)
