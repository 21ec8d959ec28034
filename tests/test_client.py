"""The client's error paths: failures a real server cannot be made to produce on demand.

A scripted `httpx.MockTransport` plays the server; sleeping is recorded, not done.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Callable, Iterator

import httpx
import pytest

from rag.client import StackClient
from rag.errors import EngineTimeout, HTTPStatusError, ServerUnreachable
from rag.settings import Settings

Handler = Callable[[httpx.Request], httpx.Response]
EMBED_OK = {"data": [{"index": 0, "embedding": [3.0, 4.0]}]}


class Script:
    """Answers requests in order from a list of responses (or exceptions to raise)."""

    def __init__(self, *steps: httpx.Response | Exception) -> None:
        self.steps = list(steps)
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def _client(
    handler: Handler | None = None, base_url: str = "http://stack.test/v1", deadline_s: float = 600.0
) -> tuple[StackClient, list[float], list[str]]:
    s = dataclasses.replace(Settings.from_env(), base_url=base_url, retry_deadline_s=deadline_s, timeout_s=30)
    slept: list[float] = []
    said: list[str] = []
    transport = httpx.MockTransport(handler) if handler else None
    client = StackClient(
        s, transport=transport, on_wait=said.append, sleep=slept.append, clock=lambda: sum(slept)
    )
    return client, slept, said


def _error(status: int, message: str, **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message}}, headers=headers)


def test_a_dead_engine_is_waited_for_with_backoff_and_the_wait_is_explained() -> None:
    script = Script(
        _error(500, "EngineDeadError"), _error(503, "replica starting"), httpx.Response(200, json=EMBED_OK)
    )
    client, slept, said = _client(script)
    vec = client.embed(["x"])
    assert vec.shape == (1, 2) and abs(float(vec[0, 0]) - 0.6) < 1e-6
    assert slept == [1.0, 2.0]
    assert len(said) == 2 and "waiting for `embed`: answered 500" in said[0]
    assert "RAG_RETRY_DEADLINE_S" in said[0]


def test_retry_after_is_honoured() -> None:
    script = Script(_error(429, "busy", **{"Retry-After": "7"}), httpx.Response(200, json=EMBED_OK))
    client, slept, _ = _client(script)
    client.embed(["x"])
    assert slept == [7.0]


def test_past_the_deadline_the_last_error_says_how_long_it_was_retried() -> None:
    client, slept, _ = _client(lambda r: _error(503, "engine overloaded"), deadline_s=20)
    with pytest.raises(HTTPStatusError) as info:
        client.score("q", ["d"])
    e = info.value
    assert (e.status, e.url) == (503, "http://stack.test/v1/score")
    assert "engine overloaded" in e.server_message and "RAG_RETRY_DEADLINE_S=20" in str(e)
    assert sum(slept) <= 20 and len(slept) >= 3


@pytest.mark.parametrize("status", [400, 404, 408, 422])
def test_a_client_error_is_not_repeated(status: int) -> None:
    script = Script(_error(status, "bad request"))
    client, slept, _ = _client(script)
    with pytest.raises(HTTPStatusError, match=f"answered {status}: bad request"):
        client.score("q", ["d"])
    assert slept == [] and len(script.seen) == 1


def test_a_read_timeout_names_the_slow_engine_and_the_setting_not_rag_serve() -> None:
    script = Script(httpx.ReadTimeout("timed out"))
    client, slept, _ = _client(script)
    with pytest.raises(EngineTimeout) as info:
        client.score("q", ["d"], model="guard")
    text = str(info.value)
    assert "`guard`" in text and "30 s" in text and "RAG_TIMEOUT_S" in text and "rag serve" not in text
    assert slept == []  # a busy engine is not sent the same work twice


def test_a_refused_connection_after_the_server_answered_is_retried() -> None:
    script = Script(
        httpx.Response(200, json=EMBED_OK), httpx.ConnectError("refused"), httpx.Response(200, json=EMBED_OK)
    )
    client, slept, said = _client(script)
    client.embed(["a"])
    client.embed(["b"])
    assert slept == [1.0] and "connection failed (ConnectError)" in said[0]


def test_nothing_listening_at_first_contact_fails_at_once_naming_rag_serve() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: a real refused connection
        client, slept, _ = _client(base_url=f"http://127.0.0.1:{port}/v1")
        with pytest.raises(ServerUnreachable, match="rag serve"):
            client.embed(["x"])
    assert slept == []


def _sse(*events: dict[str, object]) -> httpx.Response:
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


def _piece(text: str) -> dict[str, object]:
    return {"choices": [{"delta": {"content": text}}]}


def _collect(stream: Iterator[str]) -> list[str]:
    out: list[str] = []
    for p in stream:
        out.append(p)
    return out


def test_chat_is_retried_when_it_fails_before_its_first_token() -> None:
    script = Script(
        _error(500, "EngineDeadError"), _sse({"error": "engine died"}), _sse(_piece("Hi"), _piece("!"))
    )
    client, slept, _ = _client(script)
    assert _collect(client.chat_stream([{"role": "user", "content": "q"}])) == ["Hi", "!"]
    assert slept == [1.0, 2.0]
    assert all(json.loads(r.content)["model"] == "chat" for r in script.seen)  # every request names its model


def test_a_stream_that_breaks_after_text_was_shown_is_an_error_not_a_retry() -> None:
    script = Script(_sse(_piece("Half"), {"error": "engine died"}), _sse(_piece("never")))
    client, slept, _ = _client(script)
    pieces: list[str] = []
    with pytest.raises(HTTPStatusError, match="engine died"):
        for p in client.chat_stream([{"role": "user", "content": "q"}]):
            pieces.append(p)
    assert pieces == ["Half"] and slept == [] and len(script.seen) == 1
