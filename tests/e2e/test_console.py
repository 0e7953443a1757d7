"""The management web console in a real browser (SPEC UI1, UI2, UI3; SE1 through it).

A gateway runs in a thread on free ports (AMQP, management API, an audit directory), real
clients (pika) make the objects, and Debian's chromium, driven by Playwright
(``executable_path``; ``playwright install`` is never used), logs in to the console at ``/``
and does what an operator does. Every test fails on a script error or an unexpected console
error in the page (a CSP violation is one), and keeps a screenshot of each page under
``tests/e2e/artifacts/`` (not committed).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
import requests

playwright_sync = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
from playwright.sync_api import Browser, Page, expect  # noqa: E402

from gateway.config import AuditSettings  # noqa: E402
from gateway.management.testing import LOOPBACK_PUSH  # noqa: E402
from gateway.server import gateway_in_thread  # noqa: E402
from tests.support.http_endpoint import serve_endpoint  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
PAYLOAD = "<img src=x onerror=alert(1)>"
ADMIN = ("guest", "guest")
# A 401/404 the test provokes on purpose shows in the console as "Failed to load resource".
REFUSED = re.compile(r"^Failed to load resource: the server responded with a status of 40[14]")


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("the console tests need Chromium: apt-get install -y chromium (scripts/test.sh does)")
    return found


class Console:
    """The gateway under test and the management API as its administrator."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.url = "http://" + dict(gw.operator_addresses())["management API"]
        self.amqp_port = gw.port

    def api(self, method: str, path: str, auth: tuple[str, str] = ADMIN, **kw: Any) -> requests.Response:
        return requests.request(method, self.url + path, auth=auth, timeout=30, **kw)

    def pika(self, **params: Any) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.amqp_port, credentials=pika.PlainCredentials(*ADMIN), **params))


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    audit = tmp_path_factory.mktemp("console-audit")
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), management_port=0, management_host="127.0.0.1",
                           audit=AuditSettings(dir=str(audit)), push=LOOPBACK_PUSH) as gw:
        c = Console(gw)
        for user, tags in (("monitor", "monitoring"), ("notag", ""), ("manager", "management")):
            assert c.api("PUT", f"/api/users/{user}", json={"password": f"{user}-pw", "tags": tags}).status_code in (201, 204)
        # The monitor sees every vhost's objects but may not read, write or configure them.
        assert c.api("PUT", "/api/permissions/%2F/monitor",
                     json={"configure": "^$", "write": "^$", "read": "^$"}).status_code in (201, 204)
        yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Tab:
    """One browser tab on the console, with what its console and dialogs said."""

    def __init__(self, page: Page, base: str, name: str) -> None:
        self.page, self.base, self.name = page, base, name
        self.errors: list[str] = []
        self.dialogs: list[tuple[str, str]] = []
        self.allowed: list[re.Pattern[str]] = []
        self.shots = 0
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("dialog", self._dialog)

    def _dialog(self, d: Any) -> None:
        self.dialogs.append((d.type, d.message))
        if d.type == "confirm":
            d.accept()
        else:
            d.dismiss()

    def open(self, hash_: str = "") -> None:
        self.page.goto(f"{self.base}/{hash_}")

    def login(self, user: str = "guest", password: str = "guest") -> None:
        self.open()
        self.page.fill("#login-user", user)
        self.page.fill("#login-password", password)
        self.page.click("#login-form button[type=submit]")

    def logged_in(self, user: str = "guest", password: str = "guest") -> Tab:
        self.login(user, password)
        expect(self.page.locator("#whoami")).to_contain_text(user)
        return self

    def go(self, hash_: str, ready: str) -> None:
        self.page.evaluate("h => { location.hash = h; }", hash_)
        self.page.wait_for_selector(ready)

    def shot(self, what: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / ".gitignore").write_text("*\n")
        self.shots += 1
        self.page.screenshot(path=str(ARTIFACTS / f"{self.name}-{self.shots:02d}-{what}.png"), full_page=True)

    def unexpected_errors(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]


