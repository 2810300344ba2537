"""`ccbench report`: figures (PNG and SVG), a Markdown and an HTML report from records.

    build_report(records, "results/report", model=None) -> Report

Figures: bus bandwidth and latency against size per collective (one column per world
size, one line per backend/library, in-place dashed, p5-p95 band; where a panel would hold
more than two lines, small multiples instead: one row per series with the others in grey,
ccbench.report.multiples), an overview of every collective (medians), a per-rank spread
(straggler) view per world size and, with a model file from `ccbench calibrate`,
prediction against measurement. Tables: peak bus bandwidth,
latency at 8 B and 1 KiB, and the size at which each series reaches half its peak.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccbench.report import style  # noqa: F401  (selects the Agg backend first)
from ccbench.units import duration_text, size_label, size_text

__all__ = ["FORMATS", "FigureJob", "Report", "build_report", "output_directory", "parallel_map",
           "render"]


@dataclass
class Report:
    directory: Path
    figures: list[Path] = field(default_factory=list)    # PNG paths (each has its other formats)
    markdown: Path | None = None
    html: Path | None = None
    notes: list[str] = field(default_factory=list)
    formats: tuple[str, ...] = ("png",)
    paper: str = "double"
    jobs: list[FigureJob] = field(default_factory=list)    # drawn by render() in parallel


@dataclass
class FigureJob:
    """One figure to draw: `kind` names the function of ccbench.report.figures, `args` its
    arguments after the frame (the frame travels pickled to a worker process)."""

    name: str
    kind: str
    frame: Any
    args: tuple[Any, ...] = ()


FORMATS = ("png", "svg", "pdf")


def _draw(job: FigureJob, paper_name: str) -> list[Any]:
    import matplotlib

    from ccbench.report import figures
    from ccbench.report.paper import PAPERS, rc_for

    paper = PAPERS[paper_name]
    draw: Any = {"overview": figures.overview_figure, "collective": figures.collective_figure,
            "spread": figures.rank_spread_figure, "model": figures.model_figure}[job.kind]
    with matplotlib.rc_context(style.RC | rc_for(paper)):
        return draw(job.frame, *job.args, paper)


def render_job(job: FigureJob, paper_name: str, directory: str,
               formats: tuple[str, ...]) -> list[str]:
    """Draw one figure and save its pages (NAME.png, NAME-2.png ...) in every format;
    returns the PNG names. Runs in a worker process."""
    from ccbench.report.paper import METADATA, PAPERS

    paper = PAPERS[paper_name]
    names = []
    for page, fig in enumerate(_draw(job, paper_name), start=1):
        stem = job.name if page == 1 else f"{job.name}-{page}"
        for fmt in formats:
            path = Path(directory) / f"{stem}.{fmt}"
            fig.savefig(path, dpi=paper.dpi, metadata=METADATA[fmt])
            if fmt == "png":
                _shrink_png(path)
        names.append(f"{stem}.png")
    return names


def render(jobs: list[FigureJob], paper: str, directory: Path, formats: tuple[str, ...],
           workers: int | None = None) -> dict[str, list[str]]:
    """Every job's pages, drawn in worker processes; name -> PNGs. The costliest first, so
    that no worker is left with a big figure at the end."""
    order = sorted(range(len(jobs)), key=lambda k: -len(jobs[k].frame))
    done = parallel_map(render_job, [(jobs[k], paper, str(directory), formats) for k in order],
                        workers)
    pages = dict(zip((jobs[k].name for k in order), done, strict=True))
    return {job.name: pages[job.name] for job in jobs}


def parallel_map(func: Any, calls: list[tuple[Any, ...]], workers: int | None = None) -> list:
    """[func(*call) for call in calls], in worker processes (one per core, forked: nothing is
    imported again) where there are several calls and cores."""
    import multiprocessing

    count = min(workers or os.cpu_count() or 1, len(calls))
    if count <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [func(*call) for call in calls]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(func, *call) for call in calls]
        return [f.result() for f in futures]


def _figure(doc: _Doc, report: Report, job: FigureJob, caption: str) -> None:
    report.jobs.append(job)
    doc.figure(job.name, caption)


def _shrink_png(path: Path) -> None:
    """256-colour palette PNG: a third of the size, no visible change for line plots (the
    fast octree quantizer: a tenth of median cut's time)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE,
                                              dither=Image.Dither.NONE)
    small.save(path, compress_level=9)


