"""The serving edge on the real stack: rerank clients, tool calls, the strict boundary,
back-pressure, metrics, and the facts the client reads from the server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from typing import Any

import cohere
import httpx
import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from rag.client import StackClient
from rag.served import resolve
from rag.settings import Settings
from rag.stack.ingress import ROLES_ALLOWED
from tests.conftest import Stack

pytestmark = pytest.mark.stack

QUERY = "Which setting controls how much GPU memory an engine takes?"
PASSAGES = [
    "Bananas are a good source of potassium and are often eaten at breakfast.",
    "Each engine's gpu_memory_utilization sets the share of the card it claims at boot.",
    "The Eiffel Tower was completed in 1889.",
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def root(stack: Stack) -> str:
    return stack.base_url.removesuffix("/v1")


def settings_for(stack: Stack) -> Settings:
    return dataclasses.replace(Settings.from_env(), base_url=stack.base_url)


def openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    """The body of a refusal, checked to be in the OpenAI error shape."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == status and error["message"]
    return error


# ------------------------------------------------------------------------- rerank
def test_rerank_over_http_is_best_first_and_honours_top_n(http: httpx.Client) -> None:
    r = http.post("/rerank", json={"model": "score", "query": QUERY, "documents": PASSAGES, "top_n": 2})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2
    assert results[0]["index"] == 1 and results[0]["document"] == {"text": PASSAGES[1]}
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    bare = http.post(
        "/rerank", json={"model": "score", "query": QUERY, "documents": PASSAGES, "return_documents": False}
    ).json()["results"]
    assert len(bare) == 3 and all("document" not in x for x in bare)
    # The same scores /v1/score gives, only sorted: rerank adds no second model.
    scores = http.post("/score", json={"model": "score", "text_1": QUERY, "text_2": PASSAGES}).json()["data"]
    by_index = {d["index"]: d["score"] for d in scores}
    # bf16 batches of another shape round differently (seen on an AMX Xeon): same to 1e-2.
    assert all(x["relevance_score"] == pytest.approx(by_index[x["index"]], abs=1e-2) for x in bare)


def test_cohere_sdk_reranks_against_the_stack(root: str, stack: Stack) -> None:
    v2 = cohere.ClientV2(api_key=stack.api_key, base_url=root, timeout=300)
    ranked = v2.rerank(model="score", query=QUERY, documents=PASSAGES, top_n=2)
    assert [r.index for r in ranked.results][:1] == [1] and len(ranked.results) == 2
    v1 = cohere.Client(api_key=stack.api_key, base_url=root, timeout=300)
    ranked_v1 = v1.rerank(model="score", query=QUERY, documents=PASSAGES, return_documents=True)
    assert ranked_v1.results[0].index == 1
    assert ranked_v1.results[0].document is not None and "gpu_memory" in ranked_v1.results[0].document.text


def test_rerank_refuses_what_it_cannot_do(http: httpx.Client) -> None:
    assert (
        "documents"
        in openai_error(http.post("/rerank", json={"model": "score", "query": "q"}), 400)["message"]
    )
    fields = {"model": "score", "query": "q", "documents": [{"body": "a"}], "rank_fields": ["title"]}
    assert openai_error(http.post("/rerank", json=fields), 400)["param"] == "documents[0]"
    too_many = {"model": "score", "query": "q", "documents": ["d"] * 1000}
    assert openai_error(http.post("/rerank", json=too_many), 400)["param"] == "documents"
    for field, value in (("frobnicate", 1), ("return_embeddings", True)):  # no shape defines the first
        body = {"model": "score", "query": "q", "documents": ["a"], field: value}
        assert openai_error(http.post("/rerank", json=body), 400)["param"] == field


# Every field some rerank shape defines, with a value that makes it do something.
EVERY_FIELD = {
    "top_n": 2, "return_documents": True, "max_chunks_per_doc": 4,  # Cohere v1
    "max_tokens_per_doc": 256, "priority": 3,  # Cohere v2 (and vLLM)
    "return_embeddings": False,  # Jina
    "max_tokens_per_query": 64, "truncate_prompt_tokens": 512, "truncation_side": "right",  # vLLM
    "use_activation": True, "user": "tests", "request_id": "rerank-every-field", "cache_salt": "salt-1",
}  # fmt: skip


