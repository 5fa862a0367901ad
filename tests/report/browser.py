"""Opening a written report in Debian's headless Chromium, as a user's browser would, for the report
tests: what it requested, what it logged as errors, and whether every image decoded."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# CI sets LLMOPT_REQUIRE_BROWSER: there a missing browser fails the test instead of skipping it.
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("LLMOPT_REQUIRE_BROWSER"),
    reason="Debian's chromium is not installed (.ci/run installs it)",
)


@dataclass
class RenderedPage:
    requests: list[str]  # every URL the page asked for
    errors: list[str]  # console errors and uncaught page errors
    images: list[tuple[str, bool]]  # (alt text, decoded with a size)
    first_heading: str  # the first <h2>'s text


def render(report: Path, screenshot: Path | None = None) -> RenderedPage:
    """Load `report` (a file) in headless Chromium with no network use of its own."""
    from playwright.sync_api import sync_playwright

    requests, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(report.as_uri(), wait_until="load")
        images = page.evaluate(
            "Array.from(document.images)"
            ".map(i => [i.alt, i.complete && i.naturalWidth > 0 && i.naturalHeight > 0])"
        )
        first_heading = page.evaluate("document.querySelector('h2').textContent")
        if screenshot is not None:
            screenshot.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
    return RenderedPage(requests, errors, [tuple(i) for i in images], first_heading)
