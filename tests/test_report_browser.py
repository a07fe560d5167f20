"""The report in a real browser (opt-in: pytest -m browser): headless Chromium, no console errors,
every chart drawn (non-empty SVG with marks), screenshots saved as test artifacts.

The report is $ONNXPLAN_REPORT when set (e.g. reports/latest.html after `onnxplan bench --all`),
else one made here from a quick planned-only bench of mlp and vgg16. Screenshots go to
$ONNXPLAN_ARTIFACTS (default: onnxplan-test-artifacts/ in the temp folder); the committed
reports/browser/ came from ONNXPLAN_REPORT=reports/bench-zoo.html ONNXPLAN_ARTIFACTS=reports/browser.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxplan.cli.app import app

pytestmark = pytest.mark.browser
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push("error: " + e.message));
window.addEventListener("unhandledrejection", e => window.__errors.push("rejection: " + e.reason));
(function () {
  const original = console.error;
  console.error = function () { window.__errors.push("console.error: " + Array.from(arguments).join(" ")); original.apply(console, arguments); };
})();
window.addEventListener("load", () => setTimeout(() => {
  const plots = Array.from(document.querySelectorAll(".js-plotly-plot")).map(p => ({
    id: p.id,
    svgs: p.querySelectorAll("svg.main-svg").length,
    bars: p.querySelectorAll(".barlayer .point path").length,
    lines: p.querySelectorAll(".scatterlayer path.js-line, .scatterlayer .point").length,
    width: p.getBoundingClientRect().width, height: p.getBoundingClientRect().height}));
  const out = document.createElement("pre");
  out.id = "__report_status";
  out.textContent = JSON.stringify({errors: window.__errors, plots: plots,
    divs: document.querySelectorAll(".plotly-graph-div").length});
  document.body.appendChild(out);
}, 1000));
</script>"""


def _chromium() -> str:
    for name in (os.environ.get("ONNXPLAN_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium (apt-get install -y chromium)")


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    cmd = [_chromium(), *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    given = os.environ.get("ONNXPLAN_REPORT")
    if given:
        return Path(given).resolve()
    out = tmp_path_factory.mktemp("browser")
    res = CliRunner().invoke(app, ["bench", "mlp", "vgg16", "--no-measure", "-o", str(out / "r.json"),
                                   "--html", str(out / "report.html"), "--budget", "vgg16=300MiB"])
    assert res.exit_code == 0, res.output
    return out / "report.html"


def _artifacts() -> Path:
    path = Path(os.environ.get("ONNXPLAN_ARTIFACTS", Path(tempfile.gettempdir()) / "onnxplan-test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _png_size_and_colors(path: Path) -> tuple[int, int, int]:
    """Width, height and the number of distinct pixel rows (a blank page has 1) of an RGB(A) PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, ctype = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big"), body[9]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * (4 if ctype == 6 else 3) + 1
    rows = {raw[i * stride + 1:(i + 1) * stride] for i in range(0, height, 7)}
    return width, height, len(rows)


@pytest.mark.slow
def test_report_draws_every_chart_without_errors(report, tmp_path):
    page = tmp_path / "probe.html"
    page.write_text(report.read_text().replace("<head>", "<head>" + PROBE, 1))
    proc = _run(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=60000", "--window-size=1500,1200",
                 "--dump-dom", page.as_uri()], tmp_path)
    found = re.search(r'<pre id="__report_status">(.*?)</pre>', proc.stdout, re.DOTALL)
    assert found, f"no status in the DOM; chromium said: {proc.stderr[-2000:]}"
    status = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln and "ERROR" in ln.upper()]
    assert status["errors"] == [] and console == [], (status["errors"], console)
    assert status["divs"] == len(status["plots"]) > 0
    for plot in status["plots"]:
        assert plot["svgs"] > 0 and plot["width"] > 100 and plot["height"] > 100, plot
        assert plot["bars"] + plot["lines"] > 0, f"chart {plot['id']} drew nothing: {plot}"
    layouts = {p["id"]: p for p in status["plots"] if p["id"].endswith("-layout")}
    assert layouts and all(p["bars"] > 0 for p in layouts.values())
    vgg = [p for pid, p in layouts.items() if pid.startswith("vgg16")]
    if "vgg16" in report.read_text():
        assert vgg and vgg[0]["bars"] >= 50, vgg  # one rectangle per buffer: 120 in the chosen plan


def test_screenshots(report, tmp_path):
    text = report.read_text()
    artifacts = _artifacts()
    shots = {"report-top.png": text}
    section = re.search(r'<section id="(model-vgg16[^"]*)"', text)
    if section:  # only the vgg16 section: its layout chart at the top of the page
        css = f"<style>section{{display:none}} section#{section.group(1)}{{display:block}}</style>"
        shots["report-vgg16.png"] = text.replace("</head>", css + "</head>", 1)
    for name, html in shots.items():
        page = tmp_path / name.replace(".png", ".html")
        page.write_text(html)
        target = artifacts / name
        target.unlink(missing_ok=True)
        proc = _run(["--virtual-time-budget=60000", "--window-size=1500,1500", f"--screenshot={target}",
                     page.as_uri()], tmp_path)
        assert target.exists(), proc.stderr[-2000:]
        width, height, distinct = _png_size_and_colors(target)
        assert (width, height) == (1500, 1500) and distinct > 20, (name, distinct)  # not a blank page