def test_rerank_takes_every_field_cohere_jina_and_vllm_define(http: httpx.Client) -> None:
    body = {"model": "score", "query": QUERY, "documents": PASSAGES, **EVERY_FIELD}
    r = http.post("/rerank", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "rerank-every-field" and [x["index"] for x in r.json()["results"]][:1] == [1]
    # Cohere v1's object documents, ranked on the fields it names, come back as sent.
    docs = [{"title": "Fruit", "body": PASSAGES[0]}, {"title": "Engines", "body": PASSAGES[1]}]
    fielded = {"model": "score", "query": QUERY, "documents": docs, "rank_fields": ["title", "body"]}
    top = http.post("/rerank", json=fielded).json()["results"][0]
    assert top["index"] == 1 and top["document"] == docs[1]


def test_max_tokens_per_doc_cuts_each_document_before_it_is_scored(http: httpx.Client) -> None:
    def rerank(**more: Any) -> dict[str, Any]:
        body = {"model": "score", "query": QUERY, "documents": PASSAGES[1:2], **more}
        r = http.post("/rerank", json=body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    whole, cut = rerank(), rerank(max_tokens_per_doc=3)
    assert cut["usage"]["prompt_tokens"] < whole["usage"]["prompt_tokens"]
    assert cut["results"][0]["relevance_score"] != whole["results"][0]["relevance_score"]
    assert cut["results"][0]["document"]["text"] == PASSAGES[1]  # the document returned is the one sent


def test_langchain_cohere_rerank_compresses_against_the_stack(root: str, stack: Stack) -> None:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    # compress_documents sends max_tokens_per_doc, which the ingress refused before.
    reranker = CohereRerank(cohere_api_key=stack.api_key, base_url=root, model="score", top_n=2)
    kept = reranker.compress_documents([Document(page_content=p) for p in PASSAGES], QUERY)
    assert [d.page_content for d in kept][:1] == [PASSAGES[1]] and len(kept) == 2
    assert kept[0].metadata["relevance_score"] >= kept[1].metadata["relevance_score"]


@pytest.mark.parametrize("provider", ["cohere", "jina_ai", "hosted_vllm"])
def test_litellm_rerank_through_each_provider_shape(
    root: str, stack: Stack, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list
    import litellm

    base = root if provider == "cohere" else f"{root}/v1"
    ranked = litellm.rerank(
        model=f"{provider}/score",
        query=QUERY,
        documents=PASSAGES,
        top_n=2,
        api_base=base,
        api_key=stack.api_key,
    )
    assert ranked.results is not None
    assert [r["index"] for r in ranked.results][:1] == [1] and len(ranked.results) == 2


# ------------------------------------------------------------------------- boundary
def test_a_fourth_role_is_refused_naming_the_allowed_ones(http: httpx.Client, oai: OpenAI) -> None:
    body = {"model": "chat", "messages": [{"role": "wizard", "content": "abracadabra"}]}
    error = openai_error(http.post("/chat/completions", json=body), 400)
    assert error["param"] == "messages[0].role" and all(role in error["message"] for role in ROLES_ALLOWED)
    with pytest.raises(BadRequestError, match="allowed roles"):  # what an OpenAI client user sees
        oai.chat.completions.create(model="chat", messages=[{"role": "wizard", "content": "hi"}])  # type: ignore[misc, list-item]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/chat/completions",
            {"model": "chat", "n": 1000, "messages": [{"role": "user", "content": "hi"}]},
            "n",
        ),
        ("/completions", {"model": "chat", "prompt": ["a"] * 100, "max_tokens": 1}, "prompt"),
        ("/embeddings", {"model": "embed", "input": ["x"] * 20_000}, "input"),
        ("/score", {"model": "score", "text_1": "q", "text_2": ["d"] * 1000}, "text_2"),
    ],
    ids=["n=1000", "100-prompts", "20000-inputs", "1000-pairs"],
)
def test_a_request_that_would_hold_an_engine_for_minutes_is_refused_at_once(
    http: httpx.Client, path: str, body: dict[str, Any], param: str
) -> None:
    error = openai_error(http.post(path, json=body), 400)
    assert error["param"] == param and "at most" in error["message"]