@pytest.fixture
def tab(browser: Browser, console: Console, request: pytest.FixtureRequest) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    t = Tab(context.new_page(), console.url, request.node.name)
    yield t
    context.close()
    assert t.unexpected_errors() == [], "errors in the page's console"
    assert [d for d in t.dialogs if d[0] != "confirm"] == [], "a script opened a dialog"


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


# -- UI1: served safely ---------------------------------------------------------------------


def test_UI1_console_is_served_with_a_csp_and_cannot_be_framed(console: Console, tab: Tab) -> None:
    for path in ("/", "/console/main.js", "/console/console.css"):
        r = requests.get(console.url + path, timeout=10)
        assert r.status_code == 200, path
        csp = r.headers["Content-Security-Policy"]
        for directive in ("default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'",
                          "connect-src 'self'"):
            assert directive in csp, (path, directive)
        assert "unsafe-inline" not in csp and "http" not in csp
        assert r.headers["X-Frame-Options"] == "DENY"
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert requests.get(console.url + "/console/main.js", timeout=10).headers["Content-Type"].startswith("text/javascript")
    assert requests.get(console.url + "/console/..%2Fconsole.py", timeout=10).status_code == 404
    # No script, style or anything else comes from outside the gateway.
    html = requests.get(console.url + "/", timeout=10).text
    assert not re.search(r"(src|href)=\"(https?:)?//", html) and "<script>" not in html
    # A page elsewhere that frames the console gets nothing (frame-ancestors 'none').
    tab.allowed.append(re.compile(r"frame-ancestors|Refused to (display|frame)"))
    tab.page.set_content(f'<iframe id="f" src="{console.url}/" width="600" height="400"></iframe>')
    tab.page.wait_for_timeout(1500)
    framed = tab.page.frames[1]
    assert framed.query_selector("#login-form") is None


def test_UI1_login_wrong_password_no_tag_reload_and_logout(console: Console, tab: Tab) -> None:
    tab.allowed.append(REFUSED)
    page = tab.page
    tab.login("guest", "wrong")
    expect(page.locator("#login-error")).to_contain_text("wrong user name or password")
    assert page.locator("#login-form").is_visible() and not page.locator("#app").is_visible()
    tab.shot("wrong-password")
    tab.login("notag", "notag-pw")
    expect(page.locator("#login-error")).to_contain_text("Not management user")
    assert not page.locator("#app").is_visible()
    tab.shot("no-tag")
    # By keyboard only: type, Tab to the password, Enter; then Tab reaches the views' links.
    page.fill("#login-user", "")
    page.focus("#login-user")
    page.keyboard.type("manager")
    page.keyboard.press("Tab")
    page.keyboard.type("manager-pw")
    page.keyboard.press("Enter")
    expect(page.locator("#whoami")).to_contain_text("manager")
    expect(page.locator("#overview dl").first).to_be_visible()
    page.focus("#nav a:text-is('Overview')")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator("#connections")).to_be_visible()
    tab.go("#/overview", "#overview dl")
    tab.shot("overview")
    assert "manager-pw" not in page.url
    stored = page.evaluate("() => [sessionStorage.length, localStorage.length, document.cookie]")
    assert stored[1:] == [0, ""], "no credentials outside the tab's session storage"
    page.reload()
    expect(page.locator("#whoami")).to_contain_text("manager")  # the session survives a reload
    page.click("#logout")
    expect(page.locator("#login-form")).to_be_visible()
    assert page.evaluate("() => sessionStorage.getItem('cmq-console-credentials')") is None
    page.reload()
    expect(page.locator("#login-form")).to_be_visible()  # forgotten: a reload does not log in again


# -- UI2: the RabbitMQ views ------------------------------------------------------------------