def _fmt_bw(x: float) -> str:
    return "-" if not math.isfinite(x) else (f"{x:.3g}" if x < 100 else f"{x:.0f}")


def _fmt_size(x: float) -> str:
    # half-peak sizes are interpolated: two significant digits say all they know
    return size_label(x, digits=2) if math.isfinite(x) else "-"


class _Doc:
    """Blocks rendered to Markdown and to HTML from one description."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []
        self.pages: dict[str, list[str]] = {}      # figure name -> its PNG pages, once drawn
        # the figures' print width: HTML shows them in proportion to it (100 px per inch),
        # so a single-column figure is not blown up to a double column's width
        self.print_width_in = 7.0

    def figure(self, name: str, caption: str) -> None:
        self.blocks.append(("fig", (name, caption)))

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(("ul", items))

    def image(self, name: str, alt: str) -> None:
        self.blocks.append(("img", (name, alt)))

    def table(self, head: list[str], rows: list[list[str]], align: str | None = None) -> None:
        self.blocks.append(("table", (head, rows, align)))

    def markdown(self) -> str:
        out: list[str] = []
        for kind, value in self.blocks:
            if kind == "h":
                out.append("#" * value[0] + " " + value[1])
            elif kind == "p":
                out.append(value)
            elif kind == "ul":
                out.append("\n".join(f"- {item}" for item in value))
            elif kind == "img":
                out.append(f"![{value[1]}]({value[0]})")
            elif kind == "fig":
                alt = _alt(value[1])
                out.append("\n".join(f"![{alt}]({page})"
                                      for page in self.pages.get(value[0], []))
                           + f"\n\n*{value[1]}*")
            elif kind == "table":
                head, rows, align = value
                align = align or ("l" + "r" * (len(head) - 1))
                lines = ["| " + " | ".join(head) + " |",
                         "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
                lines.extend("| " + " | ".join(r) + " |" for r in rows)
                out.append("\n".join(lines))
        return "\n\n".join(out) + "\n"

    def html(self, title: str, formats: tuple[str, ...] = ("png",)) -> str:
        esc = html.escape
        body: list[str] = []
        contents = [(value[1], _slug(value[1])) for kind, value in self.blocks
                    if kind == "h" and value[0] == 2]
        for kind, value in self.blocks:
            if kind == "h":
                body.append(f'<h{value[0]} id="{_slug(value[1])}">{esc(value[1])}</h{value[0]}>')
                if value[0] == 1 and contents:
                    body.append('<nav><ul class="toc">' + "".join(
                        f'<li><a href="#{slug}">{esc(text)}</a></li>' for text, slug in contents)
                        + "</ul></nav>")
            elif kind == "p":
                body.append(f"<p>{_inline(value)}</p>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in value) + "</ul>")
            elif kind == "img":
                body.append(f'<figure><img src="{esc(value[0])}" alt="{esc(value[1])}">'
                            f"<figcaption>{esc(value[1])}</figcaption></figure>")
            elif kind == "fig":
                body.append(_html_figure(self.pages.get(value[0], []), value[1], formats))
            elif kind == "table":
                head, rows, align = value
                align = align or ("l" + "r" * (len(head) - 1))
                cells = "".join(f"<th>{esc(h)}</th>" for h in head)
                lines = [f"<table><thead><tr>{cells}</tr></thead><tbody>"]
                for r in rows:
                    lines.append("<tr>" + "".join(
                        f'<td class="{"l" if a == "l" else "r"}">{_inline(c)}</td>'
                        for c, a in zip(r, align, strict=False)) + "</tr>")
                lines.append("</tbody></table>")
                body.append("".join(lines))
        css = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;"
               "padding:0 1em;color:#222}img{max-width:100%;display:block}table{border-collapse:collapse;"
               "margin:1em 0;font-size:90%}th,td{padding:3px 8px;border-bottom:1px solid #ddd}"
               "td.r{text-align:right;font-variant-numeric:tabular-nums}th{text-align:left}"
               "code{background:#f4f4f4;padding:0 3px}figure{margin:1em 0}"
               "figcaption{color:#555;font-size:85%}"
               f"figure img{{width:{round(self.print_width_in * 100)}px;max-width:100%}}"
               ".toc{columns:2}")
        return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{esc(title)}</title><style>{css}</style></head><body>\n"
                + "\n".join(body) + "\n</body></html>\n")


def _html_figure(pages: list[str], caption: str, formats: tuple[str, ...]) -> str:
    """The figure's pages (shown at their print width, see _Doc.print_width_in), each a link
    to its file, and its caption with links to the other formats."""
    esc = html.escape
    images = "".join(f'<a href="{esc(page)}"><img src="{esc(page)}" alt="{esc(_alt(caption))}">'
                     "</a>" for page in pages)
    others = " ".join(f'<a href="{esc(page[:-4])}.{fmt}">{fmt.upper()}</a>'
                      for page in pages[:1] for fmt in formats if fmt != "png")
    return (f"<figure>{images}<figcaption>{_inline(caption)}"
            + (f" ({others})" if others else "") + "</figcaption></figure>")


def _alt(caption: str) -> str:
    """A figure's alternative text: its caption's first sentence."""
    return caption.split(". ")[0].rstrip(".")


def _inline(text: str) -> str:
    """`code`, **bold** and [links](file) of the Markdown blocks, for HTML."""
    import re

    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


# model open-shaped: as ccbench.report.model.load returns it
def build_report(records, out_dir: str | os.PathLike[str], model: Mapping[str, Any] | None = None,
                 sources: list[str] | None = None, title: str = "ccbench results",
                 formats: tuple[str, ...] = ("png",), runs: str = "pooled",
                 paper: str = "double", workers: int | None = None) -> Report:
    """Figures (drawn in parallel processes), report.md, report.html and key-numbers.csv."""
    from ccbench.errors import UsageError
    from ccbench.report.data import to_frame
    from ccbench.report.paper import PAPERS

    if not records:
        raise UsageError("no records to report on")
    report = Report(directory=output_directory(out_dir, formats), formats=tuple(formats),
                    paper=_paper(paper))
    frame = to_frame(records, runs)
    doc = _Doc()
    doc.print_width_in = PAPERS[report.paper].width
    _summary_section(doc, report, records, frame, sources, title, runs)
    native, algos = _native_and_algorithms(frame)
    _overview_section(doc, native, report)
    _key_numbers_section(doc, frame, report.directory)
    _per_collective_section(doc, native, report)
    if not algos.empty and not algos.equals(native):
        _algorithms_section(doc, algos, report)
    _rank_spread_section(doc, frame, report)
    if model is not None:
        _model_section(doc, frame, model, report)
    doc.pages = render(report.jobs, report.paper, report.directory, report.formats, workers)
    report.figures = [report.directory / page for job in report.jobs
                      for page in doc.pages[job.name]]
    _write_documents(doc, title, report)
    return report


def _paper(name: str) -> str:
    from ccbench.errors import choices_error
    from ccbench.report.paper import PAPERS

    if name not in PAPERS:
        raise choices_error("paper", name, tuple(PAPERS))
    return name


def output_directory(out_dir: str | os.PathLike[str], formats: tuple[str, ...]) -> Path:
    """The report's directory, made; the figure formats checked (png always)."""
    from ccbench.errors import UsageError

    unknown = set(formats) - set(FORMATS)
    if unknown or "png" not in formats:
        raise UsageError(f"--formats must include png, from {','.join(FORMATS)}; got "
                         f"{','.join(formats)}")
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _summary_section(doc: _Doc, report: Report, records, frame, sources: list[str] | None,
                     title: str, runs: str) -> None:
    """The title, what was measured where and when, and the notes every reader needs first
    (several runs of a case, records with wrong elements)."""
    from ccbench.report import figures
    from ccbench.report.data import method_notes, runs_note

    doc.heading(1, title)
    stamps = sorted(r.timestamp for r in records)
    doc.para(f"{len(records)} records from {len(sources or [])} file(s), measured "
             f"{stamps[0][:16].replace('T', ' ')} to {stamps[-1][:16].replace('T', ' ')} UTC. "
             f"{figures.context_line(frame)}.")
    doc.bullets(_method_bullets(records, frame))
    several = runs_note(records, runs)
    if several:
        report.notes.append(several)
        doc.para(f"{several}.")
    for differing in method_notes(records):
        report.notes.append(differing)
        doc.para(f"**Note:** {differing}.")
    wrong = frame[frame["wrong"].fillna(0) > 0]
    if not wrong.empty:
        note = f"{len(wrong)} record(s) have wrong elements: their numbers are not valid"
        report.notes.append(note)
        doc.para(f"**Warning:** {note}.")