@pytest.mark.parametrize(
    ("path", "content", "ctype", "status"),
    [
        ("/chat/completions", b'{"model": "chat", "messages": []}', "text/plain", 415),
        ("/chat/completions", b"model=chat", "application/x-www-form-urlencoded", 415),
        ("/chat/completions", b"{not json", "application/json", 400),
        ("/chat/completions", b'{"model": "chat", "messages": "not a list"}', "application/json", 400),
        ("/chat/completions", b'{"model": "chat", "messages": [{"content": "x"}]}', "application/json", 400),
        ("/embeddings", b'{"model": "embed"}', "application/json", 400),
        ("/chat/completions", b'{"model": "chat"}' + b" " * (5 << 20), "application/json", 413),
    ],
    ids=[
        "text-plain", "form", "not-json", "messages-not-a-list", "message-without-role",
        "embeddings-without-input", "6-MiB",
    ],
)  # fmt: skip
def test_malformed_requests_get_a_4xx_in_the_openai_shape(
    http: httpx.Client, oai: OpenAI, path: str, content: bytes, ctype: str, status: int
) -> None:
    """The boundary's table: each malformed shape once, on the real stack, which keeps serving."""
    error = openai_error(http.post(path, content=content, headers={"content-type": ctype}), status)
    assert error["message"].strip()
    assert oai.models.list().data  # still serving


HI = [{"role": "user", "content": "hi"}]
SELF_TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"$ref": "#"}}}},
}


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def shaped(schema: dict[str, Any]) -> dict[str, Any]:
    return {"model": "chat", "messages": HI, "response_format": json_schema(schema)}


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


def _optional(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", b'{"model": "chat", "messages": [{"role": "user", "content": "a \\ud800 b"}]}',
         "messages[0].content"),
        ("/embeddings", b'{"model": "embed", "input": ["ok", "x \\udc00"]}', "input[1]"),
        ("/rerank", b'{"model": "score", "query": "q \\ud83d", "documents": ["a"]}', "query"),
        ("/score", b'{"model": "score", "text_1": "q", "text_2": ["a", "b \\udfff"]}', "text_2[1]"),
    ],
    ids=["chat", "embeddings", "rerank", "score"],
)  # fmt: skip
def test_an_unpaired_surrogate_is_a_400_naming_the_field_on_every_route(
    http: httpx.Client, path: str, body: bytes, param: str
) -> None:
    """Valid JSON that is not text: each engine's tokenizer failed on it with a 500."""
    error = openai_error(http.post(path, content=body, headers={"content-type": "application/json"}), 400)
    assert error["param"] == param and "surrogate" in error["message"]


