"""Analysis of the testbed runs (benchmarks/testbed_validation.py analyze): calibrate on two
world sizes of the single switch, predict the other world sizes and the two-tier runs, check
the same predictions in the real ASTRA-sim, and write the error tables and figures
(prediction against measurement, with the ratio) into results/testbed/.

The calibration is `ccbench.model.fit.calibrate` on all collectives of a series at once, as
`ccbench calibrate` does ("shared": beta is a link constant taken from a non-reducing
collective, the reducing ones fit alpha and gamma, unless that beta fits much worse; a
"per-collective" variant, each collective calibrated alone, is kept in `_model`).
"""

from __future__ import annotations

import csv
import json
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ccbench.errors import UsageError
from ccbench.formats.astra import astra_bin_dir, export_astra, run_astra
from ccbench.model.fit import calibrate
from ccbench.model.library_algorithms import INTEL_MPI_ADJUST, MPICH_CVARS
from ccbench.model.modelfile import build_model
from ccbench.model.simulate import simulate
from ccbench.records import Record, load_records
from ccbench.testbed.topology import parse_topology

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "testbed"
DATA = OUT / "data"
# TCP over Ethernet, MTU 1500, TCP timestamps: 1448 payload bytes per 1514-byte frame as the
# tbf qdisc counts it (Ethernet header; no preamble, FCS or gap: tbf sees the skb, and a GSO
# skb is charged the headers of every segment)
PAYLOAD_PER_FRAME, FRAME_BYTES = 1448, 1514
EFFICIENCY = PAYLOAD_PER_FRAME / FRAME_BYTES
CALIBRATIONS = ("shared",)
TWO_TIER = parse_topology("two-tier:2:oversub=2")      # the twotier2x2 runs' network
TARGET_MEDIAN, TARGET_P90, TARGET_TWO_TIER = 0.10, 0.25, 0.20


def _rate_bps(text: str) -> float:
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}
    unit = text[-1].upper()
    return float(text[:-1]) * scale[unit] if unit in scale else float(text)


def _measured_s(r: Record) -> float:
    return float(np.median(r.samples_us)) * 1e-6 if r.samples_us else r.time_us["median"] * 1e-6


def _records(tag: str) -> dict[str, list[Record]]:
    """series (the file name's backend part: gloo, mpi-asserted, mpich-asserted) -> records."""
    out: dict[str, list[Record]] = defaultdict(list)
    for path in sorted(DATA.glob(f"{tag}-*-n*.jsonl.gz")):
        series = path.name[len(tag) + 1:].rsplit("-n", 1)[0]     # gloo, mpi-asserted, ...
        # the *-asserted series: an MPI under I_MPI_ADJUST_* or MPIR_CVAR_* (ASSERTED and
        # MPICH_ASSERTED in benchmarks/testbed_validation.py); their records keep the
        # variables and calibrate prices each fixed algorithm with its formula
        # (ccbench.model.library_algorithms), as for gloo's all-to-all
        out[series].extend(load_records(path))
    return out


def _model(records: Sequence[Record], train: Sequence[int], how: str) -> dict[str, Any]:
    fit_on = [r for r in records if r.world_size in train]
    if how == "shared":
        fits = calibrate(fit_on, bootstrap=0)
    else:
        fits = [f for c in sorted({r.collective for r in fit_on})
                for f in calibrate([r for r in fit_on if r.collective == c], bootstrap=0)]
    return build_model(fits, fit_on, [])


def _predict(model: dict[str, Any], r: Record, topology: str, fidelity: str) -> tuple[float, str]:
    out = simulate(model, r.collective, r.world_size, topology, [r.size_asked],
                   fidelity=fidelity, backend=r.backend)
    return out["rows"][0]["time_us"] * 1e-6, out["algorithm"]


def _top_piece(fit: dict[str, Any]) -> dict[str, Any]:
    pieces = fit.get("pieces") or []
    return pieces[-1] if pieces else fit


# a host count is network-bound when iperf3 with every host sending to the next at once
# reaches this fraction of the link on every flow (measured before and independently of the
# model; below it the 2 cores, not the links, set the pace)
NETWORK_BOUND = 0.8


def _ring_checks(info: dict[str, Any]) -> list[float]:
    """The all-links iperf3 checks of one testbed (the latest and the one before, when
    another invocation measured there first): smallest flow / link rate of each."""
    out = []
    for ring in (info.get("iperf3_all_links") or {}, info.get("earlier_iperf3") or {}):
        if ring.get("measured_bps"):
            out.append(min(ring["measured_bps"]) / ring["configured_bps"])
    return out


def _network_bound(tag: str = "switch") -> dict[int, float]:
    """host count -> the best all-links iperf3 check of that testbed (smallest flow / link
    rate): each check is one 3 s sample taken while others load the 2 cores, so a check
    that reached the mark shows the cores can keep every link busy at that host count."""
    out = {}
    for path in sorted(DATA.glob(f"{tag}-n*-testbed.json")):
        checks = _ring_checks(json.loads(path.read_text()))
        if checks:
            out[int(path.name[len(tag) + 2:].split("-")[0])] = max(checks)
    return out


