"""report.html opened in a real browser (headless Chromium, Debian's `chromium`): every
figure loads (the browser decoded it: naturalWidth > 0), every table renders with its rows,
every link resolves (an anchor names an element, a file exists), and the screenshot shows
the figures (the libraries' colours are on the page)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_report import synthetic

from ccbench.report import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                                   reason="no chromium (apt-get install chromium)")

#: loads report.html in a frame and writes what the browser made of it into the page
HARNESS = """<!DOCTYPE html><html><body>
<iframe id="f" src="report.html" style="width:1200px;height:2000px"></iframe>
<script>
document.getElementById("f").onload = () => {
  const d = document.getElementById("f").contentDocument;
  const out = {
    images: [...d.images].map(i => [i.getAttribute("src"), i.complete, i.naturalWidth,
                                    i.getBoundingClientRect().width]),
    tables: [...d.querySelectorAll("table")].map(t => [t.rows.length,
              t.rows.length ? t.rows[0].cells.length : 0, t.getBoundingClientRect().height]),
    links: [...d.querySelectorAll("a")].map(a => a.getAttribute("href")),
    ids: [...d.querySelectorAll("[id]")].map(e => e.id),
  };
  const pre = document.createElement("pre");
  pre.id = "result";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
};
</script></body></html>
"""


def _chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert CHROMIUM, "chromium is missing (CI installs Debian's chromium)"
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--allow-file-access-from-files", "--hide-scrollbars",
                           "--virtual-time-budget=20000", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=240)


class _Result(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inside, self.text = False, ""

    def handle_starttag(self, tag, attrs) -> None:
        self.inside = tag == "pre" and ("id", "result") in attrs

    def handle_data(self, data) -> None:
        if self.inside:
            self.text += data


@needs_browser
def test_report_in_headless_chromium(tmp_path: Path) -> None:
    records = synthetic(collectives=("allreduce",), worlds=(2, 3))
    report = build_report(records, tmp_path / "r", formats=("png", "svg"))
    folder = report.directory
    (folder / "harness.html").write_text(HARNESS)
    done = _chromium("--dump-dom", (folder / "harness.html").as_uri(), cwd=folder)
    parser = _Result()
    parser.feed(done.stdout)
    assert parser.text, done.stderr[-2000:]
    seen = json.loads(parser.text)
    # every figure, each page of it, loaded and shown at its print width
    pngs = sorted(p.name for p in report.figures)
    assert sorted(src for src, *_ in seen["images"]) == pngs
    for src, complete, natural, shown in seen["images"]:
        assert complete and natural > 600 and shown > 500, (src, natural, shown)
    # the key-number and spread tables, each with a head row and body rows
    assert len(seen["tables"]) >= 2
    for rows, cells, height in seen["tables"]:
        assert rows >= 2 and cells >= 4 and height > 20
    # every link resolves: an anchor to an element of the page, a file beside it
    assert seen["links"]
    for href in seen["links"]:
        if href.startswith("#"):
            assert href[1:] in seen["ids"], href
        else:
            assert (folder / href).is_file(), href
    assert any(h.endswith(".svg") for h in seen["links"])
    assert "key-numbers.csv" in seen["links"]
    # the screenshot shows the figures: Gloo's blue and Intel MPI's vermillion are on it
    shot = tmp_path / "shot.png"
    _chromium(f"--screenshot={shot}", "--window-size=1200,2400",
              (folder / "report.html").as_uri(), cwd=folder)
    from PIL import Image

    from ccbench.report.style import colour

    with Image.open(shot) as image:
        colours = {c for _, c in image.convert("RGB").getcolors(1 << 20)}
    for name in ("Gloo (torch.distributed)", "Intel MPI"):
        hexa = colour(name).lstrip("#")
        rgb = tuple(int(hexa[k:k + 2], 16) for k in (0, 2, 4))
        assert any(max(abs(a - b) for a, b in zip(c, rgb, strict=True)) < 12
                   for c in colours), name