def _method_bullets(records, frame) -> list[str]:
    from ccbench.report import figures
    from ccbench.report.data import library_versions

    worlds = sorted(int(p) for p in frame["world_size"].unique())
    sizes = sorted(int(s) for s in frame["size"].unique())
    return [
        f"sizes measured: {size_text(sizes[0], exact=True)} to {size_text(sizes[-1], exact=True)} "
        f"({len(sizes)} sizes)",
        f"world sizes: {', '.join(map(str, worlds))}; nodes: "
        f"{', '.join(map(str, sorted(frame['nodes'].unique())))}; hosts: "
        f"{', '.join(sorted(set(','.join(frame['hosts']).split(','))))}",
        f"libraries: {', '.join(library_versions(records))}",
        f"ccbench {', '.join(sorted(frame['ccbench_version'].unique()))}; "
        f"iterations per size: {', '.join(map(str, sorted(frame['iterations'].unique())))} "
        f"(warm-up {', '.join(map(str, sorted(frame['warmup'].unique())))})",
        f"{_time_definition(records)}; busbw = algbw x the "
        "nccl-tests factor; bands: 5th-95th percentile of the iterations, in the "
        "per-collective figures, in panels of at most "
        f"{figures.MAX_BANDED_LINES} lines; the overviews show medians only",
    ]


