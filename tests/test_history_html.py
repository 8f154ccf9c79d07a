"""`history html`: the static dashboard's files, and the pages rendered in a real browser
(headless Chromium driven by Playwright): every chart with the right number of points
and change markers, no console error, no request leaving the disk."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from test_history import SERIES, TEMPLATE, write_run

from roofline.history.cli import main as history
from roofline.history.store import add_run

pytest.importorskip("plotly", reason="the history extra is not installed "
                    "(pip install -e '.[history]')")
pytest.importorskip("ruptures", reason="the history extra is not installed "
                    "(pip install -e '.[history]')")

RUNS = 30
SLOW, FAST, GAPPY = SERIES[2], SERIES[0], SERIES[1]  # matmul, add n=4096, add n=65536
GAPS = (5, 6)  # runs where GAPPY is skipped: its chart has RUNS - 2 points
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory) -> Path:
    """30 runs: matmul 1.3x slower from run 20, add n=4096 1.3x faster from run 10, add
    n=65536 skipped in two runs; the dashboard of them."""
    tmp = tmp_path_factory.mktemp("dash")
    for i in range(RUNS):
        factors = {**({SLOW: 1.3} if i >= 20 else {}), **({FAST: 1 / 1.3} if i >= 10 else {})}
        add_run(write_run(tmp / "runs", i, factors, skip=(GAPPY,) if i in GAPS else ()),
                tmp / "store")
    assert history(["html", str(tmp / "store"), "--out", str(tmp / "out")]) == 0
    return tmp


def test_the_dashboard_is_self_contained(dashboard):
    out = dashboard / "out"
    assert {p.name for p in out.iterdir()} == {"index.html", "plotly.min.js", "cpu"}
    assert {p.name for p in (out / "cpu").iterdir()} == {"index.html", "add.html",
                                                        "matmul.html", "roofline.png"}
    assert (out / "plotly.min.js").stat().st_size > 1_000_000  # the whole bundle
    for page in (out / "cpu").glob("*.html"):
        text = page.read_text()
        assert "http://" not in text.split("<body>")[0] and "https://cdn" not in text
    add = (out / "cpu" / "add.html").read_text()
    assert add.count('<script src="../plotly.min.js"></script>') == 1
    assert add.count('class="chart"') == 2
    index = (out / "cpu" / "index.html").read_text()
    assert index.count("<tr><td>") == len(SERIES) and 'src="roofline.png"' in index
    # The trend arrows: every series flat at its current level.
    assert index.count("→") == len(SERIES)


def _chromium() -> str:
    pytest.importorskip("playwright", reason="playwright is not installed "
                        "(pip install -e '.[history]')")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("no Chromium on this machine (apt-get install chromium; .ci/run does)")
    return path


def _ok_points(store: Path, key: tuple) -> int:
    db = sqlite3.connect(store / "cpu.sqlite")
    n = db.execute("SELECT count(*) FROM rows WHERE kernel=? AND provider=? AND dtype=? AND "
                   "shape=? AND status='ok'", key).fetchone()[0]
    db.close()
    return n


def test_every_chart_renders_in_a_browser(dashboard):
    from playwright.sync_api import sync_playwright

    expected = {  # series -> (points, slower markers, faster markers)
        "matmul/torch/fp32/M=256,N=256,K=256": (RUNS, 1, 0),
        "add/torch/fp32/n=4096": (RUNS, 0, 1),
        "add/torch/fp32/n=65536": (RUNS - len(GAPS), 0, 0),
    }
    assert _ok_points(dashboard / "store", GAPPY) == RUNS - len(GAPS)
    seen = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error"
                    else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: problems.append(r.url)
                    if not r.url.startswith(("file://", "data:")) else None)
            for family in ("add", "matmul"):
                page.goto((dashboard / "out" / "cpu" / f"{family}.html").as_uri())
                page.wait_for_function("document.querySelectorAll('.chart').length > 0 && "
                                       "[...document.querySelectorAll('.chart')].every("
                                       "c => c.querySelector('svg.main-svg'))")
                charts = page.evaluate("""() => [...document.querySelectorAll('.chart')]
                  .map(c => { const d = c.querySelector('.js-plotly-plot');
                    const pts = name => { const i = d.data.findIndex(t => t.name === name);
                      if (i < 0) return 0;
                      return d.querySelectorAll('g.trace.scatter')[i]
                        .querySelectorAll('path.point').length; };
                    return [c.dataset.series, pts('median'), pts('slower'),
                            pts('faster'), d.data.length]; })""")
                for name, median, slower, faster, _ in charts:
                    seen[name] = (median, slower, faster)
            page.goto((dashboard / "out" / "cpu" / "index.html").as_uri())
            assert page.locator("#series tbody tr").count() == len(SERIES)
            page.goto((dashboard / "out" / "index.html").as_uri())
            page.click("text=cpu")
            assert page.title() == "history — cpu"
        finally:
            browser.close()
    assert seen == expected
    assert problems == []
    assert len(TEMPLATE) == len(SERIES) + 1  # the skipped Triton row has no chart