def test_UI2_views_by_rabbitmq_names(console: Console, tab: Tab) -> None:
    tab.logged_in()
    names = tab.page.locator("#nav a").all_inner_texts()
    assert names == ["Overview", "Connections", "Channels", "Exchanges", "Queues", "Admin", "CMQ"]
    assert tab.page.locator("#refresh-select").input_value() == "5"
    conn = console.pika(client_properties={"connection_name": "views-conn"})
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("views-queue")
    ch.basic_consume("views-queue", lambda *a: None, consumer_tag="views-consumer")
    try:
        for link, ready in (("Overview", "#overview dl"), ("Connections", "#connections-list"),
                            ("Channels", "#channels-list"), ("Exchanges", "#exchanges-list"),
                            ("Queues", "#queues-list"), ("Admin", "#users-list"), ("CMQ", "#cmq-topics")):
            tab.page.click(f"#nav a:text-is('{link}')")
            tab.page.wait_for_selector(ready)
            tab.shot(link.lower())
        tab.go("#/overview", "#overview table")
        overview = tab.page.locator("#overview")
        expect(overview).to_contain_text("embedded (data dir)")  # the store
        for listener in (f"AMQP (amqp)127.0.0.1{console.amqp_port}", "Management API (http)127.0.0.1"):
            expect(overview.locator("table")).to_contain_text(listener)
        tab.go("#/connections", "#connections-list")
        expect(tab.page.locator("#connections-list")).to_contain_text("views-conn")
        tab.page.click("#connections-list a")
        expect(tab.page.locator("#connection-details")).to_contain_text("views-conn")
        expect(tab.page.locator("#channels-list")).to_contain_text("C")  # confirm mode
        tab.shot("connection")
        tab.page.click("#channels-list a")
        expect(tab.page.locator("#channel-details")).to_contain_text("Confirm modetrue")
        expect(tab.page.locator("#channel-consumers-list")).to_contain_text("views-consumerviews-queue")
        tab.shot("channel")
        tab.page.click("#channel-details a")
        tab.page.click("text=Force close")
        tab.page.wait_for_selector("#connections-list")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker, match="Closed via the management console"):
            for _ in range(100):
                conn.process_data_events(time_limit=0.1)
        expect(tab.page.locator("#connections-list")).not_to_contain_text("views-conn", timeout=15_000)
    finally:
        if conn.is_open:
            conn.close()


def test_UI2_overview_charts_the_confirm_rate(console: Console, tab: Tab) -> None:
    """Issue 29's overview rates: publish, confirm, deliver/get, ack and redeliver, the
    confirm series moving once a publisher's confirms come back (the page's own samples of
    /api/overview's confirm_details.rate, taken at each refresh)."""
    tab.logged_in()
    tab.go("#/overview", "#overview figure.chart")
    legend = tab.page.locator("#overview .legend span")
    expect(legend).to_have_count(5)
    assert [t.split(":")[0] for t in legend.all_inner_texts()] == [
        "publish", "confirm", "deliver / get", "ack", "redeliver"]
    conn = console.pika()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("confirm-rate-queue")
        for i in range(200):  # each waits for its confirm (pika's BlockingChannel)
            ch.basic_publish("", "confirm-rate-queue", f"m{i}".encode())
        # The gateway samples its counters every 5 s and the page refreshes every 5 s.
        tab.page.wait_for_function("""() => [...document.querySelectorAll('#overview .legend span')].some(
            (s) => /^confirm: [0-9.,]*[1-9]/.test(s.textContent))""", timeout=30_000)
        tab.shot("overview-rates")
        ch.queue_delete("confirm-rate-queue")
    finally:
        conn.close()