# a series at a host count is network-bound when its time follows the link rate: measured
# again with the links at a lower rate (`measure --tag rateR --link R`, 64 KiB-1 MiB), the
# median over its collectives and sizes of t(R)/t(link) reaches this fraction of link/R
# (halving the rate must at least 1.6x the time); below it the cores set the pace
RATE_FOLLOWS = 0.8


def _rate_checks(link_bps: float) -> dict[tuple[str, int], dict[str, Any]]:
    """(series, host count) -> the time at a lower link rate against the time at the link's."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for path in sorted(DATA.glob("rate*-*-n*.jsonl.gz")):
        tag, rest = path.name.split("-", 1)
        series, hosts = rest.removesuffix(".jsonl.gz").rsplit("-n", 1)
        base = DATA / f"switch-{series}-n{hosts}.jsonl.gz"
        if not base.exists():
            continue
        at_link = {(r.collective, r.size_used): _measured_s(r) for r in load_records(base)}
        ratios: dict[str, list[float]] = defaultdict(list)
        for r in load_records(path):
            if (r.collective, r.size_used) in at_link:
                ratios[r.collective].append(_measured_s(r) / at_link[(r.collective, r.size_used)])
        if not ratios:
            continue
        slower = link_bps / _rate_bps(tag.removeprefix("rate"))
        every = [x for values in ratios.values() for x in values]
        follows = float(np.median(every)) / slower
        out[(series, int(hosts))] = {"rate": tag.removeprefix("rate"), "slower": slower,
                                     "ratios": dict(ratios), "follows": follows,
                                     "bound": follows >= RATE_FOLLOWS}
    return out


def _repeat_lines(models: dict[tuple[str, str], dict[str, Any]],
                  switch: dict[str, list[Record]]) -> list[str]:
    """The same model against a second launch of held-out host counts (`measure --tag
    repeat`): does the verdict survive launch-to-launch noise?"""
    repeat = _records("repeat")
    if not repeat:
        return []
    lines = ["", "## A second launch of the held-out host counts", "",
             "The same runs launched again later (`measure --tag repeat`), predicted by the same "
             "model: the relative error (median / p90) of the first launch and of the second, "
             "and the second's time over the first's (median over sizes, min-max).", "",
             "| calibration | backend | collective | hosts | first launch | second launch | "
             "second / first |", "|---|---|---|---|---|---|---|"]
    pooled: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for (backend, how), model in sorted(models.items()):
        for coll in sorted({r.collective for r in repeat.get(backend, [])}):
            for p in sorted({r.world_size for r in repeat[backend] if r.collective == coll}):
                cells = []
                first = {r.size_used: r for r in switch[backend]
                         if r.collective == coll and r.world_size == p}
                second = {r.size_used: r for r in repeat[backend]
                          if r.collective == coll and r.world_size == p}
                for recs in (first, second):
                    errs = []
                    for r in recs.values():
                        pred, _ = _predict(model, r, f"switch:{p}", "analytical")
                        errs.append(abs(pred - _measured_s(r)) / _measured_s(r))
                    cells.append(f"{np.median(errs):.1%} / {np.percentile(errs, 90):.1%}"
                                 if errs else "-")
                second_errs = errs
                ratios = [_measured_s(second[n]) / _measured_s(first[n])
                          for n in second if n in first]
                cells.append(f"{np.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                             if ratios else "-")
                lines.append(f"| {how} | {backend} | {coll} | {p} | " + " | ".join(cells) + " |")
                pooled[(how, backend, coll)] += second_errs
    lines += ["", "The second launch alone against the targets (its host counts together):", "",
              "| calibration | backend | collective | points | median / p90 | target |",
              "|---|---|---|---|---|---|"]
    for (how, backend, coll), errs in sorted(pooled.items()):
        med, p90 = float(np.median(errs)), float(np.percentile(errs, 90))
        ok = "met" if med <= TARGET_MEDIAN and p90 <= TARGET_P90 else "missed"
        lines.append(f"| {how} | {backend} | {coll} | {len(errs)} | {med:.1%} / {p90:.1%} | "
                     f"{ok} |")
    return lines


def _rate_lines(checks: dict[tuple[str, int], dict[str, Any]], link: str) -> list[str]:
    if not checks:
        return []
    lines = ["## Where the cores, not the links, set the pace", "",
             f"Each series measured again with every link at a lower rate (64 KiB-1 MiB): "
             f"t(lower rate) / t({link}bit/s) per collective (median, min-max over the sizes). "
             f"Network-bound: the time follows the link (the median over collectives and sizes "
             f">= {RATE_FOLLOWS:.0%} of the rate ratio); otherwise the ranks' own work (Python, "
             f"MPI progress, the cross-vCPU wake-ups of benchmarks/bench_wakeup.py) on the 2 "
             f"cores sets the pace, and the host count leaves the target's held-out set for that "
             f"series.", "",
             "| series | hosts | rate | rate ratio | collectives: time ratio | follows | "
             "network-bound |", "|---|---|---|---|---|---|---|"]
    for (series, hosts), check in sorted(checks.items()):
        per = ", ".join(f"{c} {np.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
                        for c, v in sorted(check["ratios"].items()))
        lines.append(f"| {series} | {hosts} | {check['rate']} | {check['slower']:.1f} | {per} | "
                     f"{check['follows']:.2f} | {'yes' if check['bound'] else 'no'} |")
    return lines + [""]


def _load_lines() -> list[str]:
    lines = []
    for path in sorted(DATA.glob("*-testbed.json")):
        info = json.loads(path.read_text())
        runs = ", ".join(f"{run['backend']} {run['seconds']:.0f} s (load {run['load_before'][0]:.1f}"
                         f" -> {run['load_after'][0]:.1f})" for run in info.get("runs", []))
        one = info.get("iperf3", [])
        ring = info.get("iperf3_all_links", {})
        rates = ring.get("measured_bps", [])
        earlier = _ring_checks(info)[1:]
        lines.append(f"| {path.name.removesuffix('-testbed.json')} | {info['topology']} | "
                     + " / ".join(f"{row['measured_bps'] / row['configured_bps']:.3f}"
                                  for row in one)
                     + f" | {len(rates)} | "
                     + (f"{min(rates) / ring['configured_bps']:.3f} - "
                        f"{max(rates) / ring['configured_bps']:.3f}" if rates else "-")
                     + f" | {' / '.join(f'{x:.3f}' for x in earlier) or '-'} | "
                     + f"{_all_pairs(info)} | {runs} |")
    return lines


def _all_pairs(info: dict[str, Any]) -> str:
    """What each port received with every host sending to every other at once (min - max)."""
    check = info.get("iperf3_all_pairs")
    if not check:
        return "-"
    got = [r / check["configured_bps"] for r in check["received_bps"].values()]
    return f"{min(got):.3f} - {max(got):.3f}"


def _limit_lines() -> list[str]:
    lines = []
    for path in sorted(DATA.glob("limit-n*.json")):
        rows = json.loads(path.read_text())
        hosts = path.stem.removeprefix("limit-n")
        lines += [f"Where the cores become the limit: {hosts} hosts on one switch, every host "
                  f"sending to the next at once (iperf3, 3 s), per link rate:", "",
                  "| link | flows | per flow / link (min - median - max) | total (Gbit/s) | "
                  "load before |", "|---|---|---|---|---|"]
        for row in rows:
            got = np.array(row["measured_bps"]) / row["configured_bps"]
            lines.append(f"| {row['link']} | {row['flows']} | {got.min():.3f} - "
                         f"{np.median(got):.3f} - {got.max():.3f} | "
                         f"{sum(row['measured_bps']) / 1e9:.2f} | {row['load_before'][0]:.1f} |")
        lines.append("")
    return lines


def analyze(train: list[int], link: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    link_bps = _rate_bps(link)
    payload = link_bps / 8 * EFFICIENCY
    switch = _records("switch")
    if not switch:
        raise SystemExit(f"no switch records in {DATA} (run `measure` first)")
    for stale in [*OUT.glob("*.png"), *OUT.glob("model-*.json")]:   # from an earlier analysis
        stale.unlink()
    models = {(b, how): _model(recs, train, how) for b, recs in switch.items()
              for how in CALIBRATIONS}
    for (backend, how), model in models.items():
        (OUT / f"model-{backend}-{how}.json").write_text(json.dumps(model, indent=1,
                                                                    default=float) + "\n")
    rows: list[dict[str, Any]] = []
    for (backend, how), model in models.items():
        for r in switch[backend]:
            pred, algo = _predict(model, r, f"switch:{r.world_size}", "analytical")
            m = _measured_s(r)
            rows.append({"calibration": how, "network": "switch", "backend": backend,
                         "collective": r.collective, "world_size": r.world_size,
                         "size": r.size_used,
                         "role": "fitted" if r.world_size in train else "predicted",
                         "measured_s": m, "predicted_s": pred, "ratio": pred / m,
                         "rel_err": abs(pred - m) / m, "formula": algo})
    two_tier = _records("twotier2x2")
    tt_rows: list[dict[str, Any]] = []
    for backend, recs in two_tier.items():
        for how in CALIBRATIONS:
            model = models.get((backend, how))
            if model is None:
                continue
            for r in recs:
                p = r.world_size
                topo = TWO_TIER.model_spec(p)      # the model's fat-tree of the same network
                if topo is None:
                    continue
                # the spine's links at the link's payload rate: the fitted beta is what a
                # rank's endpoint reaches (gloo's all-to-all: 0.5-0.7 of the link on one
                # switch), not the rate of a link between switches
                pred, algo = _predict(model, r, f"{topo}:uplink={payload * 8 / 1e6:.4g}M",
                                      "replay")
                fitted_spine, _ = _predict(model, r, topo, "replay")
                flat, _ = _predict(model, r, f"switch:{p}", "analytical")
                m = _measured_s(r)
                same = [_measured_s(q) for q in switch[backend] if q.world_size == p
                        and q.collective == r.collective and q.size_used == r.size_used]
                tt_rows.append({"calibration": how, "network": topo, "backend": backend,
                                "collective": r.collective, "world_size": p,
                                "size": r.size_used, "role": "predicted", "measured_s": m,
                                "predicted_s": pred, "ratio": pred / m,
                                "rel_err": abs(pred - m) / m, "formula": algo,
                                "switch_analytical_s": flat,
                                "fitted_spine_s": fitted_spine,
                                "fitted_spine_ratio": fitted_spine / m,
                                "switch_measured_s": same[0] if same else float("nan")})
    with open(OUT / "errors.csv", "w", newline="") as handle:
        fields = list(tt_rows[0] if tt_rows else rows[0])
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows + tt_rows)
    astra = _astra_rows(models, switch, train)
    lines = _report(train, link, link_bps, payload, models, rows, tt_rows, astra, switch)
    (OUT / "errors.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _figures(rows, tt_rows, train, plt)


def _astra_rows(models: dict[tuple[str, str], dict[str, Any]], switch: dict[str, list[Record]],
                train: Sequence[int]) -> list[dict[str, Any]]:
    """Every held-out switch configuration exported (`ccbench export astra-sim`, one
    workload per piece of the fit) and run in the real congestion-unaware binary."""
    if not (astra_bin_dir() / "AstraSim_Analytical_Congestion_Unaware").is_file():
        return []
    out = []
    for (backend, how), model in sorted(models.items()):
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        for r in switch[backend]:
            if r.world_size not in train:
                groups[(r.collective, r.world_size)].append(r.size_asked)
        for (collective, p), sizes in sorted(groups.items()):
            sizes = sorted(set(sizes))
            real = switch[backend][0].backend       # the series' records' backend (mpi)
            sim = simulate(model, collective, p, f"switch:{p}", sizes, backend=real)
            by_piece: dict[int, list[int]] = defaultdict(list)
            for sim_row in sim["rows"]:
                by_piece[sim_row["piece"]].append(sim_row["size_asked"])
            for _piece, chunk in sorted(by_piece.items()):
                row: dict[str, Any] = {"calibration": how, "backend": backend, "collective": collective,
                       "world_size": p, "sizes": f"{chunk[0]}-{chunk[-1]}",
                       "implementation": "", "simulate_us": None, "astra_us": None,
                       "refused": ""}
                with tempfile.TemporaryDirectory(prefix="ccbench-astra-") as tmp:
                    try:
                        man = export_astra(model, tmp, p, f"switch:{p}", collective, chunk,
                                           backend=real)
                        row["implementation"] = man["workload"]["implementation"]
                        row["simulate_us"] = man["workload"]["total_us"]
                        row["astra_us"] = run_astra(man) * 1e6
                    except UsageError as exc:
                        row["refused"] = str(exc)
                out.append(row)
    return out


def _report(train: Sequence[int], link: str, link_bps: float, payload: float,
            models: dict[tuple[str, str], dict[str, Any]], rows: list[dict[str, Any]],
            tt_rows: list[dict[str, Any]], astra: list[dict[str, Any]],
            switch: dict[str, list[Record]]) -> list[str]:
    held = sorted({r["world_size"] for r in rows if r["role"] == "predicted"})
    lines = _intro_lines(train, link, link_bps, payload, held)
    lines += _series_lines(models, switch, payload)
    lines += _fit_lines(models, payload)
    lines += _switch_error_lines(rows, held, link, link_bps)
    lines += _repeat_lines(models, switch)
    if tt_rows:
        lines += _two_tier_lines(tt_rows, payload)
    lines += _astra_lines(astra)
    return lines


def _intro_lines(train: Sequence[int], link: str, link_bps: float, payload: float,
                 held: list[int]) -> list[str]:
    return [f"# The cost model against the testbed's shaped network (links {link}bit/s)", "",
            f"Calibrated on {', '.join(map(str, train))} hosts (1 rank each, single switch), "
            f"predicted at {', '.join(map(str, held))} hosts and on the two-tier network. "
            f"Sizes 64 KiB and up; out of place; the time of a size is the median over its "
            f"iterations of the slowest rank. Generated by "
            f"`scripts/make-testbed-results.sh` (see results/README.md).", "",
            "## Links and machine load", "",
            f"Configured {link}bit/s = {link_bps / 8 / 1e6:.3f} MB/s on the wire. TCP/IP over "
            f"Ethernet (MTU 1500, TCP timestamps) carries {PAYLOAD_PER_FRAME} payload bytes per "
            f"{FRAME_BYTES}-byte frame as tbf counts it ({EFFICIENCY:.1%}): "
            f"{payload / 1e6:.3f} MB/s of payload.", "",
            "iperf3 (TCP, measured/configured): one flow h1 -> h0, then every host sending "
            "to the next at once (the ring's pattern), then every host sending to every "
            "other at once (the direct all-to-all's p-1 flows per port; `checks`); load = "
            "the machine's 1-minute load average before -> after each run (2 cores, shared "
            "with other work).", "",
            "| set | topology | one flow | ring flows | ring flows (min - max) | "
            "earlier ring check (min) | all pairs at once: port receives (min - max) | runs |",
            "|---|---|---|---|---|---|---|---|", *_load_lines(), "", *_limit_lines()]


def _fit_lines(models: dict[tuple[str, str], dict[str, Any]], payload: float) -> list[str]:
    lines = ["## Fitted bandwidth against the link", "",
              "1/beta of the fit across the training world sizes (largest-size piece), "
              "against the payload rate. `shared`: beta comes from a non-reducing "
              "collective, the reducing ones add gamma.", "",
              "| calibration | backend | collective | formula | alpha (us) | 1/beta (MB/s) | "
              "/ payload rate | gamma (ns/B) | pieces |", "|---|---|---|---|---|---|---|---|---|"]
    for (backend, how), model in sorted(models.items()):
        for f in model["fits"]:
            if f["scope"] != "all-world-sizes":
                continue
            top = _top_piece(f)
            bw = 1 / top["beta"] if top["beta"] > 0 else float("inf")
            brk = ", ".join(f"<= {int(pc['max_bytes'])} B" for pc in f.get("pieces") or []
                            if pc["max_bytes"]) or "one"
            lines.append(f"| {how} | {backend} | {f['collective']} | {f['model_algorithm']} | "
                         f"{top['alpha'] * 1e6:.0f} | {bw / 1e6:.2f} | {bw / payload:.3f} | "
                         f"{top['gamma'] * 1e9:.1f} | {brk} |")
    return lines


def _switch_error_lines(rows: list[dict[str, Any]], held: list[int], link: str,
                        link_bps: float) -> list[str]:
    lines: list[str] = []
    bound = _network_bound()
    net_held = [p for p in held if bound.get(p, 0.0) >= NETWORK_BOUND]
    rate_checks = _rate_checks(link_bps)

    def series_held(series: str) -> list[int]:
        return [p for p in net_held if rate_checks.get((series, p), {}).get("bound", True)]

    cpu_bound = sorted({f"{p} ({s})" for (s, p), c in rate_checks.items()
                        if not c["bound"] and p in held})
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["role"] == "predicted":
            groups[(row["calibration"], row["backend"], row["collective"])].append(row)
    lines += ["", *_rate_lines(rate_checks, link)]
    lines += ["## Prediction error, single switch (held-out world sizes, 64 KiB and up)", "",
              f"Targets: median <= {TARGET_MEDIAN:.0%}, p90 <= {TARGET_P90:.0%} per backend and "
              f"collective. Network-bound host counts (every flow of an all-links iperf3 "
              f"check at >= {NETWORK_BOUND:.0%} of the link; the best check of the host "
              f"count, see the load table): "
              + ", ".join(f"{p} ({bound[p]:.2f})" for p in sorted(bound)
                          if bound[p] >= NETWORK_BOUND)
              + "; not network-bound: "
              + (", ".join(f"{p} ({bound[p]:.2f})" for p in sorted(bound)
                           if bound[p] < NETWORK_BOUND) or "none") + ". Held out where the "
              "time does not follow the link rate (the section above): "
              + (", ".join(cpu_bound) or "none") + ".", "",
              f"| calibration | backend | collective | formula | held out, network-bound: hosts | "
              f"points | median | p90 | max | target | all held out ({','.join(map(str, held))}): "
              f"median | p90 |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(groups):
        hosts = series_held(key[1])
        sub = [row["rel_err"] for row in groups[key] if row["world_size"] in hosts]
        e_all = np.array([row["rel_err"] for row in groups[key]])
        if sub:
            e = np.array(sub)
            med, p90 = float(np.median(e)), float(np.percentile(e, 90))
            ok = "met" if med <= TARGET_MEDIAN and p90 <= TARGET_P90 else "missed"
            head = (f"{','.join(map(str, hosts))} | {len(e)} | {med:.1%} | {p90:.1%} | "
                    f"{e.max():.1%} | {ok}")
        else:
            head = "- | 0 | - | - | - | -"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {groups[key][0]['formula']} | {head} "
                     f"| {np.median(e_all):.1%} | {np.percentile(e_all, 90):.1%} |")
    lines += ["", "Per held-out world size (median / p90 of the relative error):", "",
              "| calibration | backend | collective | " + " | ".join(f"{p} hosts" for p in held)
              + " |", "|---|---|---|" + "---|" * len(held)]
    for key in sorted(groups):
        cells = []
        for p in held:
            e = np.array([row["rel_err"] for row in groups[key] if row["world_size"] == p])
            cells.append(f"{np.median(e):.0%} / {np.percentile(e, 90):.0%}" if len(e) else "-")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return lines


def _two_tier_lines(tt_rows: list[dict[str, Any]], payload: float) -> list[str]:
    tt_bound = _network_bound("twotier2x2")
    lines = ["", "## Two-tier, 2:1 oversubscribed (2 leaves, ranks leaf by leaf)", "",
             "`ccbench simulate --topology fat-tree:P:leaf=P/2:oversub=2:uplink=R "
             "--fidelity replay` with the single-switch model, the schedule of the "
             "fit's formula (gloo's and the asserted Intel MPI's all-to-all: `direct`, "
             "every message at once). `uplink=R`: the spine's links carry the link's "
             f"payload rate ({payload * 8 / 1e6:.4g} Mbit/s; leaf uplink = P/2 x R / 2, "
             "as the testbed shapes it); the ranks' own links keep the fitted 1/beta, "
             "which is what a rank's endpoint reaches (see the link-rate table above). "
             "`fitted spine` = the same replay with the spine at the fitted rate too (no "
             "uplink=), as before. `switch model` = the model on one switch (no "
             "contention); `switch measured` = the same run measured on one switch, so "
             "measured / switch measured is the contention the network really added. "
             f"Target: within {TARGET_TWO_TIER:.0%} from 1 MiB. All-links iperf3 "
             "(min flow / link) on the two-tier testbeds: "
             + ", ".join(f"{p} hosts {v:.2f}" for p, v in sorted(tt_bound.items())) + ".",
             "", "| calibration | backend | collective | hosts | formula | size | measured "
             "(ms) | predicted (ms) | ratio | fitted spine: ratio | switch model (ms) | "
             "switch measured (ms) | measured / switch measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(tt_rows, key=lambda x: (x["calibration"], x["backend"],
                                              x["collective"], x["world_size"], x["size"])):
        lines.append(f"| {row['calibration']} | {row['backend']} | {row['collective']} | "
                     f"{row['world_size']} | {row['formula']} | {_size(row['size'])} | "
                     f"{row['measured_s'] * 1e3:.1f} | {row['predicted_s'] * 1e3:.1f} | "
                     f"{row['ratio']:.2f} | {row['fitted_spine_ratio']:.2f} | "
                     f"{row['switch_analytical_s'] * 1e3:.1f} | "
                     f"{row['switch_measured_s'] * 1e3:.1f} | "
                     f"{row['measured_s'] / row['switch_measured_s']:.2f} |")
    lines += ["", "| calibration | backend | collective | hosts | points | median | p90 | "
              "max | within target | fitted spine: max | within |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    tgroups: dict[tuple[str, str, str, int], list[tuple[float, float]]] = defaultdict(list)
    for row in tt_rows:
        if row["size"] >= 1 << 20:
            tgroups[(row["calibration"], row["backend"], row["collective"],
                     row["world_size"])].append((row["rel_err"],
                                                 abs(row["fitted_spine_ratio"] - 1)))
    for tkey in sorted(tgroups):
        e = np.array([x[0] for x in tgroups[tkey]])
        f = np.array([x[1] for x in tgroups[tkey]])
        lines.append(f"| {tkey[0]} | {tkey[1]} | {tkey[2]} | {tkey[3]} | {len(e)} | "
                     f"{np.median(e):.1%} | {np.percentile(e, 90):.1%} | {e.max():.1%} | "
                     f"{int((e <= TARGET_TWO_TIER).sum())}/{len(e)} | {f.max():.1%} | "
                     f"{int((f <= TARGET_TWO_TIER).sum())}/{len(f)} |")
    return lines


def _astra_lines(astra: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## The same predictions in the real ASTRA-sim", ""]
    if not astra:
        lines.append(f"ASTRA-sim binaries not found in {astra_bin_dir()}: not checked.")
    else:
        done = [a for a in astra if a["astra_us"] is not None]
        if done:
            dev = [abs(a["astra_us"] / a["simulate_us"] - 1) for a in done]
            lines.append(f"`ccbench export astra-sim` on switch:P with each held-out "
                         f"configuration (one workload per piece of the fit, the measured "
                         f"sizes), run in `AstraSim_Analytical_Congestion_Unaware`: {len(done)} "
                         f"workloads ran, largest |ASTRA-sim / simulate - 1| = "
                         f"{max(dev):.2e}; {len(astra) - len(done)} refused by the exporter.")
        lines += ["", "| calibration | backend | collective | ranks | sizes | implementation | "
                  "simulate (us) | ASTRA-sim (us) | ratio | refused because |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for a in astra:
            ratio = f"{a['astra_us'] / a['simulate_us']:.6f}" if a["astra_us"] else "-"
            lines.append(f"| {a['calibration']} | {a['backend']} | {a['collective']} | "
                         f"{a['world_size']} | {a['sizes']} | {a['implementation'] or '-'} | "
                         + (f"{a['simulate_us']:.1f} | {a['astra_us']:.1f}" if a["astra_us"]
                            else "- | -")
                         + f" | {ratio} | {a['refused'] or '-'} |")
    return lines


# bytes the link of one rank carries out, per byte of S, in the least costly algorithm
# (ring for allreduce; every algorithm for the others): a lower bound for the library's own
# choice, the exact amount for the ring and direct/pairwise formulas
def _link_bytes(collective: str, p: int) -> float:
    return (2.0 if collective == "allreduce" else 1.0) * (p - 1) / p


SERIES_TEXT = {
    "gloo": "* `gloo`: torch's gloo over TCP. All-to-all is priced as `direct` (every message "
            "at once), gloo's own algorithm; the other collectives' formula is chosen by fit.",
    "mpi": "* `mpi`: Intel MPI choosing its algorithm per size and world size from tables "
           "ccbench cannot see. Its formula is the one that fits best across the training "
           "world sizes, one per collective: where Intel MPI switches algorithm with the "
           "size or the world size, no one formula describes it, and these predictions are "
           "not a test of the model.",
    "mpi-asserted": "* `mpi-asserted`: Intel MPI with its algorithms fixed by I_MPI_ADJUST_* "
                    "(benchmarks/testbed_validation.py ASSERTED). The records keep the "
                    "variables (`environment.variables`) and `calibrate` prices each with that "
                    "algorithm's formula (ccbench/model/library_algorithms.py). Its "
                    "reduce-scatter is Intel MPI's own choice: MPI_Reduce_scatter_block ran "
                    "one path at 0.3-0.4 of the link below 1 MiB under every "
                    "I_MPI_ADJUST_REDUCE_SCATTER_BLOCK id (0-4, 3 hosts).",
    "mpich-asserted": "* `mpich-asserted`: MPICH 5.0.2 over UCX's tcp transport with its "
                      "algorithms fixed by MPIR_CVAR_*_INTRA_ALGORITHM (MPICH_ASSERTED in "
                      "benchmarks/testbed_validation.py): ring allreduce and allgather, "
                      "pairwise-exchange reduce-scatter, `scattered` all-to-all (every message "
                      "at once at these world sizes). MPICH's algorithms are in its open "
                      "source; this is the series that tests the model on MPI.",
}


def _series_lines(models: dict[tuple[str, str], dict[str, Any]],
                  switch: dict[str, list[Record]], payload: float) -> list[str]:
    """What each series ran (read from its records and fits) and the link rate it reached."""
    present = {backend for backend, _how in models}
    lines = ["## The series and their formulas", "",
             *[text for series, text in SERIES_TEXT.items() if series in present], "",
             "| series | collective | formula | from | variable in the records |",
             "|---|---|---|---|---|"]
    for (backend, _how), model in sorted(models.items()):
        for f in model["fits"]:
            if f["scope"] != "all-world-sizes":
                continue
            names = [table[f["collective"]][0] for table in (INTEL_MPI_ADJUST, MPICH_CVARS)
                     if f["collective"] in table]
            seen = sorted({f"{name}={r.environment['variables'][name]}"
                           for r in switch[backend] if r.collective == f["collective"]
                           for name in names if name in (r.environment.get("variables") or {})})
            lines.append(f"| {backend} | {f['collective']} | {f['model_algorithm']} | "
                         f"{f.get('algorithm_source') or 'the records'} | "
                         f"{', '.join(seen) or '-'} |")
    worlds = sorted({r.world_size for recs in switch.values() for r in recs})
    lines += ["", "Link rate reached on one switch at the largest size (8 MiB): the bytes a "
              "rank's link carries ((p-1)/p S; 2(p-1)/p S for allreduce, the ring's, a lower "
              "bound for another algorithm) / the time / the payload rate. Under 1 where the "
              "endpoint or the algorithm, not the link, sets the pace:", "",
              "| series | collective | " + " | ".join(f"{p} hosts" for p in worlds) + " |",
              "|---|---|" + "---|" * len(worlds)]
    for backend, recs in sorted(switch.items()):
        for coll in sorted({r.collective for r in recs}):
            cells = []
            for p in worlds:
                sub = [r for r in recs if r.collective == coll and r.world_size == p]
                if not sub:
                    cells.append("-")
                    continue
                r = max(sub, key=lambda q: q.size_used)
                got = _link_bytes(coll, p) * r.size_used / _measured_s(r) / payload
                cells.append(f"{got:.2f}")
            lines.append(f"| {backend} | {coll} | " + " | ".join(cells) + " |")
    return lines + [""]


def _size(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return str(n)


def _figures(rows: list[dict[str, Any]], tt_rows: list[dict[str, Any]], train: Sequence[int],
             plt: Any) -> None:
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by[(row["calibration"], row["backend"])].append(row)
    for (how, backend), sub in sorted(by.items()):
        collectives = sorted({r["collective"] for r in sub})
        fig, axes = plt.subplots(2, len(collectives), figsize=(4.2 * len(collectives), 6.6),
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
                fitted = p in train
                xs = [r["size"] for r in pts]
                top.plot(xs, [r["measured_s"] * 1e3 for r in pts], "o", color=c,
                         mfc="white" if fitted else c,
                         label=f"{p} hosts" + (" (fitted on)" if fitted else ""))
                top.plot(xs, [r["predicted_s"] * 1e3 for r in pts], "-", color=c, lw=1)
                bottom.plot(xs, [r["ratio"] for r in pts], "o:" if fitted else "o-", color=c,
                            mfc="white" if fitted else c, ms=4)
            top.set_xscale("log", base=2)
            top.set_yscale("log")
            top.set_title(f"{coll} ({pts[0]['formula'] if pts else ''})", fontsize=10)
            bottom.axhspan(0.9, 1.1, color="0.9", zorder=0)
            bottom.axhline(1.0, color="0.4", lw=0.8)
            lo = min(r["ratio"] for r in sub if r["collective"] == coll)
            hi = max(r["ratio"] for r in sub if r["collective"] == coll)
            bottom.set_ylim(min(0.5, lo * 0.95), max(1.5, hi * 1.05))
            bottom.set_xlabel("size (bytes)")
            if j == 0:
                top.set_ylabel("time per operation (ms)")
                bottom.set_ylabel("predicted / measured")
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"{backend}, single switch, 1 rank per emulated host, {how} calibration on "
                     f"{','.join(map(str, train))} hosts: markers measured (open: fitted on), "
                     f"lines predicted; band = +-10 %", fontsize=10)
        fig.tight_layout()
        fig.savefig(OUT / f"switch-{backend}-{how}.png", dpi=100)
        plt.close(fig)
    if not tt_rows:
        return
    keys = sorted({(r["backend"], r["collective"]) for r in tt_rows})
    for how in CALIBRATIONS:
        for p in sorted({r["world_size"] for r in tt_rows}):
            _two_tier_figure([r for r in tt_rows if r["calibration"] == how
                              and r["world_size"] == p], keys, p, how, plt)


def _two_tier_figure(tt_rows: list[dict[str, Any]], keys: list[tuple[str, str]], p: int,
                     how: str, plt: Any) -> None:
    fig, axes = plt.subplots(2, len(keys), figsize=(3.6 * len(keys), 6.2), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": [2.2, 1]})
    for j, (backend, coll) in enumerate(keys):
        pts = sorted((r for r in tt_rows if r["backend"] == backend and r["collective"] == coll),
                     key=lambda r: r["size"])
        if not pts:
            continue
        xs = [r["size"] for r in pts]
        top, bottom = axes[0][j], axes[1][j]
        top.plot(xs, [r["measured_s"] * 1e3 for r in pts], "o", color="C0",
                 label="measured, two-tier")
        top.plot(xs, [r["switch_measured_s"] * 1e3 for r in pts], "s", color="0.6", mfc="white",
                 label="measured, one switch")
        top.plot(xs, [r["predicted_s"] * 1e3 for r in pts], "-", color="C1",
                 label="replay, oversub=2, spine at link rate")
        top.plot(xs, [r["fitted_spine_s"] * 1e3 for r in pts], ":", color="C3",
                 label="replay, oversub=2, spine at fitted rate")
        top.plot(xs, [r["switch_analytical_s"] * 1e3 for r in pts], "--", color="0.5",
                 label="model, one switch")
        bottom.plot(xs, [r["ratio"] for r in pts], "o-", color="C1")
        bottom.plot(xs, [r["fitted_spine_ratio"] for r in pts], "x:", color="C3")
        bottom.axhspan(0.8, 1.2, color="0.9", zorder=0)
        bottom.axhline(1.0, color="0.4", lw=0.8)
        both = [r[k] for r in pts for k in ("ratio", "fitted_spine_ratio")]
        lo, hi = min(both), max(both)
        bottom.set_ylim(min(0.5, lo * 0.95), max(1.5, hi * 1.05))
        top.set_xscale("log", base=2)
        top.set_yscale("log")
        top.set_title(f"{backend} {coll}\n({pts[0]['formula']})", fontsize=9)
        bottom.set_xlabel("size (bytes)")
        if j == 0:
            top.set_ylabel("time per operation (ms)")
            bottom.set_ylabel("predicted / measured")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{p} emulated hosts, two leaves, 2:1 oversubscribed spine, 100 Mbit/s links; "
                 f"{how} single-switch model; band = +-20 %", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT / f"two-tier-n{p}.png", dpi=100)
    plt.close(fig)
