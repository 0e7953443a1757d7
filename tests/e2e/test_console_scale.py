"""The console's queues page with 10,000 queues (SPEC UI2; issue 29's measure).

The list is sorted, filtered and paged by the management API (``page``/``page_size``,
``name`` with ``use_regex``, ``sort``/``sort_reverse``), so the browser holds one page of rows
however many queues there are. This checks that it does (row counts, the summary, paging,
the regex filter and a reverse sort over all 10,000), and writes what it took, in the browser
(``performance.now``) and for the API calls, to ``tests/e2e/artifacts/console-scale.json``:
numbers to read, never asserted (no wall-clock thresholds in tests).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

playwright_sync = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
from playwright.sync_api import Browser, expect  # noqa: E402

from gateway.server import gateway_in_thread  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
QUEUES = 10_000
ADMIN = ("guest", "guest")


@pytest.fixture(scope="module")
def mgmt_url() -> Iterator[str]:
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), management_port=0, management_host="127.0.0.1") as gw:
        url = "http://" + dict(gw.operator_addresses())["management API"]
        defs = {"queues": [{"name": f"scale-{i:05d}", "vhost": "/", "durable": False, "auto_delete": False,
                            "arguments": {}} for i in range(QUEUES)]}
        r = requests.post(f"{url}/api/definitions", json=defs, auth=ADMIN, timeout=300)
        assert r.status_code == 200 and r.json()["imported"]["queues"] == QUEUES, r.text
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    import shutil

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("the console tests need Chromium: apt-get install -y chromium (scripts/test.sh does)")
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def _api_ms(url: str, query: str, runs: int = 5) -> float:
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = requests.get(f"{url}/api/queues/%2F?{query}", auth=ADMIN, timeout=60)
        took.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200
    return round(sorted(took)[len(took) // 2], 1)


def test_UI2_queues_page_with_10000_queues(mgmt_url: str, browser: Browser) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(mgmt_url + "/")
    page.fill("#login-user", "guest")
    page.fill("#login-password", "guest")
    page.click("#login-form button[type=submit]")
    expect(page.locator("#whoami")).to_contain_text("guest")
    first_render = page.evaluate("""async () => {
        const t0 = performance.now();
        location.hash = '#/queues';
        await new Promise((done) => {
          const seen = () => (document.querySelector('#queues-list tbody td a') ? done() : requestAnimationFrame(seen));
          seen();
        });
        return performance.now() - t0;
    }""")
    rows = page.locator("#queues-list tbody tr")
    expect(rows).to_have_count(100)
    expect(page.locator("#queues-summary")).to_have_text("10,000 of 10,000 queues, 1-100 shown")
    assert page.locator("#queues-list tbody tr td a").first.inner_text() == "scale-00000"
    page.click("text=Next »")
    expect(page.locator("#queues-summary")).to_have_text("10,000 of 10,000 queues, 101-200 shown")
    assert page.locator("#queues-list tbody tr td a").first.inner_text() == "scale-00100"
    page.fill("#queue-filter", "^scale-0999[0-9]$")
    expect(page.locator("#queues-summary")).to_have_text("10 of 10,000 queues, 1-10 shown")
    page.click("#queues-list th button:text('Name')")  # already sorted by name: reversed
    expect(page.locator("#queues-list tbody tr td a").first).to_have_text("scale-09999")
    page.fill("#queue-filter", "")
    expect(page.locator("#queues-summary")).to_have_text("10,000 of 10,000 queues, 1-100 shown")
    expect(page.locator("#queues-list tbody tr td a").first).to_have_text("scale-09999")
    # Three live refreshes at the default 5 s, then what each cost in the browser.
    start = page.evaluate("() => cmqConsolePerf.refreshes")
    page.wait_for_function(f"() => cmqConsolePerf.refreshes >= {start + 3}", timeout=30_000)
    perf = page.evaluate("() => cmqConsolePerf")
    heap = page.evaluate("() => (performance.memory || {}).usedJSHeapSize || null")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / ".gitignore").write_text("*\n")
    page.screenshot(path=str(ARTIFACTS / "console-scale-queues.png"))
    context.close()
    live = perf["history"][-3:]
    numbers = {
        "queues": QUEUES,
        "browser_first_render_ms": round(first_render, 1),  # hash change to the first row drawn
        "browser_first_render_api_ms": round(perf["history"][0]["api"], 1),
        "browser_refresh_ms": [round(h["total"], 1) for h in live],
        "browser_refresh_api_ms": [round(h["api"], 1) for h in live],
        "browser_js_heap_bytes": heap,
        "api_page_100_sorted_by_name_ms": _api_ms(mgmt_url, "page=1&page_size=100&sort=name"),
        "api_page_100_sorted_by_messages_reversed_ms": _api_ms(mgmt_url, "page=1&page_size=100&sort=messages&sort_reverse=true"),
        "api_page_100_regex_filter_ms": _api_ms(mgmt_url, "page=1&page_size=100&name=%5Escale-0999&use_regex=true"),
        "api_whole_list_ms": _api_ms(mgmt_url, "", runs=3),
    }
    (ARTIFACTS / "console-scale.json").write_text(json.dumps(numbers, indent=2) + "\n")
    assert all(h["rows"] == 100 for h in live)
    assert errors == []
