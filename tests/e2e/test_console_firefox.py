"""The console in Debian's Firefox (SPEC UI1, UI2; issue 29: "works in current Chromium and
Firefox").

Playwright drives only its own Firefox build, which may not be downloaded here, so this test
speaks WebDriver BiDi, the W3C protocol Firefox serves itself (``--remote-debugging-port``),
over a WebSocket: a login through the form, every view drawn, a live depth update, HTML in
a queue name shown as text with no script run, no error in the page's console, and a
screenshot of each view as a test artefact.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pika
import pytest
import pytest_asyncio

from gateway.server import gateway_in_thread

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
WAIT = 30.0  # hang protection only
XSS = "<img src=x onerror=window.xssRan=1>"


class Bidi:
    """A WebDriver BiDi session: commands by id, events kept."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.get_running_loop().create_task(self._read())
        self.context = ""

    async def _read(self) -> None:
        async for msg in self.ws:
            data = msg.json()
            if "id" in data and data["id"] in self.waiting:
                self.waiting.pop(data["id"]).set_result(data)
            elif data.get("type") == "event":
                self.events.append(data)

    async def send(self, method: str, **params: Any) -> Any:
        i = next(self.ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[i] = fut
        await self.ws.send_json({"id": i, "method": method, "params": params})
        reply = await asyncio.wait_for(fut, WAIT)
        assert reply.get("type") == "success", reply
        return reply["result"]

    async def js(self, expression: str) -> Any:
        """The value of ``expression`` (awaited) in the page."""
        out = await self.send("script.evaluate", expression=expression, awaitPromise=True,
                              target={"context": self.context})
        assert out["type"] == "success", out
        return _value(out["result"])

    async def until(self, expression: str) -> Any:
        deadline = asyncio.get_running_loop().time() + WAIT
        while True:
            value = await self.js(expression)
            if value:
                return value
            assert asyncio.get_running_loop().time() < deadline, f"never true: {expression}"
            await asyncio.sleep(0.2)

    async def shot(self, name: str) -> None:
        out = await self.send("browsingContext.captureScreenshot", context=self.context)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / ".gitignore").write_text("*\n")
        (ARTIFACTS / f"firefox-{name}.png").write_bytes(base64.b64decode(out["data"]))


def _value(remote: dict[str, Any]) -> Any:
    """A BiDi remote value as Python (the primitives this test reads)."""
    kind = remote["type"]
    if kind in ("undefined", "null"):
        return None
    if kind == "array":
        return [_value(v) for v in remote.get("value", [])]
    return remote.get("value")


@pytest.fixture(scope="module")
def console_url() -> Iterator[tuple[str, int]]:
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), management_port=0, management_host="127.0.0.1") as gw:
        yield "http://" + dict(gw.operator_addresses())["management API"], gw.port


@pytest_asyncio.fixture(loop_scope="function")
async def firefox() -> AsyncIterator[Bidi]:
    exe = shutil.which("firefox-esr") or shutil.which("firefox")
    if exe is None:
        pytest.fail("the Firefox console test needs Debian's Firefox: apt-get install -y firefox-esr (scripts/test.sh does)")
    profile = tempfile.mkdtemp(prefix="console-firefox-")
    proc = subprocess.Popen([exe, "--headless", "--no-remote", "--profile", profile, "--remote-debugging-port=0",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:  # "WebDriver BiDi listening on ws://127.0.0.1:PORT"
            if m := re.search(r"WebDriver BiDi listening on (ws://\S+)", line):
                url = m.group(1)
                break
        assert url is not None, "Firefox did not start its WebDriver BiDi listener"
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "/session", max_msg_size=0) as ws:
            bidi = Bidi(ws)
            await bidi.send("session.new", capabilities={})
            tree = await bidi.send("browsingContext.getTree")
            bidi.context = tree["contexts"][0]["context"]
            await bidi.send("browsingContext.setViewport", context=bidi.context,
                            viewport={"width": 1280, "height": 900})  # issue 29: readable at 1280 px
            await bidi.send("session.subscribe", events=["log.entryAdded"])
            yield bidi
            bidi.reader.cancel()
    finally:
        proc.kill()
        proc.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


async def test_UI1_UI2_console_in_firefox(console_url: tuple[str, int], firefox: Bidi) -> None:
    url, amqp_port = console_url
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port,
                                                             credentials=pika.PlainCredentials("guest", "guest")))
    try:
        ch = conn.channel()
        for name in ("firefox-depth", XSS):
            ch.queue_declare(name)
        for i in range(3):
            ch.basic_publish("", "firefox-depth", f"m{i}".encode())
        ff = firefox
        await ff.send("browsingContext.navigate", context=ff.context, url=url + "/", wait="complete")
        await ff.until("!!document.querySelector('#login-form')")
        # A wrong password stays on the form with a message; the right one logs in.
        for password in ("wrong", "guest"):
            await ff.js(f"""(() => {{
                document.querySelector('#login-user').value = 'guest';
                document.querySelector('#login-password').value = '{password}';
                document.querySelector('#login-form').requestSubmit();
            }})()""")
            if password == "wrong":
                await ff.until("document.querySelector('#login-error').textContent.length > 0")
        await ff.until("(document.querySelector('#whoami') || {}).textContent?.includes('guest')")
        await ff.shot("overview")
        for view, ready in (("connections", "#connections-list"), ("channels", "#channels-list"),
                            ("exchanges", "#exchanges-list"), ("queues", "#queues-list tbody td a"),
                            ("admin", "#users-list"), ("cmq", "#cmq-topics"), ("overview", "#overview figure.chart")):
            await ff.js(f"location.hash = '#/{view}'")
            await ff.until(f"!!document.querySelector('{ready}')")
            await ff.shot(view)
        await ff.js("location.hash = '#/queues'")
        await ff.until("!!document.querySelector('#queues-list tbody td a')")
        depth = ("[...document.querySelectorAll('#queues-list tbody tr')].find("
                 "(r) => r.textContent.includes('firefox-depth'))?.children[6]?.textContent")
        assert await ff.until(depth) == "3"
        for i in range(4):  # the 5 s refresh brings the new depth, no reload
            ch.basic_publish("", "firefox-depth", f"n{i}".encode())
        await ff.until(f"{depth} === '7'")
        # HTML in a queue name is text: the characters shown, no element made, no script run.
        names = await ff.js("[...document.querySelectorAll('#queues-list tbody td a')].map((a) => a.textContent)")
        assert XSS in names
        assert await ff.js("document.querySelectorAll('#queues-list img').length") == 0
        assert await ff.js("window.xssRan === undefined")
        await ff.shot("queues-escaped")
        errors = [e["params"].get("text") for e in ff.events
                  if e.get("method") == "log.entryAdded" and e["params"].get("level") == "error"]
        assert errors == []
    finally:
        conn.close()
