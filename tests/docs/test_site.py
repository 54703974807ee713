"""The docs site, built strictly and looked at in a real headless Chromium: the landing page and a
reference page render their navigation and code blocks.  Screenshots land in runs/docs-screenshots/
for a person to look at."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.cli import ROOT, command_env

pytestmark = pytest.mark.multiproc  # mkdocs and the browser are processes of their own
SCREENSHOTS = ROOT / "runs" / "docs-screenshots"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install 'rankwise[docs]' (make install does)")
    out = tmp_path_factory.mktemp("site")
    env = command_env((), src=True, NO_MKDOCS_2_WARNING="1", DISABLE_MKDOCS_2_WARNING="true")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on a free local port (as `make docs-serve` would show it)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=10)


def _browser_path(playwright) -> str | None:
    """Playwright's own Chromium when installed (None: its default), else a system one; skip without
    either."""
    if Path(playwright.chromium.executable_path).exists():
        return None
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "no headless Chromium: `python -m playwright install chromium` or `apt-get install "
        "chromium` (make test tries both)"
    )


@pytest.fixture(scope="module")
def browser():
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright is not installed: pip install 'rankwise[docs]' (make install does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=_browser_path(playwright), args=["--no-sandbox"]
        )
        yield launched
        launched.close()


def _open(browser, url: str, screenshot: str):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url, wait_until="networkidle")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / screenshot))
    return page


def _assert_themed_navigation(page, sections: tuple[str, ...]):
    nav = page.locator("nav.md-nav--primary")
    assert nav.is_visible(), "the navigation is not shown"
    text = nav.inner_text()
    missing = [section for section in sections if section not in text]
    assert not missing, f"navigation lacks {missing}: {text[:500]}"
    # Material's stylesheet gives it a colour: the theme loaded
    header = page.locator("header.md-header")
    assert header.is_visible()
    assert header.evaluate("e => getComputedStyle(e).backgroundColor") not in (
        "rgba(0, 0, 0, 0)",
        "transparent",
    )


def _visible_code(page) -> list[str]:
    blocks = page.locator("pre > code")
    return [blocks.nth(i).inner_text() for i in range(blocks.count()) if blocks.nth(i).is_visible()]


def test_the_landing_page_renders_navigation_and_code(browser, served):
    page = _open(browser, served + "/", "landing.png")
    _assert_themed_navigation(
        page, ("Getting started", "How-to guides", "Concepts", "Reference", "Architecture")
    )
    code = _visible_code(page)
    assert any("make demo" in block and "make test" in block for block in code), code
    assert (SCREENSHOTS / "landing.png").stat().st_size > 10_000


def test_the_command_reference_renders_every_commands_help(browser, served):
    page = _open(browser, served + "/reference/commands/", "reference-commands.png")
    _assert_themed_navigation(page, ("Commands", "Configuration keys", "Environment variables"))
    code = "\n".join(_visible_code(page))
    for command in ("train", "bench", "verify", "comm demo"):
        assert f"usage: rankwise {command}" in code, f"no --help of rankwise {command} on the page"
    # rankwise launch's help is torchrun's parser with rankwise's flags
    assert "torchrun's flags" in code


def test_the_api_reference_renders_the_docstrings(browser, served):
    page = _open(browser, served + "/reference/api/", "reference-api.png")
    assert page.locator("[id='rankwise.Runtime.prepare']").count() == 1
    text = page.locator("article").inner_text()
    assert "Runtime" in text
    # Sphinx roles shown as code (scripts/docs_sphinx_roles.py)
    assert ":class:" not in text and ":meth:" not in text
