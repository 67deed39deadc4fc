"""The inspector page in a real headless browser (Debian's chromium, driven by Playwright),
over a session driven through the gateway (fake upstream: the page is what is tested).

The screenshot it takes is a test artifact: tests/artifacts/inspector.png (ignored by git,
like every *.png outside docs/), or under $FOLDGATE_ARTIFACTS. docs/inspector.png, which
the README shows, is a copy of one."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from playwright.async_api import async_playwright

from gateway.sessions_api import DEFAULT_PAGE, MAX_PAGE
from tests.gateway.agent_session import SESSION, drive, started

ARTIFACTS = Path(
    os.environ.get("FOLDGATE_ARTIFACTS") or Path(__file__).resolve().parents[1] / "artifacts"
)
SCREENSHOT = ARTIFACTS / "inspector.png"


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "no chromium on PATH: scripts/test.sh installs Debian's chromium package"
    return path


async def test_page_shows_a_session_and_expands_a_stub(gateway_with_fake, client):
    async with gateway_with_fake(ui=True) as (url, _fake):
        await drive(client, url)
        view = (await client.get(f"{url}/v1/sessions/{SESSION}/render?request=7")).json()
        stub = next(r for r in view["rendered"] if r["kind"] == "stub")
        original = view["history"][stub["source"]]["text"]
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1500, "height": 1000})
            await page.goto(f"{url}/ui")
            row = page.locator(f'.session-row[data-session="{SESSION}"]')
            await row.click()
            # The last request is shown by default: history beside what the model saw.
            await page.locator("#render").wait_for()
            assert await page.locator(".msg.rendered").count() == len(view["rendered"])
            assert await page.locator(".msg.history").count() == len(view["history"])
            assert await page.locator(".marker.chunk-marker").count() == 1
            assert await page.locator(".marker.cache-marker").count() == 1
            folds = page.locator(".msg.rendered.kind-fold")
            assert await folds.count() == view["stats"]["folded_steps"]
            card = page.locator(f'.msg.rendered.kind-stub[data-index="{stub["index"]}"]')
            shown = await card.locator("pre.text").inner_text()
            assert original not in shown and "duplicate of step" in shown
            assert await card.locator("pre.original").is_hidden()
            await card.locator("button.expand").click()
            expanded = card.locator("pre.original")
            assert await expanded.is_visible()
            assert await expanded.text_content() == original  # the exact stored text
            await card.scroll_into_view_if_needed()
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(SCREENSHOT), full_page=True)
            # The first request, picked in the session's request table: nothing to stub yet.
            await page.locator("#app > table tbody tr").nth(0).click()
            await page.locator("#render h3", has_text="Request 1:").wait_for()
            assert await page.locator(".msg.rendered.kind-stub").count() == 0
            assert await page.locator(".msg.rendered").count() == 4
            await browser.close()
    assert SCREENSHOT.stat().st_size > 10_000


async def test_the_session_list_pages_through_every_session(gateway_with_fake, client):
    """More sessions than one page of ``GET /v1/sessions``: the page shows the first page,
    then each next one under it (it showed the first page only)."""
    names = [f"paged-{i:03d}" for i in range(DEFAULT_PAGE + 1)]
    async with gateway_with_fake(ui=True) as (url, _fake):
        for batch in range(0, len(names), 20):
            await asyncio.gather(
                *(started(client, url, [name]) for name in names[batch : batch + 20])
            )
        # Each request's accounting is written after its reply, and uses the session (the
        # list is most recently used first): wait until all of it is, so that no session
        # moves between two pages.
        while True:
            listed = (await client.get(f"{url}/v1/sessions?limit={MAX_PAGE}")).json()["data"]
            if len(listed) == len(names) and all(s["requests"] == 1 for s in listed):
                break
            await asyncio.sleep(0.05)
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            page = await browser.new_page()
            await page.goto(f"{url}/ui")
            rows = page.locator(".session-row")
            await rows.first.wait_for()
            first_page = await rows.count()
            more = page.locator("#more-sessions")
            await more.click()
            await rows.nth(DEFAULT_PAGE).wait_for()
            shown = [await r.get_attribute("data-session") for r in await rows.all()]
            more_left = await more.is_visible()
            await browser.close()
    assert first_page == DEFAULT_PAGE
    assert sorted(shown) == names  # each once
    assert not more_left
