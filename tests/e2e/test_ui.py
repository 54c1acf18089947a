"""The status page in a real browser: Debian's headless Chromium, driven by Playwright
(no browser download: `executable_path`), against two `tokengate serve` replicas sharing
a real redis-server, with a client loading one of them through the whole test.

A screenshot is kept at tests/artifacts/ui.png (CI keeps that folder).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.procs import ROOT, Gateway, GatewaySpec, Redis, Sim, free_port

Make = Callable[..., Gateway]
ADMIN = "admin-ui-e2e-0123456789"
ARTIFACT = ROOT / "tests" / "artifacts" / "ui.png"
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MAX_LOAD_REQUESTS = 3000  # the load stops by itself, whatever happens to the test
MAX_LOAD_SEC = 120


class Load:
    """Clients sending chat completions (streamed and not) until stopped or bounded."""

    def __init__(self, gw: Gateway, aliases: list[str]) -> None:
        self.gw = gw
        self.stop = threading.Event()
        self.sent = 0
        self.threads = [
            threading.Thread(target=self._run, args=(alias, i % 2 == 0), daemon=True)
            for i, alias in enumerate(aliases)
        ]

    def _run(self, alias: str, stream: bool) -> None:
        body = {
            "model": "gpt-4o",
            "stream": stream,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 16,
        }
        deadline = time.monotonic() + MAX_LOAD_SEC
        with httpx.Client(timeout=30, headers=self.gw.headers(alias)) as client:
            while not self.stop.is_set() and self.sent < MAX_LOAD_REQUESTS:
                if time.monotonic() > deadline:
                    return
                with client.stream("POST", f"{self.gw.url}/v1/chat/completions", json=body) as r:
                    r.read()
                self.sent += 1
                self.stop.wait(0.02)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is not installed (make test installs it)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _replicas(redis: Redis, sim: Sim, make_gateway: Make) -> tuple[Gateway, Gateway]:
    spec = GatewaySpec(
        settings={"admin_key": ADMIN},
        keys={"alice": {"priority": "high"}, "bob": {"requests_per_minute": 60}},
        env={"TOKENGATE_REDIS_URL": redis.url},
    )
    one = make_gateway(spec, sim.url)
    spec.secrets = one.keys
    return one, make_gateway(spec, sim.url)


def test_the_status_page_shows_a_gateway_under_load(
    browser: Any, sim: Sim, make_gateway: Make, redis: Redis
) -> None:
    shown, other = _replicas(redis, sim, make_gateway)
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, color_scheme="dark")
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))

    with Load(shown, ["alice", "alice", "bob"]) as load:
        page.goto(f"{shown.url}/")  # the root leads to the page, which asks for the key
        page.wait_for_selector("body[data-state=login]")
        assert page.url == f"{shown.url}/ui" and page.is_visible("#key")
        page.fill("#key", ADMIN)
        page.press("#key", "Enter")
        page.wait_for_selector("body[data-state=live]")

        # The key went nowhere but the Authorization header and this tab's session.
        assert page.url == f"{shown.url}/ui"
        assert page.evaluate("document.cookie") == ""
        assert page.evaluate("localStorage.length") == 0
        assert page.evaluate("sessionStorage.getItem('tokengate.admin-key')") == ADMIN

        # Domains, keys, and which replica this is among the others.
        assert "domain-a" in page.inner_text("#domains tbody")
        assert page.inner_text("#domains tbody").count("healthy") >= 1
        keys = page.inner_text("#keys tbody")
        assert "alice" in keys and "bob" in keys
        me = _snapshot(shown)["replica"]["id"]
        them = _snapshot(other)["replica"]["id"]
        assert me != them and me in page.inner_text("#replica")
        page.wait_for_function(
            "id => document.getElementById('replicas').textContent.includes(id)",
            arg=them,
            timeout=15_000,
        )

        # The numbers move: a later refresh counts more requests than an earlier one.
        first = int(page.inner_text("#total-requests"))
        page.wait_for_function(
            "n => Number(document.getElementById('total-requests').textContent) > n",
            arg=first,
            timeout=20_000,
        )
        assert load.sent > 0

        # Reloaded, the tab keeps its key: it was asked for once.
        page.reload()
        page.wait_for_selector("body[data-state=live]")
        page.wait_for_function(
            "() => document.querySelectorAll('#charts .line').length > 0", timeout=20_000
        )
        ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACT), full_page=True)

    assert problems == []
    assert ARTIFACT.stat().st_size > 10_000

    # Another tab with a wrong key: refused, asked again, nothing kept.
    stranger = browser.new_page()
    _log_in(stranger, shown, "not-the-admin-key")
    _login_error(stranger, "refused")
    assert stranger.evaluate("sessionStorage.length") == 0
    assert stranger.is_visible("#key") and not stranger.is_visible("#board")


def test_without_an_admin_key_the_page_says_how_to_enable_it(
    browser: Any, gateway: Gateway
) -> None:
    page = browser.new_page()
    _log_in(page, gateway, "any-key")
    _login_error(page, "TOKENGATE_ADMIN_KEY")
    assert page.evaluate("sessionStorage.length") == 0 and page.url == f"{gateway.url}/ui"


def _log_in(page: Any, gw: Gateway, key: str) -> None:
    page.goto(f"{gw.url}/ui")
    page.fill("#key", key)
    page.press("#key", "Enter")


def _login_error(page: Any, text: str) -> None:
    page.wait_for_function(
        "t => document.getElementById('login-error').textContent.includes(t)", arg=text
    )


def _snapshot(gw: Gateway) -> dict[str, Any]:
    r = httpx.get(
        f"{gw.url}/admin/ui/snapshot", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    r.raise_for_status()
    return dict(r.json())


def test_budgets_show_when_the_snapshot_has_them_and_nothing_renders_as_html(
    browser: Any, sim: Sim, make_gateway: Make
) -> None:
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), sim.url)
    snap = _snapshot(gw)
    hostile = '<img src=x id=injected onerror="document.title=1">'
    snap["keys"][0]["budget"] = {"used": 30, "limit": 100, "period": "month"}
    snap["attention"] = [{"level": "critical", "text": hostile}]
    snap["errors"] = {
        "total": 1,
        "recent": [
            {
                "at": snap["generated_unix"],
                "request_id": "req_x",
                "key": hostile,
                "model": "m",
                "domain": None,
                "status": 502,
                "code": "upstream_error",
                "message": hostile,
            }
        ],
    }
    page = browser.new_page()
    page.route(
        "**/admin/ui/snapshot",
        lambda route: route.fulfill(status=200, json=snap, headers={"cache-control": "no-store"}),
    )
    _log_in(page, gw, ADMIN)
    page.wait_for_selector("body[data-state=live]")

    assert page.is_visible("#keys th.budget")
    assert "30 of 100 / month" in page.inner_text("#keys tbody")
    assert page.inner_text("#attention") == hostile  # shown as text...
    assert page.inner_text("#errors tbody").count(hostile) == 2
    assert page.query_selector("#injected") is None  # ...never parsed as markup
    assert page.title() == "tokengate status"


def test_a_failing_domain_shows_its_cause_and_an_idle_key_reads_full(
    browser: Any, make_gateway: Make
) -> None:
    dead = free_port()  # nothing listens: every probe is refused
    gw = make_gateway(
        GatewaySpec(settings={"admin_key": ADMIN}, keys={"idle": {"requests_per_minute": 600}}),
        f"http://127.0.0.1:{dead}",
    )
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    _log_in(page, gw, ADMIN)
    page.wait_for_selector("body[data-state=live]")
    said = f"connection refused at 127.0.0.1:{dead}"
    page.wait_for_function(
        "t => document.querySelector('#domains tbody').textContent.includes(t)", arg=said
    )
    assert said in page.inner_text("#attention")  # why, not only "its health probe fails"
    cell = page.query_selector("#domains td.failure")
    assert cell is not None and "egress" in (cell.get_attribute("title") or "")  # the fix
    keys = page.inner_text("#keys tbody")
    assert "600 left of 600 · 0 used" in keys  # idle reads full, not "0 of 600"
    assert "left · used" in page.inner_text("#keys thead")