def _time_definition(records: Any) -> str:
    """What a point's time is, from the records' --combine: the slowest rank's by default;
    a report that holds other combinations names them (their series say which)."""
    from ccbench.bench.options import COMBINE_LABELS

    default = COMBINE_LABELS["max"]
    used = sorted({str((r.method or {}).get("combine", default)) for r in records})
    if used in ([default], ["max"]):
        return "time = median over iterations of the slowest rank's time"
    return (f"time = median over iterations of an iteration's time combined over ranks as "
            f"its series says ({', '.join(used)}; unmarked series: {default})")


def _native_and_algorithms(frame) -> tuple[Any, Any]:
    """(the libraries' own collectives, ccbench's algorithms beside their transport's native
    library): ccbench's own algorithms get their own figures."""
    is_algo = frame["backend"].str.contains("@", regex=False)
    native = frame[~is_algo] if (~is_algo).any() else frame
    algos = frame[is_algo]
    if not algos.empty:
        libraries = set(algos["library"])
        transports = {b.split("@", 1)[1] for b in algos["backend"]}
        algos = frame[is_algo | (frame["backend"].isin(transports)
                                 & frame["library"].isin(libraries))]
    return native, algos


def _overview_section(doc: _Doc, native, report: Report) -> None:
    from ccbench.report.captions import overview_caption

    doc.heading(2, "Overview")
    for metric, name in (("busbw", "overview-busbw"), ("latency", "overview-latency")):
        _figure(doc, report, FigureJob(name, "overview", native, (metric,)),
                overview_caption(native, metric))


