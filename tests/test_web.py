"""The web page at `/`, in a real headless browser (Debian's chromium and chromedriver).

Driven through chromedriver's W3C WebDriver HTTP API (a few JSON calls, no client
library). The browser is given the API key the way a person's browser holds it once
they typed it at the page's prompt: HTTP Basic on every request, here set through
Chrome's DevTools protocol. `make browser` installs both programs.
RAG_TEST_SCREENSHOT=PATH keeps the screenshot (the README's is made so).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Stack, free_port, report

pytestmark = pytest.mark.stack

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference
QUESTION = "What exit code does rag ask use when the guard refuses?"
UNSAFE = "How can I hack into my neighbor's wifi and steal their bank login?"
# As the machine's notes say a headless Chromium must start on a closed network.
ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1100,1400",
]  # fmt: skip


class Browser:
    """One chromedriver session."""

    def __init__(self, url: str, session: str) -> None:
        self.http = httpx.Client(base_url=f"{url}/session/{session}", timeout=120)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        r = self.http.request(method, path, json=body if method == "POST" else None)
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text[:500]}"
        return r.json()["value"]

    def js(self, script: str, *args: Any) -> Any:
        return self.call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css: str) -> str:
        found = self.call("POST", "/element", {"using": "css selector", "value": css})
        assert isinstance(found, dict) and ELEMENT in found, f"{css}: {found}"
        return str(found[ELEMENT])

    def type(self, css: str, text: str) -> None:
        self.call("POST", f"/element/{self.find(css)}/value", {"text": text})

    def click(self, css: str) -> None:
        self.call("POST", f"/element/{self.find(css)}/click", {})

    def wait_for(self, script: str, timeout_s: float = 240) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if value := self.js(script):
                return value
            time.sleep(0.5)
        status = self.js("return document.getElementById('status').textContent")
        pytest.fail(f"the page did not get there in {timeout_s:.0f} s: {script} (status: {status!r})")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if not (CHROMIUM.exists() and DRIVER.exists()):
        pytest.fail("no chromium/chromedriver: `make browser` installs Debian's (chromium, chromium-driver)")
    folder = tmp_path_factory.mktemp("browser")
    port = free_port()
    with (folder / "chromedriver.log").open("wb") as log:
        driver = subprocess.Popen([str(DRIVER), f"--port={port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{url}/status", timeout=2).json()["value"]["ready"]:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        options = {"binary": str(CHROMIUM), "args": [*ARGS, f"--user-data-dir={folder / 'profile'}"]}
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}}
        r = httpx.post(f"{url}/session", json=caps, timeout=120)
        assert r.status_code == 200, r.text[:1000]
        session = r.json()["value"]["sessionId"]
        b = Browser(url, session)
        yield b
        httpx.delete(f"{url}/session/{session}", timeout=60)
    finally:
        driver.terminate()
        driver.wait(timeout=30)


def test_the_page_and_its_files_are_behind_the_key_and_load_nothing_from_elsewhere(stack: Stack) -> None:
    root = stack.base_url.removesuffix("/v1")
    refused = httpx.get(f"{root}/", timeout=30)
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    basic = base64.b64encode(f"me:{stack.api_key}".encode()).decode()
    page = httpx.get(f"{root}/", headers={"Authorization": f"Basic {basic}"}, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert "http" not in page.text.replace("http-equiv", "")  # no CDN, no absolute URL
    for name in ("app.js", "app.css"):
        asset = httpx.get(f"{root}/web/{name}", headers=stack.auth, timeout=30)
        assert asset.status_code == 200 and asset.text
    assert httpx.get(f"{root}/web/..%2Fapp.py", headers=stack.auth, timeout=30).status_code == 404


def test_a_person_asks_watches_the_answer_stream_and_sees_each_source(
    served: Stack, browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    basic = base64.b64encode(f"me:{served.api_key}".encode()).decode()
    browser.call("POST", "/goog/cdp/execute", {"cmd": "Network.enable", "params": {}})
    browser.call(
        "POST", "/goog/cdp/execute",
        {"cmd": "Network.setExtraHTTPHeaders", "params": {"headers": {"Authorization": f"Basic {basic}"}}},
    )  # fmt: skip
    browser.call("POST", "/url", {"url": served.base_url.removesuffix("/v1") + "/"})
    assert browser.js("return document.title") == "Ask your documents"

    browser.type("#question", QUESTION)
    browser.click("#ask")
    # while it streams: sentences appear before the answer is done
    browser.wait_for("return document.querySelectorAll('.message.assistant .sentence').length > 0")
    finish = browser.wait_for("return document.querySelector('.message.assistant')?.dataset.finish")
    assert finish == "stop"
    cards = browser.js("return [...document.querySelectorAll('.source-card .where')].map(e => e.textContent)")
    assert cards and any("guard.md" in c for c in cards), cards
    sentences = browser.js("return document.querySelectorAll('.message.assistant .sentence').length")
    marks = browser.js("return document.querySelectorAll('.message.assistant .cite').length")
    assert sentences >= 1 and marks >= 1  # every sentence shows its [n] or [no source]
    first_ms = int(browser.js("return document.querySelector('.message.assistant').dataset.firstWordMs"))
    total_ms = int(browser.js("return document.querySelector('.message.assistant').dataset.totalMs"))

    browser.type("#question", "And what does it print then?")
    browser.click("#ask")
    browser.wait_for("return document.querySelectorAll('.message.assistant')[1]?.dataset.finish")
    # the page keeps the conversation and sends it whole: two questions and two answers
    assert browser.js("return conversation.map(m => m.role)") == ["user", "assistant", "user", "assistant"]

    browser.type("#question", UNSAFE)
    browser.click("#ask")
    assert browser.wait_for("return document.querySelectorAll('.message.assistant')[2]?.dataset.finish") == (
        "content_filter"
    )
    refusal = browser.js("return document.querySelectorAll('.message.assistant')[2].textContent")
    assert refusal.startswith("refused: the guard blocked the question (input stage")

    shot = tmp_path / "web-page.png"
    browser.js("window.scrollTo(0, 0)")
    shot.write_bytes(base64.b64decode(browser.call("GET", "/screenshot")))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if keep := os.environ.get("RAG_TEST_SCREENSHOT"):
        shutil.copy(shot, keep)
    report(
        request,
        f"web page: first words after {first_ms / 1000:.2f} s, answer done in {total_ms / 1000:.2f} s",
    )
