"""The edge's own logic without a stack: limits, request checks, rerank ordering, error shapes.

The same checks run against the real stack in tests/test_edge.py; these pin the
rules themselves (a limit derived from the wrong batch, a role let through).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import Request
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingCompletionRequest,
    OpenAIHTTPException,
    ScoreRequest,
)
from ray.serve.exceptions import BackPressureError
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.testclient import TestClient

from rag.stack.ingress import (
    ROLES_ALLOWED,
    Capacity,
    RagIngress,
    RerankRequest,
    check_chat,
    check_completion,
    check_embeddings,
    check_score,
    limits_for,
    make_app,
)
from rag.stack.ingress.errors import refuse
from rag.stack.ingress.rerank import rerank_results

CPU_CHAT = limits_for({"max_num_seqs": 64})
CPU_SCORE = limits_for({"max_num_seqs": 32})


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="chat", **{"messages": [{"role": "user", "content": "hi"}], **fields})


def test_limits_follow_the_engine_batch() -> None:
    assert (CPU_CHAT.max_sequences, CPU_CHAT.max_inputs, CPU_CHAT.max_pairs) == (16, 256, 128)
    assert (CPU_SCORE.max_sequences, CPU_SCORE.max_pairs) == (8, 64)
    assert limits_for({"max_num_seqs": 2}).max_sequences == 1  # never zero


@pytest.mark.parametrize("role", ["wizard", "developer", "function", ""])
def test_roles_outside_the_four_are_refused_naming_the_allowed_ones(role: str) -> None:
    body = chat(messages=[{"role": "user", "content": "hi"}, {"role": role, "content": "abracadabra"}])
    refusal = check_chat(body, CPU_CHAT)
    assert refusal is not None and refusal.status == 400
    assert refusal.param == "messages[1].role"
    assert all(r in refusal.message for r in ROLES_ALLOWED)


def test_the_four_roles_and_tool_results_pass() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    ]
    assert check_chat(chat(messages=messages), CPU_CHAT) is None


def test_too_many_sequences_are_refused() -> None:
    assert check_chat(chat(n=16), CPU_CHAT) is None
    refusal = check_chat(chat(n=1000), CPU_CHAT)
    assert refusal is not None and refusal.param == "n" and "16" in refusal.message
    prompts = CompletionRequest(model="chat", prompt=["a"] * 10, n=2)
    refusal = check_completion(prompts, CPU_CHAT)
    assert refusal is not None and "20 sequences" in refusal.message
    assert check_completion(CompletionRequest(model="chat", prompt=[1, 2, 3], n=4), CPU_CHAT) is None


def test_embedding_and_score_batches_are_bounded() -> None:
    ok = EmbeddingCompletionRequest(model="embed", input=["x"] * 256)
    assert check_embeddings(ok, CPU_CHAT) is None
    refusal = check_embeddings(EmbeddingCompletionRequest(model="embed", input=["x"] * 20_000), CPU_CHAT)
    assert refusal is not None and refusal.param == "input" and "20000" in refusal.message
    assert check_embeddings(EmbeddingCompletionRequest(model="embed", input="one text"), CPU_CHAT) is None
    assert check_score(ScoreRequest(model="score", text_1="q", text_2=["d"] * 64), CPU_SCORE) is None
    refusal = check_score(ScoreRequest(model="score", text_1="q", text_2=["d"] * 65), CPU_SCORE)
    assert refusal is not None and "65 documents" in refusal.message


def test_rerank_results_are_best_first_with_top_n_and_documents() -> None:
    request = RerankRequest(query="q", documents=["a", {"text": "b"}, "c"], top_n=2)
    scores = [{"index": 0, "score": 0.1}, {"index": 1, "score": 0.9}, {"index": 2, "score": 0.5}]
    results = rerank_results(request, request.texts(), scores)
    assert [r["index"] for r in results] == [1, 2]
    assert results[0] == {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}}
    single = RerankRequest(query="q", documents=["a"], return_documents=False)
    bare = rerank_results(single, single.texts(), scores[:1])
    assert bare == [{"index": 0, "relevance_score": 0.1}]


# ----------------------------------------------------------------- the app's error shapes
@pytest.fixture(scope="module")
def client() -> TestClient:
    app = make_app()

    @app.post("/v1/chat/completions")
    async def chat_route(body: ChatCompletionRequest, request: Request) -> Any:
        refusal = check_chat(body, CPU_CHAT)
        if refusal is not None:
            return refuse(refusal)
        if body.model == "busy":  # what Serve's router raises when the engine's queue is full

            async def queue_full() -> Any:
                raise BackPressureError(
                    num_queued_requests=64, max_queued_requests=64, status_code=429, retry_after_s=4.2
                )

            return await RagIngress.call_engine(queue_full)
        if body.model == "long":
            raise OpenAIHTTPException(
                400, "This model's maximum context length is 4096 tokens", "BadRequestError"
            )
        return {"ok": True}

    return TestClient(app, raise_server_exceptions=False)


def error_of(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


# The boundary's malformed shapes (415, 400, 413, roles, unknown model and path) are
# asserted once, on the real stack (tests/test_edge.py); here only what a real engine
# cannot be made to raise on demand.
def test_an_engine_error_keeps_its_message_in_the_openai_shape(client: TestClient) -> None:
    long = {"model": "long", "messages": [{"role": "user", "content": "hi"}]}
    error = error_of(client.post("/v1/chat/completions", json=long), 400)
    assert error["message"].startswith("This model's maximum context length")


def test_backpressure_is_a_429_with_retry_after(client: TestClient) -> None:
    busy = {"model": "busy", "messages": [{"role": "user", "content": "hi"}]}
    r = client.post("/v1/chat/completions", json=busy)
    assert error_of(r, 429)["type"] == "rate_limit_error"
    assert r.headers["retry-after"] == "5"  # whole seconds, rounded up


def test_a_call_whose_replica_died_before_answering_goes_again_and_gives_up_with_a_503() -> None:
    """A node lost kills the replica a request was waiting on; nothing has reached the
    client yet, so the ingress calls again (Serve's router picks a live replica then).
    A dead replica cannot be produced on demand here: the calls are fakes."""
    from ray.exceptions import ActorDiedError

    from rag.stack.ingress.app import LOST_REPLICA_TRIES

    calls: list[int] = []

    async def dies_once() -> Response:
        calls.append(1)
        if len(calls) == 1:
            raise ActorDiedError()
        return JSONResponse({"ok": True})

    r = asyncio.run(RagIngress.call_engine(dies_once))
    assert r.status_code == 200 and len(calls) == 2

    calls.clear()

    async def always_dies() -> Response:
        calls.append(1)
        raise ActorDiedError()

    r = asyncio.run(RagIngress.call_engine(always_dies))
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert len(calls) == LOST_REPLICA_TRIES and b"replicas were lost" in bytes(r.body)


def test_the_rag_models_engine_calls_go_again_when_a_replica_died_before_answering() -> None:
    """The `rag` model's own calls (HandleEngines) ride out a lost replica as they ride
    out a full queue, and say which it was when they give up."""
    import dataclasses
    from types import SimpleNamespace

    from ray.exceptions import ActorDiedError

    from rag.settings import Settings
    from rag.stack.ingress.handles import EngineError, HandleEngines

    calls: list[str] = []

    def call(body: Any, method: str) -> Any:
        calls.append(method)

        async def responses() -> Any:
            if len(calls) == 1 or body.model == "lost":
                raise ActorDiedError()
            yield {"data": []}

        return responses()

    settings = dataclasses.replace(Settings.from_env(), retry_deadline_s=1.0)
    engines = HandleEngines(call, asyncio.new_event_loop(), settings, {})
    assert asyncio.run(engines._first(SimpleNamespace(model="embed"), "embeddings")) == {"data": []}
    assert calls == ["embeddings", "embeddings"]
    with pytest.raises(EngineError, match="replicas kept dying before answering") as info:
        asyncio.run(engines._first(SimpleNamespace(model="lost"), "embeddings"))
    assert info.value.status == 503


def test_admission_holds_a_batch_and_a_queue_per_engine_for_the_whole_stream() -> None:
    """Two chats held open (streaming) fill `chat`'s capacity of 2: the third is a 429
    with Retry-After before any route runs, `embed` is not affected, and once the
    streams end the places are free again."""
    app = make_app(capacity={"chat": Capacity(2, 4.2), "embed": Capacity(1, 1)})
    release = asyncio.Event()
    routed: list[str] = []

    @app.post("/v1/chat/completions")
    async def chat_route(request: Request) -> Any:
        routed.append("chat")

        async def tokens() -> Any:
            yield b"data: a\n\n"
            await release.wait()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(tokens(), media_type="text/event-stream")

    @app.post("/v1/embeddings")
    async def embed_route(request: Request) -> Any:
        return {"ok": True}

    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            held = [asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(2)]
            while len(routed) < 2:
                await asyncio.sleep(0.01)
            r = await asyncio.wait_for(client.post("/v1/chat/completions", json=body), 10)
            assert error_of(r, 429)["type"] == "rate_limit_error"
            assert r.headers["retry-after"] == "5" and "holds 2 requests" in r.json()["error"]["message"]
            assert len(routed) == 2  # refused before the route ran
            other = await client.post("/v1/embeddings", json={"model": "embed", "input": "x"})
            assert other.status_code == 200
            release.set()
            assert [(await t).status_code for t in held] == [200, 200]
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200

    asyncio.run(run())