def test_a_structured_output_within_the_limits_still_works(http: httpx.Client) -> None:
    limits = next(m for m in http.get("/models").json()["data"] if m["id"] == "chat")["metadata"]["rag"][
        "limits"
    ]
    assert limits["schema_max_enum_values"] > 0 and limits["schema_max_depth"] > 0  # published for clients
    colours = ["red", "green", "blue"]
    body = {"model": "chat", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 16,
            "response_format": json_schema({"enum": colours})}  # fmt: skip
    r = http.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) in colours


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embeddings", {"model": "embed", "input": []}),
        ("/score", {"model": "score", "text_1": "q", "text_2": []}),
        ("/score", {"model": "score", "text_1": ["a", "b"], "text_2": ["x", "y", "z"]}),
        ("/chat/completions", {"model": "chat", "messages": []}),
        ("/chat/completions", {"model": "chat", "messages": HI, "max_tokens": -1}),
        ("/chat/completions", {"model": "chat", "messages": HI, "max_tokens": 1_000_000}),
        ("/chat/completions", {"model": "chat", "messages": HI, "temperature": "hot"}),
        ("/chat/completions", {"model": "chat", "messages": HI, "tools": [{"type": "function"}]}),
        ("/chat/completions", {"model": "chat", "messages": HI, "tool_choice": "required"}),
        ("/chat/completions", {"model": "embed", "messages": HI}),
        ("/embeddings", {"model": "chat", "input": ["hi"]}),
        ("/rerank", {"model": "chat", "query": "q", "documents": ["d"]}),
        ("/completions", {"model": "chat", "prompt": "", "max_tokens": 2}),
        ("/embeddings", {"model": "embed", "input": ["word " * 5000]}),
        # structured output: a schema that nests too deep for Ray to pickle, one with more
        # optional properties than llguidance keeps, a tool that refers to the joined schema
        ("/chat/completions", shaped(_nested(100))),
        ("/chat/completions", shaped(_optional(800))),
        ("/chat/completions", {"model": "chat", "messages": HI,
         "tools": [SELF_TOOL], "tool_choice": "required"}),
        ("/chat/completions", shaped({"$ref": "#"})),
        ("/chat/completions", {"model": "chat", "messages": HI,
         "structured_outputs": {"regex": "(a|b){1,5000}"}}),
        ("/completions", {"model": "chat", "prompt": "x", "structured_outputs": {"choice": ["a"] * 3000}}),
    ],
    ids=[
        "no-inputs", "no-documents", "pairs-3-to-2", "no-messages", "max_tokens-negative",
        "max_tokens-over-window", "temperature-text", "tool-without-function", "tool_choice-without-tools",
        "chat-on-embed", "embeddings-on-chat", "rerank-on-chat", "empty-prompt", "input-over-window",
        "schema-depth-100", "schema-800-optional", "tool-root-ref", "schema-only-self", "regex-repeat",
        "choice-3000",
    ],
)  # fmt: skip
def test_what_an_engine_would_choke_on_is_a_400_not_a_5xx(
    http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    openai_error(http.post(path, json=body), 400)


def test_unknown_model_is_a_404_in_the_openai_shape(http: httpx.Client, oai: OpenAI) -> None:
    body = {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}
    assert "gpt-9" in openai_error(http.post("/chat/completions", json=body), 404)["message"]
    with pytest.raises(NotFoundError) as info:  # what an OpenAI client user sees
        oai.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert "gpt-9" in info.value.message


def test_every_listed_route_works(http: httpx.Client, root: str, stack: Stack) -> None:
    paths = set(httpx.get(f"{root}/openapi.json", timeout=30, headers=stack.auth).json()["paths"])
    assert paths == {
        "/v1/models", "/v1/models/{model}", "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
        "/v1/score", "/v1/rerank", "/v2/rerank", "/tokenize", "/detokenize", "/health", "/metrics",
    }  # fmt: skip
    tokens = httpx.post(
        f"{root}/tokenize", json={"model": "chat", "prompt": "Hello world"}, timeout=60, headers=stack.auth
    )
    assert tokens.status_code == 200, tokens.text
    ids = tokens.json()["tokens"]
    assert tokens.json()["count"] == len(ids) >= 2
    text = httpx.post(
        f"{root}/detokenize", json={"model": "chat", "tokens": ids}, timeout=60, headers=stack.auth
    )
    assert text.status_code == 200 and text.json()["prompt"] == "Hello world", text.text
    assert http.get("/models/chat").json()["id"] == "chat"
    done = http.post(
        "/completions", json={"model": "chat", "prompt": "The capital of France is", "max_tokens": 3}
    )
    assert done.status_code == 200 and done.json()["choices"][0]["text"]
    # The rest (chat, embeddings, score, rerank) are exercised above and in test_stack.py.
    transcribe = httpx.post(f"{root}/v1/audio/transcriptions", timeout=30, headers=stack.auth)
    assert transcribe.status_code == 404  # not listed


# ------------------------------------------------------------------------- tool calls
def test_a_prompt_that_needs_a_tool_gets_a_parsed_tool_call(oai: OpenAI) -> None:
    reply = oai.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "What is the weather in Paris right now?"}],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=64,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert reply.choices[0].finish_reason == "tool_calls", reply
    assert len(calls) == 1 and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments)["city"].lower() == "paris"  # type: ignore[union-attr]


def test_a_prompt_that_needs_no_tool_gets_plain_text(oai: OpenAI) -> None:
    reply = oai.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "Explain in one sentence what a CPU is."}],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=48,
        temperature=0,
    )
    message = reply.choices[0].message
    assert not message.tool_calls and message.content and "cpu" in message.content.lower()