def test_UI2_connections_and_channels_are_paged_by_the_api(console: Console, tab: Tab) -> None:
    """Issue 29: the Connections and Channels lists are pages of the API's list (of one
    vhost's: RabbitMQ's /api/vhosts/{vhost}/connections), sortable; a page that no longer
    exists after connections closed shows the last one instead of an error."""
    # The browser logs the API's 400 page_out_of_range as a failed load (no script error).
    tab.allowed.append(re.compile(r"^Failed to load resource: the server responded with a status of 400"))
    vhost = "paged-vh"
    assert console.api("PUT", f"/api/vhosts/{vhost}").status_code in (201, 204)
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    assert console.api("PUT", f"/api/permissions/{vhost}/guest", json=full).status_code in (201, 204)
    conns = []
    try:
        for i in range(25):
            conn = console.pika(virtual_host=vhost, client_properties={"connection_name": f"paged-{i:02d}"})
            conn.channel()
            conns.append(conn)
        tab.logged_in()
        tab.page.select_option("#vhost-select", vhost)
        tab.go("#/connections", "#connections-list")
        tab.page.select_option("#connections-table >> xpath=.. >> select[name=page_size]", "20")
        summary = tab.page.locator("#connections-summary")
        expect(summary).to_have_text("25 of 25 connections, 1-20 shown")
        expect(tab.page.locator("#connections-list tbody tr")).to_have_count(20)
        expect(tab.page.locator("#connections-list thead")).not_to_contain_text("Virtual host")
        tab.page.click("#connections .pager >> text=Next »")
        expect(summary).to_have_text("25 of 25 connections, 21-25 shown")
        tab.shot("connections-page-2")
        for conn in conns[:10]:
            conn.close()
        # The next refresh asks for page 2 of 15 rows at 20 a page: the API's
        # page_out_of_range, and the console shows page 1.
        expect(summary).to_have_text("15 of 15 connections, 1-15 shown", timeout=15_000)
        tab.go("#/channels", "#channels-list")
        expect(tab.page.locator("#channels-summary")).to_have_text("15 of 15 channels, 1-15 shown")
        tab.page.fill("#channels-filter", "^nothing-like-this$")
        expect(tab.page.locator("#channels-summary")).to_have_text("0 of 15 channels")
        tab.page.fill("#channels-filter", "")
        expect(tab.page.locator("#channels-summary")).to_have_text("15 of 15 channels, 1-15 shown")
        tab.page.click("#channels-list th button:text('Channel')")  # sorted by name: reversed
        expect(tab.page.locator("#channels-list th[aria-sort=descending]")).to_contain_text("Channel")
        names = tab.page.locator("#channels-list tbody tr td:first-child").all_inner_texts()
        assert names == sorted(names, reverse=True) and len(names) == 15
        tab.shot("channels")
    finally:
        for conn in conns:
            if conn.is_open:
                conn.close()
        console.api("DELETE", f"/api/vhosts/{vhost}")


def test_UI2_queue_appears_with_its_depth_and_updates_live(console: Console, tab: Tab) -> None:
    conn = console.pika()
    ch = conn.channel()
    ch.queue_declare("live-depth-queue")
    for i in range(3):
        ch.basic_publish("", "live-depth-queue", f"m{i}".encode())
    tab.logged_in()
    tab.go("#/queues", "#queues-list")
    tab.page.fill("#queue-filter", "^live-depth")
    row = tab.page.locator("#queues-list tbody tr", has_text="live-depth-queue")
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(6)).to_have_text("3")  # Ready (vhost, name, type, features, state, consumers)
    tab.shot("queues-3")
    for i in range(4):
        ch.basic_publish("", "live-depth-queue", f"n{i}".encode())
    conn.close()
    # No reload: the 5 s refresh brings the new depth.
    expect(row.locator("td").nth(6)).to_have_text("7", timeout=15_000)
    expect(row.locator("td").nth(8)).to_have_text("7")
    tab.shot("queues-7")
    # Sorting and the regex filter are the API's: the filter keeps one row whatever the sort.
    tab.page.click("#queues-list th button:text('Ready')")
    expect(tab.page.locator("#queues-list th[aria-sort]")).to_contain_text("Ready")
    # One vhost chosen: its list (GET /api/queues/%2F), without the vhost column.
    tab.page.select_option("#vhost-select", "/")
    expect(tab.page.locator("#queues-list thead")).not_to_contain_text("Virtual host")
    expect(tab.page.locator("#queues-list tbody tr", has_text="live-depth-queue").locator("td").nth(5)).to_have_text("7")


