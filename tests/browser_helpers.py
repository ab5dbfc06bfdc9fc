"""Headless Chromium (Debian's, driven by Playwright with `executable_path`; no browser is
downloaded) for the tests of the monitoring pages, as a person uses them."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playwright.sync_api import expect, sync_playwright

CHROMIUM = shutil.which("chromium")
# Screenshots, a folder per store: the suite runs once on each with the same file names, so one
# folder would keep the second run's only. test-artefacts/<store>/ (or $ASO_TEST_ARTEFACTS/
# <store>/), kept after the run for CI to collect (docs/testing.md, "Screenshots").
ARTEFACTS_ROOT = Path(
    os.environ.get("ASO_TEST_ARTEFACTS")
    or Path(__file__).resolve().parent.parent / "test-artefacts"
)
ARTEFACTS = ARTEFACTS_ROOT / os.environ.get("ASO_TEST_STORE", "pouchdb")


@contextlib.contextmanager
def browser(**context: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies, no certificate); `context`: Playwright's options."""
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium.new_context(**context)
        finally:
            chromium.close()


def log_in(page: Any, name: str, password: str) -> None:
    """Fill in the pages' own login form and send it."""
    page.wait_for_selector("form#login")
    page.fill("#login-name", name)
    page.fill("#login-password", password)
    page.click("#login-submit")


def see_the_overview(address: str, name: str, password: str, *, done: int) -> None:
    """Open the pages' address as a person would, log in, and wait (the pages refresh every
    30 s) until the overview counts `done` files done."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    with browser() as context:
        page = context.new_page()
        page.goto(address)
        log_in(page, name, password)
        page.wait_for_selector("#states, #no-summaries")
        expect(page.locator("#states tr[data-state='done'] td.n")).to_have_text(
            str(done), timeout=120_000
        )
        page.screenshot(path=str(ARTEFACTS / "run-overview.png"), full_page=True)
