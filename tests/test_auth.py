"""API keys without a stack: where they come from, what is refused, and the gate itself
(a real ASGI app in front of a route that records whether it was reached)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from rag.errors import ConfigError
from rag.stack.auth import KeyGate, digest, file_warning, is_loopback, keys_from_env, load_keys
from rag.stack.ingress import openai_error

KEY = "k-0123456789abcdef0123"
OTHER = "k-fedcba9876543210fedc"


def test_keys_come_from_values_lists_and_files(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text(f"# ours\n\n  {OTHER}  \n{KEY}\n")
    assert load_keys([f"{KEY}, {OTHER}"], []) == (KEY, OTHER)
    assert load_keys([], [file]) == (OTHER, KEY)  # comments and blank lines skipped, no duplicates
    assert keys_from_env({"RAG_API_KEY": KEY, "RAG_API_KEY_FILE": str(file)}) == (KEY, OTHER)
    assert keys_from_env({}) == ()


@pytest.mark.parametrize(
    ("values", "file_text", "needle"),
    [
        (["short"], None, "too short"),
        ([f"{KEY} with space"], None, "spaces"),
        ([], "# only a comment\n", "holds no key"),
    ],
)
def test_a_bad_key_or_key_file_says_what_to_do(
    tmp_path: Path, values: list[str], file_text: str | None, needle: str
) -> None:
    files = []
    if file_text is not None:
        files = [tmp_path / "keys"]
        files[0].write_text(file_text)
    with pytest.raises(ConfigError, match=needle):
        load_keys(values, files)


def test_a_missing_key_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_keys([], [tmp_path / "nope"])


def test_a_key_file_others_can_read_is_warned_about(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text(KEY)
    file.chmod(0o644)
    assert "chmod 600" in (file_warning(file) or "")
    file.chmod(0o600)
    assert file_warning(file) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("192.168.1.5", False), ("::", False), ("example.org", False)],
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.fixture
def gated() -> tuple[TestClient, list[str]]:
    reached: list[str] = []

    async def route(request: Request) -> Response:
        reached.append(request.url.path)
        return JSONResponse({"ok": True})

    app = Starlette(
        routes=[
            Route("/v1/models", route),
            Route("/health", route),
            Route("/", route),
            Route("/v1/chat", route, methods=["POST"]),
        ]
    )
    gate = KeyGate(app, [digest(KEY), digest(OTHER)], lambda status, message: openai_error(status, message))
    return TestClient(gate), reached


@pytest.mark.parametrize(
    ("header", "needle"),
    [(None, "no API key"), ("Basic abc", "Bearer KEY"), ("Bearer ", "Bearer KEY"),
     ("Bearer k-wrong-wrong-wrong-wrong", "not one this server accepts"), (f"Bearer {KEY}x", "not one")],
)  # fmt: skip
def test_a_missing_or_wrong_key_is_a_401_that_never_reaches_the_route(
    gated: tuple[TestClient, list[str]], header: str | None, needle: str
) -> None:
    client, reached = gated
    headers = {"Authorization": header} if header is not None else {}
    for r in (
        client.get("/v1/models", headers=headers),
        client.post("/v1/chat", headers=headers, content=b"x"),
    ):
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        error = r.json()["error"]
        assert needle in error["message"] and error["type"] == "authentication_error" and error["code"] == 401
    assert reached == []


def test_every_accepted_key_gets_in_and_health_needs_none(gated: tuple[TestClient, list[str]]) -> None:
    client, reached = gated
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert client.get("/v1/models", headers={"authorization": f"bearer {OTHER}"}).status_code == 200
    assert client.get("/health").status_code == 200
    assert reached == ["/v1/models", "/v1/models", "/health"]


def test_the_page_asks_a_browser_for_the_key_and_basic_credentials_carry_it(
    gated: tuple[TestClient, list[str]],
) -> None:
    """A browser opening the page gets a Basic challenge (it prompts once, then sends the
    key with every request the page makes); the key is the password, any user name."""
    client, reached = gated
    refused = client.get("/")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith('Basic realm="rag"')
    assert client.get("/v1/models").headers["www-authenticate"] == "Bearer"  # API clients: no prompt
    basic = base64.b64encode(f"anyone:{KEY}".encode()).decode()
    assert client.get("/", headers={"Authorization": f"Basic {basic}"}).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": f"Basic {basic}"}).status_code == 200
    wrong = base64.b64encode(f"anyone:{KEY}x".encode()).decode()
    assert client.get("/", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
    assert reached == ["/", "/v1/models"]


def test_no_keys_means_an_open_gate() -> None:
    async def route(request: Request) -> Response:
        return JSONResponse({"ok": True})

    open_gate = KeyGate(Starlette(routes=[Route("/v1/models", route)]), [], lambda s, m: openai_error(s, m))
    assert TestClient(open_gate).get("/v1/models").status_code == 200