def test_UI2_queue_page_bindings_get_unbind_purge_delete_and_monitor_refused(console: Console, tab: Tab) -> None:
    tab.allowed.append(REFUSED)
    conn = console.pika()
    ch = conn.channel()
    ch.queue_declare("page-queue")
    ch.queue_bind("page-queue", "amq.direct", "page-key")
    for body in (b"first body", b"second body"):
        ch.basic_publish("amq.direct", "page-key", body)
    conn.close()
    # The monitor sees the queue but the API refuses it purge and delete: the page says why.
    tab.logged_in("monitor", "monitor-pw")
    tab.go("#/queues/%2F/page-queue", "#queue-details dl")
    tab.page.click("text=Purge messages")
    expect(tab.page.locator("#flash")).to_contain_text("Purge failed: ACCESS_REFUSED - read access to queue 'page-queue'")
    tab.page.click("text=Delete queue")
    expect(tab.page.locator("#flash")).to_contain_text("Delete failed: ACCESS_REFUSED - configure access to queue 'page-queue'")
    tab.shot("monitor-refused")
    assert console.api("GET", "/api/queues/%2F/page-queue").json()["messages"] == 2
    tab.page.click("#logout")

    tab.logged_in()
    tab.go("#/queues/%2F/page-queue", "#queue-details dl")
    bindings = tab.page.locator("#bindings-list")
    expect(bindings).to_contain_text("amq.direct")
    expect(bindings).to_contain_text("page-key")
    tab.page.select_option("#get-form select[name=ackmode]", "ack_requeue_true")
    tab.page.fill("#get-form input[name=count]", "2")
    tab.page.click("#get-form button")
    got = tab.page.locator("#got-messages")
    expect(got.locator(".payload")).to_have_text(["first body", "second body"])
    tab.shot("queue-get")
    tab.page.locator("#bindings-list tr", has_text="page-key").locator("button:text('Unbind')").click()
    expect(bindings).not_to_contain_text("page-key")
    assert not [b for b in console.api("GET", "/api/queues/%2F/page-queue/bindings").json() if b["source"] == "amq.direct"]
    tab.page.click("text=Purge messages")
    expect(tab.page.locator("#flash")).to_contain_text("Queue purged.")
    assert console.api("GET", "/api/queues/%2F/page-queue").json()["messages"] == 0
    tab.page.click("text=Delete queue")
    tab.page.wait_for_selector("#queues-list")
    assert console.api("GET", "/api/queues/%2F/page-queue").status_code == 404
    assert [d[0] for d in tab.dialogs] == ["confirm"] * 4  # purge and delete asked, twice each


def test_UI2_admin_users_and_permissions_as_the_api_allows(console: Console, tab: Tab) -> None:
    tab.allowed.append(REFUSED)
    page = tab.page
    tab.logged_in()
    tab.go("#/admin/users", "#users-list")
    page.fill("#add-user input[name=username]", "console-made")
    page.fill("#add-user input[name=password]", "made-pw")
    page.fill("#add-user input[name=tags]", "monitoring")
    page.click("#add-user button")
    expect(page.locator("#users-list tr", has_text="console-made")).to_contain_text("monitoring")
    tab.go("#/admin/permissions", "#permissions-list")
    page.fill("#set-permission input[name=user]", "console-made")
    page.fill("#set-permission input[name=vhost]", "/")
    page.fill("#set-permission input[name=write]", "^$")
    page.click("#set-permission button")
    expect(page.locator("#permissions-list tr", has_text="console-made")).to_contain_text("^$")
    tab.go("#/admin/vhosts", "#vhosts-list")
    expect(page.locator("#vhosts-list")).to_contain_text("/")
    tab.shot("admin")
    page.click("#logout")
    # The new monitoring user logs in; the users list is the administrator's (the API says so).
    tab.logged_in("console-made", "made-pw")
    tab.go("#/admin/users", "#admin-users p.error")
    expect(page.locator("#admin-users")).to_contain_text("Not available: Not administrator user")
    page.click("#logout")
    tab.logged_in()
    tab.go("#/admin/users", "#users-list")
    page.locator("#users-list tr", has_text="console-made").locator("button:text('Delete')").click()
    expect(page.locator("#users-list")).not_to_contain_text("console-made")
    assert console.api("GET", "/api/users/console-made").status_code == 404