def _key_numbers_section(doc: _Doc, frame, directory: Path) -> None:
    """One table per collective (and key-numbers.csv): peak busbw, small-message times and
    the half-peak size of every series."""
    from ccbench.report.data import key_numbers

    doc.heading(2, "Key numbers")
    keys = key_numbers(frame)
    has_8 = bool(keys["lat_8B_us"].notna().any()) if not keys.empty else False
    # only the sizes that were measured are named (no "8 B" column or note without 8 B)
    doc.para("Peak bus bandwidth (and the size where it is reached), median time per "
             f"operation at {'8 B and ' if has_8 else ''}1 KiB, and the size at which the "
             "series first reaches half its peak bus bandwidth (interpolated between measured "
             "sizes). `-`: not measured"
             + (" (8 B of the dtype cannot be split over the ranks of allgather, "
                "reduce-scatter and all-to-all)" if has_8 else "")
             + ". `4*`: oversubscribed, more ranks than cores on a node (the records' "
             "`method.oversubscribed`): the times include waiting for a core.")
    if keys.empty:
        return
    head = (["series", "ranks", "mode", "peak busbw GB/s"] + (["time 8 B"] if has_8 else [])
            + ["time 1 KiB", "half-peak size"])
    for coll in keys["collective"].unique():
        doc.heading(3, coll)
        rows = [_key_row(k, has_8) for _, k in keys[keys["collective"] == coll].iterrows()]
        doc.table(head, rows, "lllr" + "r" * (len(head) - 4))
    keys.to_csv(directory / "key-numbers.csv", index=False)
    doc.para("All of them in one file: [key-numbers.csv](key-numbers.csv).")


def _key_row(k, has_8: bool) -> list[str]:
    return ([k["series"], f"{k['ranks']}{'*' if k.get('oversubscribed') else ''}", k["mode"],
             f"{_fmt_bw(k['peak_busbw'])} @ {_fmt_size(k['peak_at'])}"]
            + ([duration_text(k["lat_8B_us"])] if has_8 else [])
            + [duration_text(k["lat_1K_us"]), _fmt_size(k["half_peak_size"])])


def _per_collective_section(doc: _Doc, native, report: Report) -> None:
    from ccbench.report import figures
    from ccbench.report.captions import collective_caption

    doc.heading(2, "Per collective")
    doc.para("Bus bandwidth and time per operation against size, one panel per world size; "
             "solid lines out-of-place, dashed in-place; shaded: p5-p95 of the iterations "
             f"where a panel has at most {figures.MAX_BANDED_LINES} lines.")
    for coll in native["collective"].unique():
        doc.heading(3, coll)
        sub = native[native["collective"] == coll]
        _figure(doc, report, FigureJob(_slug(coll), "collective", sub, (coll,)),
                collective_caption(sub, coll))


def _algorithms_section(doc: _Doc, algos, report: Report) -> None:
    from ccbench.report.captions import collective_caption, overview_caption

    doc.heading(2, "ccbench algorithms against the native library")
    doc.para("ccbench's ring, tree and hypercube schedules (algorithms/) executed over the "
             "transport's point-to-point calls, beside that library's own collective "
             "(solid: out-of-place, dashed: in-place). busbw uses the nccl-tests ring "
             "factor for every algorithm, so it compares times, not link use.")
    for metric in ("busbw", "latency"):
        _figure(doc, report, FigureJob(f"algorithms-overview-{metric}", "overview", algos,
                                       (metric,)),
                "Algorithms: " + overview_caption(algos, metric))
    for coll in algos[algos["backend"].str.contains("@", regex=False)]["collective"].unique():
        doc.heading(3, f"{coll}: algorithms")
        sub = algos[algos["collective"] == coll]
        _figure(doc, report, FigureJob(f"algorithms-{_slug(coll)}", "collective", sub,
                                       (coll,)), collective_caption(sub, coll))


