"""The dashboards a user opens, in a real browser (tests/browser.py): TensorBoard after the quick
start exactly as docs/quickstart.md writes it and after a small sweep, and the documentation site.

With PRIMAL_DT_SCREENSHOTS=DIR, the screenshots the documentation shows are written into DIR from
these same pages (scripts/dashboard_screenshots.sh regenerates scripts/figures/ that way).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from browser import (
    Chart,
    chromium,
    custom_scalar_charts,
    filter_time_series,
    page_problems,
    search_results,
    static_site,
    tensorboard,
    time_series_groups,
)

ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1400, "height": 1000}
# The fewest points a return chart must have to be a curve: the quick start evaluates at least
# four times during training, and once more at its end.
CURVE_POINTS = 4


def quickstart_command() -> list[str]:
    """The first command of docs/quickstart.md, as a user pastes it."""
    block = (ROOT / "docs" / "quickstart.md").read_text().split("```bash\n", 1)[1]
    return shlex.split(block.split("```", 1)[0].replace("\\\n", " ").splitlines()[0])


def run(command: list[str], cwd: Path) -> None:
    """A primal-dt command as typed, offline from an empty Minari root (the bundled dataset)."""
    env = {**os.environ, "MINARI_DATASETS_PATH": str(cwd / "minari")}
    program = [sys.executable, "-m", "primal_dt.cli", *command[1:]]
    done = subprocess.run(program, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs folder after the quick start's command."""
    home = tmp_path_factory.mktemp("quickstart")
    command = quickstart_command()
    assert command[:2] == ["primal-dt", "train"], command
    run(command, home)
    return home / "runs"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small sweep's runs folder: two configs, two seeds, on the bundled task."""
    home = tmp_path_factory.mktemp("sweep")
    tiny = ["model.embed_dim=32", "model.primal_rank=8", "model.context_len=5"]  # where primal
    tiny += ["train.warmup_steps=10", "train.log_every=5", "train.eval_every=10", "eval.episodes=2"]
    command = ["primal-dt", "sweep", "--tasks", "hopper-bundled", "--configs", "dt,primal-dt"]
    command += ["--seeds", "0,1", "--steps", "40", "--final-episodes", "2", "--device", "cpu"]
    run(command + [arg for setting in tiny for arg in ("--set", setting)], home)
    return home / "runs"


def screenshot(page, name: str) -> None:
    """Where PRIMAL_DT_SCREENSHOTS asks for them, the page as a user sees it."""
    folder = os.environ.get("PRIMAL_DT_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"))


def assert_drawn(charts: list[Chart], categories: set[str]) -> None:
    """Every chart matches a tag and draws a line; the return charts are curves."""
    assert {chart.category for chart in charts} == categories, charts
    for chart in charts:
        assert chart.matches > 0, f"{chart.category} / {chart.title}: Matches (0)"
        assert chart.points >= 2, f"{chart.category} / {chart.title}: no line drawn"
        if "return" in chart.title or "length" in chart.title:
            assert chart.points >= CURVE_POINTS, f"{chart.title}: {chart.points} points"


def test_the_quick_start_s_dashboards_have_every_chart_drawn(quickstart: Path) -> None:
    with chromium() as browser, tensorboard(quickstart) as url:
        page = browser.new_page(viewport=VIEWPORT)
        charts = custom_scalar_charts(page, url)
        assert_drawn(charts, {"hopper-bundled", "primal-dt run"})
        titles = {chart.title for chart in charts}
        assert {"action loss", "auxiliary loss (ksvd_loss)"} <= titles  # each on its own
        screenshot(page, "dashboard_custom_scalars")
        groups = time_series_groups(page, url)
        assert groups.get("train", 0) >= 6 and groups.get("eval", 0) >= 7, groups
        filter_time_series(page, "^train/")
        screenshot(page, "dashboard_time_series")


def test_a_sweep_s_dashboards_draw_every_run_of_its_task(sweep: Path) -> None:
    with chromium() as browser, tensorboard(sweep) as url:
        page = browser.new_page(viewport=VIEWPORT)
        charts = custom_scalar_charts(page, url)
        assert_drawn(charts, {"hopper-bundled", "primal-dt run"})
        by_task = [chart for chart in charts if chart.category == "hopper-bundled"]
        returns = next(chart for chart in by_task if "normalised return" in chart.title)
        assert returns.matches == 4 * 2, returns  # 4 runs x 2 targets
        groups = time_series_groups(page, url)
        assert {"train", "eval", "by_task"} <= set(groups), groups


def test_an_empty_chart_is_caught(tmp_path: Path) -> None:
    """The check above fails where a chart has nothing to draw: a run that never evaluates."""
    command = [*quickstart_command()[:6], "--steps", "20", "--final-episodes", "0"]
    run(command + ["--set", "train.eval_every=0", "--set", "model.embed_dim=32"], tmp_path)
    with chromium() as browser, tensorboard(tmp_path / "runs") as url:
        charts = custom_scalar_charts(browser.new_page(viewport=VIEWPORT), url)
    with pytest.raises(AssertionError, match="Matches \\(0\\)"):
        assert_drawn(charts, {"hopper-bundled", "primal-dt run"})


def test_the_documentation_site_loads_whole_and_finds_ksvd(tmp_path: Path) -> None:
    html = tmp_path / "html"
    build = [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(ROOT / "docs"), str(html)]
    done = subprocess.run(build, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    # The site links ../scripts/figures/ images into _images/; served from the build folder.
    pages = sorted(path.relative_to(html).as_posix() for path in html.glob("*.html"))
    assert {"index.html", "quickstart.html", "training.html", "search.html"} <= set(pages)
    with chromium() as browser, static_site(html) as site:
        problems = {page: page_problems(browser, site + page) for page in pages}
        assert not {page: found for page, found in problems.items() if found}
        found = search_results(browser.new_page(), site, "KSVD")
        assert any("method" in title.lower() for title in found), found