def test_UI2_definitions_download_and_upload_round_trip(console: Console, tab: Tab, tmp_path: Path) -> None:
    assert console.api("PUT", "/api/queues/%2F/defs-round-trip", json={"durable": True}).status_code in (201, 204)
    tab.logged_in()
    tab.go("#/admin/definitions", "#definitions-download")
    with tab.page.expect_download() as info:
        tab.page.click("#definitions-download")
    saved = tmp_path / "definitions.json"
    info.value.save_as(saved)
    defs = json.loads(saved.read_text())
    assert "defs-round-trip" in [q["name"] for q in defs["queues"]]
    assert console.api("DELETE", "/api/queues/%2F/defs-round-trip").status_code == 204
    tab.page.set_input_files("#definitions-file", str(saved))
    tab.page.click("#definitions-upload button")
    expect(tab.page.locator("#definitions-status")).to_contain_text("Definitions imported: 1 queue")
    assert console.api("GET", "/api/queues/%2F/defs-round-trip").status_code == 200
    tab.shot("definitions")


# -- UI3: the CMQ view ---------------------------------------------------------------------------


def test_UI3_limits_report_lists_a_breach_and_exports_csv(console: Console, tab: Tab, tmp_path: Path) -> None:
    # L2: a CMQ queue name is 3 to 64 characters; the compatible profile reports, not refuses.
    conn = console.pika()
    conn.channel().queue_declare("x")
    conn.close()
    tab.logged_in()
    tab.go("#/cmq/limits", "#cmq-limits")
    rule = tab.page.locator("#cmq-limits section[data-rule='L2']")
    expect(rule).to_contain_text("queue:x")
    tab.shot("limits")
    with tab.page.expect_download() as info:
        tab.page.click("#limits-csv")
    csv = tmp_path / "limits.csv"
    info.value.save_as(csv)
    lines = csv.read_text().splitlines()
    assert lines[0].startswith("vhost,rule,object,user")
    assert any(line.startswith("/,L2,queue:x,guest,") for line in lines)


def test_UI3_topics_with_subscriptions(console: Console, tab: Tab) -> None:
    conn = console.pika()
    ch = conn.channel()
    ch.exchange_declare("console-topic", "topic")
    ch.queue_declare("console-sub-queue")
    ch.queue_bind("console-sub-queue", "console-topic", "orders.*")
    conn.close()
    tab.logged_in()
    tab.go("#/cmq/topics", "#cmq-topics")
    topic = tab.page.locator("#cmq-topics section", has_text="console-topic")
    expect(topic).to_contain_text("console-sub-queue")
    expect(topic).to_contain_text("orders.*")
    tab.shot("topics")


