"""What a user sees in a real browser: headless Chromium (Debian's, /usr/bin/chromium, installed by
.ci/run) driven by Playwright, on TensorBoard's dashboards and on the built documentation site.

Chromium is started as the sandbox here allows (root, WebGL on the CPU) and without the
background services that would call Google's hosts from a machine with no network.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    # No GPU: WebGL (the Time Series tab's charts) drawn by SwiftShader, on the CPU.
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser; a failed test, not a skip, where it is not installed."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).is_file():
        pytest.fail(f"Chromium is not installed at {CHROMIUM}: apt-get install chromium (.ci/run)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextmanager
def tensorboard(logdir: Path) -> Iterator[str]:
    """`tensorboard --logdir logdir` as a user starts it; yields its address."""
    port = free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--reload_interval", "0"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_for(url + "data/logdir")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per request in the test's output."""


@contextmanager
def static_site(root: Path) -> Iterator[str]:
    """A folder served over HTTP on localhost (search pages need http://, not file://)."""
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Chart:
    """One Custom Scalars chart as drawn: its category, title, how many tags it matches and
    the most points of one of its drawn lines."""

    category: str
    title: str
    matches: int
    points: int


# How long TensorBoard's pages may take to draw (its charts load their data one by one).
DRAW_SECONDS = 90.0


def custom_scalar_charts(page: Any, url: str) -> list[Chart]:
    """Every chart of the Custom Scalars tab, once each has drawn what it will draw: every chart
    that matches a tag has a line, and two readings a second apart agree."""
    page.goto(url + "#custom_scalars")
    page.wait_for_selector("tf-custom-scalar-multi-line-chart-card", timeout=DRAW_SECONDS * 1e3)
    deadline = time.monotonic() + DRAW_SECONDS
    before: list[Chart] = []
    while True:
        charts = _read_charts(page)
        drawn = any(c.points for c in charts) and all(c.points or not c.matches for c in charts)
        if (drawn and charts == before) or time.monotonic() > deadline:
            return charts
        before = charts
        time.sleep(1.0)


def _read_charts(page: Any) -> list[Chart]:
    charts = []
    for view in page.locator("tf-category-paginated-view").all():
        name = view.evaluate("view => view.category.name")
        for card in view.locator("tf-custom-scalar-multi-line-chart-card").all():
            title = card.evaluate("card => card.title")
            found = re.search(r"Matches \((\d+)\)", card.locator(".matches-text").inner_text())
            lengths = card.locator("path.line").evaluate_all(
                "paths => paths.map(p => (p.getAttribute('d') || '').split(/[ML]/).length - 1)"
            )
            matches = int(found[1]) if found else 0
            charts.append(Chart(name, title, matches, max(lengths, default=0)))
    return charts


def time_series_groups(page: Any, url: str) -> dict[str, int]:
    """The tag groups of the Time Series tab (train, eval, ...) and how many cards each has."""
    page.goto(url + "#timeseries")
    page.wait_for_selector("metrics-card-group-toolbar", timeout=DRAW_SECONDS * 1e3)
    groups = {}
    for toolbar in page.locator("metrics-card-group-toolbar").all():
        count = re.search(r"\d+", toolbar.locator(".group-card-count").inner_text())
        groups[toolbar.locator(".group-title").inner_text()] = int(count[0]) if count else 0
    return groups


def filter_time_series(page: Any, regex: str) -> None:
    """Type a tag filter into the Time Series tab, as a user narrows what it shows."""
    page.get_by_role("combobox", name="Filter tags (regex)").fill(regex)
    page.keyboard.press("Escape")  # close the suggestions
    page.wait_for_timeout(4000)  # the cards draw


def page_problems(browser: Any, url: str) -> list[str]:
    """What is wrong with one page as a fresh tab loads it: console errors, uncaught exceptions,
    failed requests and images that did not load."""
    page = browser.new_page()
    problems: list[str] = []

    def console(message: Any) -> None:  # a failed load is named by its response, below
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            problems.append(f"console: {message.text}")

    def response(answer: Any) -> None:  # the browser asks for /favicon.ico on its own
        if answer.status >= 400 and not answer.url.endswith("/favicon.ico"):
            problems.append(f"{answer.status}: {answer.url}")

    page.on("console", console)
    page.on("response", response)
    page.on("pageerror", lambda err: problems.append(f"exception: {err}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}"))
    try:
        page.goto(url, wait_until="load")
        broken = page.locator("img").evaluate_all(
            "images => images.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
        )
    finally:
        page.close()
    return problems + [f"image did not load: {src}" for src in broken]


def search_results(page: Any, site: str, word: str) -> list[str]:
    """The pages the site's own search lists for a word."""
    page.goto(f"{site}search.html?q={word}")
    page.wait_for_selector("#search-results ul.search li", timeout=DRAW_SECONDS * 1e3)
    return page.locator("#search-results ul.search li a").all_inner_texts()
