"""report.html reads without an emoji font: every status is a CSS badge of ASCII text, and the
GPQA chart's axis ends at 100 %. Checked as a browser shows it: Debian's headless chromium (installed by .ci/run),
on a machine whose fonts include no emoji font, must paint the badges' colours."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from dspark_ci.ground.records import CellResult, GateResult, RunResults, Status
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.reports.html import render_html
from dspark_ci.reports.plots import CHARTS, _metric_figure

PICTOGRAPH = re.compile("[\u2600-\u27bf\u2b00-\u2bff\u23e9-\u23ff\U0001f000-\U0001faff]")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BADGE_RED, BADGE_GREEN = (0xCF, 0x22, 0x2E), (0x1A, 0x7F, 0x37)


def results() -> RunResults:
    config = CellConfig(model="m", tp=8)
    cells = (
        CellResult(id="good", config=config, expect={"outcome": "serve"}, status=Status.PASSED,
                   metrics={"gpqa_accuracy": 0.97, "gpqa_stderr": 0.03}),
        CellResult(id="slow", config=config, expect={"outcome": "serve"}, status=Status.FAILED,
                   gates=(GateResult("tpot_ms_median", "<=", 7.0, 10.2, False),), warnings=("a warning",)),
        CellResult(id="crashed", config=config, expect={"outcome": "serve"}, status=Status.ERROR,
                   error="AssertionError: boom"),
        CellResult(id="later", config=config, expect={"outcome": "serve"}, status=Status.SKIPPED),
    )
    return RunResults(run_id="r1", started_at=None, finished_at=None, launcher="local", matrices=("m.yaml",),
                      cells=cells)


def visible_text(page: str) -> str:
    return re.sub(r"<[^>]+>", "", re.sub(r'src="data:[^"]+"', "", page))


def test_no_status_depends_on_an_emoji_font():
    page = render_html(results())
    assert not PICTOGRAPH.findall(visible_text(page))
    for badge in ('class="mark ok"', 'class="mark bad"', 'class="mark skip"', 'class="mark warn"'):
        assert badge in page


def test_the_gpqa_axis_ends_at_100_percent():
    chart = next(c for c in CHARTS if c.metrics == ("gpqa_accuracy",))
    figure = _metric_figure(chart, [c for c in results().cells if c.metrics], "GPQA accuracy")
    assert figure.axes[0].get_xlim() == (0.0, 1.0)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_headless_chromium_paints_the_badges(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    page = tmp_path / "report.html"
    page.write_text(render_html(results()))
    shot = tmp_path / "report-marks.png"
    done = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    colours = {pixel for _count, pixel in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)}
    assert BADGE_RED in colours and BADGE_GREEN in colours
    if os.environ.get("DSPARK_TEST_ARTIFACTS"):
        kept = Path(os.environ["DSPARK_TEST_ARTIFACTS"])
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, kept / shot.name)