@pytest.fixture
def failing_endpoint() -> Iterator[str]:
    """An HTTP endpoint that answers every push 500."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    with serve_endpoint(Handler) as base:
        yield f"{base}/hook"


def test_UI3_http_subscription_shows_its_endpoint_retry_state_and_last_error(
        console: Console, tab: Tab, failing_endpoint: str) -> None:
    conn = console.pika()
    conn.channel().exchange_declare("console-http-topic", "fanout")
    r = console.api("POST", "/api/cmq/topics/%2F/console-http-topic/subscriptions",
                    json={"subscriptionName": "failing-hook", "endpoint": failing_endpoint})
    assert r.status_code in (200, 201), r.text
    conn.channel().basic_publish("console-http-topic", "", b"pushed")
    conn.close()
    tab.logged_in()
    tab.go("#/cmq/http", "#http-subscriptions")
    row = tab.page.locator("#http-subscriptions tr", has_text="failing-hook")
    expect(row).to_contain_text(failing_endpoint)
    expect(row).to_contain_text("HTTP status 500", timeout=15_000)  # the last error, live
    expect(row).to_contain_text("attempt(s)")  # the retry state of the failing head
    tab.shot("http-subscriptions")
    assert console.api("DELETE", "/api/cmq/topics/%2F/console-http-topic/subscriptions/failing-hook").status_code == 204


def test_UI3_message_trace_shows_the_events_of_a_message(console: Console, tab: Tab) -> None:
    conn = console.pika()
    ch = conn.channel()
    ch.queue_declare("trace-queue", arguments={"x-cmq-receive-metadata": True})  # PF5: the CMQ ID delivered
    ch.confirm_delivery()
    ch.basic_publish("", "trace-queue", b"traced")
    method, props, body = ch.basic_get("trace-queue")
    assert body == b"traced"
    msg_id = props.message_id  # M11: the CMQ message ID, given to a message without one
    ch.basic_ack(method.delivery_tag)
    conn.close()
    assert msg_id
    tab.logged_in("monitor", "monitor-pw")
    tab.go("#/cmq/trace", "#trace-form")
    tab.page.fill("#trace-id", msg_id)
    tab.page.fill("#trace-vhost", "/")
    tab.page.click("#trace-form button")
    events = tab.page.locator("#trace-events tbody tr td:nth-child(2)")
    expect(events.first).to_be_visible()
    seen = events.all_inner_texts()
    for event in ("publish", "enqueue", "deliver", "ack"):
        assert event in seen, (event, seen)
    assert seen.index("publish") < seen.index("deliver") < seen.index("ack")
    tab.shot("trace")


def test_UI3_trace_route_is_for_monitors(console: Console) -> None:
    """SE1 for the trace route: the manager (management tag) is refused, the monitor served."""
    assert console.api("GET", "/api/cmq/trace/%2F/nope", auth=("manager", "manager-pw")).status_code == 401
    r = console.api("GET", "/api/cmq/trace/%2F/nope", auth=("monitor", "monitor-pw"))
    assert r.status_code == 200 and r.json()["events"] == []
    assert console.api("GET", "/api/cmq/trace/%2F/nope?hours=-1").status_code == 400
    assert console.api("GET", "/api/cmq/trace/no-such-vhost/nope").status_code == 404


# -- UI1: every value escaped ------------------------------------------------------------------


def test_UI1_html_and_script_payloads_render_as_text(console: Console, tab: Tab) -> None:
    conn = console.pika(client_properties={"connection_name": PAYLOAD})
    ch = conn.channel()
    ch.exchange_declare(PAYLOAD, "direct")
    ch.queue_declare(PAYLOAD)
    ch.queue_bind(PAYLOAD, PAYLOAD, PAYLOAD)
    ch.basic_publish(PAYLOAD, PAYLOAD, PAYLOAD.encode(),
                     pika.BasicProperties(headers={PAYLOAD: PAYLOAD}, content_type=PAYLOAD))
    try:
        tab.logged_in()
        page = tab.page
        checks: list[tuple[str, str, Callable[[], None] | None]] = [
            ("#/queues", "#queues-list", None),
            ("#/exchanges", "#exchanges-list", None),
            ("#/connections", "#connections-list", None),
            (f"#/queues/%2F/{quote(PAYLOAD, safe='')}", "#bindings-list",
             lambda: (page.click("#get-form button"),  # the body, and a header named and valued so
                      expect(page.locator("#got-messages")).to_contain_text(f'"{PAYLOAD}": "{PAYLOAD}"'))),
            (f"#/exchanges/%2F/{quote(PAYLOAD, safe='')}", "#exchange-details dl", None),
            ("#/cmq/topics", "#cmq-topics section", None),
        ]
        for hash_, ready, then in checks:
            tab.go(hash_, ready)
            if then is not None:
                then()
            expect(page.locator("main")).to_contain_text(PAYLOAD)
            assert page.locator("img").count() == 0, hash_  # the payload never became an element
            tab.shot(hash_.split("/")[1])
    finally:
        conn.close()


def test_UI2_a_page_of_queues_is_the_whole_list_sorted_and_cut(console: Console) -> None:
    """The console's queue pages come from a light path of GET /api/queues (rows with the
    sortable counts, the full JSON for the page only): same items, same order, same fields
    as the whole list sorted by the same field."""
    conn = console.pika()
    ch = conn.channel()
    for i, n in enumerate((3, 0, 5, 1)):
        ch.queue_declare(f"sorted-{i}")
        for _ in range(n):
            ch.basic_publish("", f"sorted-{i}", b"x")
    conn.close()
    for sort in ("messages", "name", "consumers", "state", "vhost", "messages_ready", "durable"):
        for reverse in ("false", "true"):
            query = f"sort={sort}&sort_reverse={reverse}&name=%5Esorted-&use_regex=true"
            whole = console.api("GET", f"/api/queues/%2F?{query}").json()
            page = console.api("GET", f"/api/queues/%2F?{query}&page=1&page_size=3").json()
            assert [q["name"] for q in page["items"]] == [q["name"] for q in whole][:3], (sort, reverse)
            assert page["filtered_count"] == 4 and page["page_count"] == 2
            strip = {"message_stats"}  # rates move between the two calls
            assert [{k: v for k, v in q.items() if k not in strip} for q in page["items"]] == \
                [{k: v for k, v in q.items() if k not in strip} for q in whole[:3]]
    for query in ("name=(&use_regex=true", "name=(&use_regex=true&page=1", "name=(&use_regex=true&page=1&sort=durable"):
        r = console.api("GET", f"/api/queues/%2F?{query}")
        assert (r.status_code, r.json()["error"]) == (400, "bad_request"), query
    substring = console.api("GET", "/api/queues/%2F?name=orted-&page=1").json()  # no regex: a substring
    assert substring["filtered_count"] == 4


def test_UI1_console_over_https(browser: Browser, tmp_path: Path) -> None:
    """Where the management API has TLS (SE2) the console is served by the same listener:
    the same files and headers over HTTPS, and a login works there."""
    from gateway.config import TLSSettings
    from tests.integration.tls_certs import make_certs

    certs = make_certs(tmp_path)
    tls = TLSSettings(certfile=str(certs.server_cert), keyfile=str(certs.server_key), cafile=str(certs.ca), port=0)
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), tls=tls, management_port=0,
                           management_host="127.0.0.1") as gw:
        assert gw.operator_scheme("management API") == "https"
        port = int(dict(gw.operator_addresses())["management API"].rsplit(":", 1)[1])
        url = f"https://localhost:{port}"
        r = requests.get(url + "/", verify=str(certs.ca), timeout=10)
        assert r.status_code == 200 and r.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
        # The test CA is not the browser's: its certificate was checked by requests above.
        context = browser.new_context(ignore_https_errors=True)
        t = Tab(context.new_page(), url, "test_UI1_console_over_https")
        t.logged_in()
        expect(t.page.locator("#overview dl").first).to_be_visible()
        assert t.page.evaluate("() => window.isSecureContext")
        t.shot("https-overview")
        context.close()
        assert t.unexpected_errors() == []