# ------------------------------------------------------------------------- back-pressure
def test_a_full_queue_answers_429_with_retry_after_and_the_client_waits_it_out(
    stack: Stack, http: httpx.Client
) -> None:
    """Three batches' worth of chats at once: a batch running and a batch queued are
    served, the rest refused with 429 + Retry-After, nothing fails, and the rag client,
    arriving while the queue is full, waits and gets its answer."""
    limits = next(m for m in http.get("/models").json()["data"] if m["id"] == "chat")["metadata"]["rag"][
        "limits"
    ]
    n = 3 * limits["batch"]
    refused_seen = threading.Event()

    async def burst() -> list[tuple[int, dict[str, str], str]]:
        pool = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
        async with httpx.AsyncClient(
            base_url=stack.base_url, timeout=600, limits=pool, headers=stack.auth
        ) as client:

            async def one(i: int) -> tuple[int, dict[str, str], str]:
                body = {  # ignore_eos: every admitted chat holds its place for 32 tokens
                    "model": "chat",
                    "messages": [{"role": "user", "content": f"Count to ten, request {i}."}],
                    "max_tokens": 32,
                    "ignore_eos": True,
                }
                r = await client.post("/chat/completions", json=body)
                if r.status_code == 429:
                    refused_seen.set()
                return r.status_code, dict(r.headers), r.text

            return await asyncio.gather(*(one(i) for i in range(n)))

    box: list[list[tuple[int, dict[str, str], str]]] = []
    flood = threading.Thread(target=lambda: box.append(asyncio.run(burst())))
    flood.start()
    waits: list[str] = []
    try:
        assert refused_seen.wait(300), "no request was refused: is the queue bounded?"
        with StackClient(settings_for(stack), on_wait=waits.append) as client:
            answer = client.chat([{"role": "user", "content": "Say ok."}], max_tokens=4)
    finally:
        flood.join(600)
    assert not flood.is_alive() and box, "the burst hung"
    results = box[0]
    codes = [code for code, _, _ in results]
    assert set(codes) <= {200, 429}, sorted(set(codes))
    assert codes.count(200) >= 2 * limits["batch"]  # a batch running and a batch queued
    refusals = [(headers, text) for code, headers, text in results if code == 429]
    assert refusals
    for headers, text in refusals:
        assert int(headers["retry-after"]) > 0
        assert json.loads(text)["error"]["type"] == "rate_limit_error"
    assert answer.strip()
    assert waits and all("429" in w for w in waits), waits
    if stack.metrics_url is not None:  # refused in Ray's proxy, so counted by the front door itself
        assert _metric_seen(stack.metrics_url, "ray_rag_front_door_refusals_total{", 'code="429"'), (
            "no ray_rag_front_door_refusals_total on the metrics port after a burst of 429s"
        )


def _metric_seen(url: str, prefix: str, label: str, within_s: float = 60) -> bool:
    deadline = time.monotonic() + within_s  # Ray's agents report every few seconds
    while time.monotonic() < deadline:
        lines = httpx.get(url, timeout=30).text.splitlines()
        if any(line.startswith(prefix) and label in line for line in lines):
            return True
        time.sleep(2)
    return False


# ------------------------------------------------------------------------- metrics
WATCHED = (
    "ray_vllm_num_requests_running",
    "ray_vllm_num_requests_waiting",
    "ray_vllm_kv_cache_usage_perc",
    "ray_vllm_time_to_first_token_seconds_bucket",
    "ray_serve_num_http_requests_total",
    "ray_serve_http_request_latency_ms_bucket",
)


def test_metrics_port_serves_engine_and_serve_metrics_during_a_request(stack: Stack, oai: OpenAI) -> None:
    if stack.metrics_url is None:
        pytest.skip("set RAG_TEST_METRICS_URL to scrape a stack this session did not start")
    answer = threading.Thread(
        target=lambda: oai.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Count to twenty."}], max_tokens=64
        )
    )
    answer.start()
    found: set[str] = set()
    deadline = time.monotonic() + 90  # Ray's agents report every few seconds
    while time.monotonic() < deadline and len(found) < len(WATCHED):
        text = httpx.get(stack.metrics_url, timeout=30).text
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name in WATCHED and ('model_name="chat"' in line or name.startswith("ray_serve")):
                found.add(name)
        time.sleep(2)
    answer.join(300)
    assert found == set(WATCHED), f"missing: {set(WATCHED) - found}"


# ------------------------------------------------------------------------- facts
def test_the_server_says_which_guard_and_reranker_it_has(stack: Stack) -> None:
    with StackClient(settings_for(stack)) as client:
        facts = client.facts()
        settled = resolve(settings_for(stack), client)
    assert facts["guard"]["guard_format"] == "score"  # the CPU profile's classifier on /v1/score
    # ... and the thresholds its trained head was calibrated for, which the client blocks at
    thresholds = facts["guard"]["guard_thresholds"]
    assert set(thresholds) == {"input", "output"} and all(0 < t < 1 for t in thresholds.values())
    # ... and the rule they follow, the severe categories' included (README "The guard")
    assert "child-sexual or hate" in facts["guard"]["guard_rule"]
    # ... what its reranker is (the MiniLM cross-encoder trained here), the floor it was
    # calibrated for and how much of each passage it reads; the client resolves them to
    # not calling it for answers (it ranks worse than fused retrieval: rag/served.py)
    assert facts["score"]["reranker"] == "small-cross-encoder" and 0 < facts["score"]["floor"] < 1
    assert facts["score"]["max_tokens_per_doc"] == 160 and "MiniLM" in facts["score"]["model"]
    assert settled.rerank_mode == "off" and settled.floor == facts["score"]["floor"]
    assert facts["chat"]["limits"]["batch"] > 0