def _rank_spread_section(doc: _Doc, frame, report: Report) -> None:
    """Stragglers: a figure per world size of two or more ranks, and a table of how far the
    slowest rank's median is from the fastest's."""
    from ccbench.report import figures
    from ccbench.report.captions import spread_caption

    doc.heading(2, "Per-rank spread")
    doc.para("Each rank's median time over the fastest rank's median at the same size "
             f"({figures.modes_note(frame)}). A rank that is consistently darker at every "
             "size is a straggler; spread that changes from size to size is noise.")
    spread_rows = []
    for p in sorted(int(p) for p in frame["world_size"].unique()):
        if p < 2:
            continue
        sub = frame[frame["world_size"] == p]
        _figure(doc, report, FigureJob(f"rank-spread-n{p}", "spread", sub, (p,)),
                spread_caption(frame, p))
        spread_rows += _spread_rows(frame[frame["world_size"] == p], p)
    if spread_rows:
        doc.table(["series", "ranks", "median max/min rank", "worst max/min rank"], spread_rows,
                  "llrr")


def _spread_rows(sub, p: int) -> list[list[str]]:
    rows = []
    for series, group in sub.groupby("series"):
        ratios = [max(r) / min(r) for r in group["rank_median_us"] if r and min(r) > 0]
        if ratios:
            ratios.sort()
            rows.append([series, str(p), f"{ratios[len(ratios) // 2]:.2f}", f"{ratios[-1]:.2f}"])
    return rows


def _write_documents(doc: _Doc, title: str, report: Report) -> None:
    md = report.directory / "report.md"
    md.write_text(doc.markdown(), encoding="utf-8")
    page = report.directory / "report.html"
    page.write_text(doc.html(title, report.formats), encoding="utf-8")
    report.markdown, report.html = md, page


def _model_section(doc: _Doc, frame, model: Mapping[str, Any], report: Report) -> None:
    from ccbench.report import figures
    from ccbench.report.captions import model_caption
    from ccbench.report.model import predictions

    doc.heading(2, "Model against measurement")
    preds, notes = predictions(frame, model)
    created = model.get("created", "?")
    doc.para(f"Model file written {created} by ccbench {model.get('ccbench_version', '?')}: "
             f"{model.get('formula', 'alpha-beta-gamma')}.")
    if not preds:
        note = "the model has no fit matching the measured series"
        report.notes.append(note)
        doc.para(f"Nothing to compare: {note}.")
        return
    rows = []
    for coll in frame["collective"].unique():
        mine = {(s, p): v for (c, s, p), v in preds.items() if c == coll}
        if not mine:
            continue
        sub = frame[frame["collective"] == coll]
        _figure(doc, report, FigureJob(f"model-{_slug(coll)}", "model", sub, (coll, mine)),
                model_caption(sub, coll, sorted({s for s, _ in mine}),
                              sorted({p for _, p in mine})))
        measured_mode, _ = figures._preferred_mode(sub)
        rows += _model_rows(coll, measured_mode, mine, notes)
    doc.table(["collective", "series", "ranks", "fit", "median rel. error", "max rel. error"],
              rows, "llllrr")


def _model_rows(coll: str, sub, mine, notes) -> list[list[str]]:
    rows = []
    for (series, p), (sizes, pred_us) in sorted(mine.items()):
        measured = sub[(sub["series"] == series) & (sub["world_size"] == p)]
        table = dict(zip(measured["size"], measured["median_us"], strict=False))
        errs = sorted(abs(pu / table[s] - 1) for s, pu in zip(sizes, pred_us, strict=False)
                      if s in table)
        if errs:
            rows.append([coll, series, str(p), notes.get((coll, series, p), ""),
                         f"{100 * errs[len(errs) // 2]:.1f}%", f"{100 * errs[-1]:.0f}%"])
    return rows
