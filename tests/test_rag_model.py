"""The `rag` model's request checks, its response shape and the live index, without a stack.

The model itself, answering over the real engines, is tested in tests/test_rag_model_e2e.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

from rag.answer import Source
from rag.attribute import Sentence
from rag.chunk import Chunk, Chunker
from rag.errors import ConfigError
from rag.guard import Verdict
from rag.pipeline import Answer
from rag.stack.ingress.completion import Transcript, completion, usage_chunk
from rag.stack.ingress.limits import Refusal
from rag.stack.ingress.rag_model import NEEDED, Conversation, RagLimits, Readiness, read_conversation
from rag.store import LiveIndex, write_index

LIMITS = RagLimits()
Q = {"role": "user", "content": "How do I keep the logs?"}


def _request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="rag", **{"messages": [Q], **fields})


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools", "no tools"),
        ({"response_format": {"type": "json_object"}}, "response_format", "structured"),
        ({"logprobs": True}, "logprobs", "log probabilities"),
        ({"n": 2}, "n", "one answer"),
        ({"messages": []}, "messages", "ending with the user's question"),
        ({"messages": [Q] * 65}, "messages", "at most 64"),
        ({"messages": [Q, {"role": "assistant", "content": "ok"}]}, "messages[1]", "last message"),
        (
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}, Q]},
            "messages[0].role", "system, user and assistant",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0]", "text only",
        ),
        ({"messages": [{"role": "user", "content": "x" * 4001}]}, "messages[0].content", "at most 4000"),
        ({"messages": [{"role": "assistant", "content": "x" * 32_000}, Q]}, "messages", "characters"),
        ({"messages": [{"role": "system", "content": "x" * 4001}, Q]}, "messages", "the guard reads them"),
    ],
)  # fmt: skip
def test_a_request_the_rag_model_cannot_answer_is_refused_naming_the_field(
    fields: dict[str, Any], param: str, needle: str
) -> None:
    refusal = read_conversation(_request(**fields), LIMITS)
    assert isinstance(refusal, Refusal), refusal
    assert refusal.param == param and needle in refusal.message and refusal.status == 400


def test_the_conversation_is_the_request_the_last_question_asked_the_recent_turns_kept() -> None:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(10)]
    body = _request(
        messages=[{"role": "system", "content": "You are a pirate."}, *turns, Q],
        temperature=0.7, top_p=0.9, max_tokens=4096, stream=True,
    )  # fmt: skip
    c = read_conversation(body, LIMITS)
    assert isinstance(c, Conversation)
    assert c.question == Q["content"]
    # the system message becomes extra instructions (after the pipeline's); the last turns are kept
    assert c.instructions == "You are a pirate." and "pirate" not in str(c.history)
    assert c.history == turns[-LIMITS.history_messages :]
    assert c.max_tokens == LIMITS.max_tokens  # lowered to the answer's budget
    parts = _request(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}
        ]
    )
    assert read_conversation(parts, LIMITS).question == "a b"  # type: ignore[union-attr]


def _answer() -> Answer:
    sources = [
        Source(1, "git-commit.html", "OPTIONS", "--amend  Replace the tip.", 0.9),
        Source(2, "b.md", "", "x", 0.5),
    ]
    a = Answer("How do I fix the last commit?", sources=sources, cited=[sources[0]])
    a.sentences = [
        Sentence("Use --amend to replace the tip of the branch.", " ", (1,), (1,), {1: 0.9}, "supported"),
        Sentence("It is quick.", "", (), (), {}, "unsupported"),
    ]
    a.verdicts = [Verdict("input", True, "safe", 0.01), Verdict("output", True, "safe", 0.02)]
    return a


def test_each_sentence_span_and_citation_points_into_the_content_it_was_streamed_in() -> None:
    a, t = _answer(), Transcript()
    d1, s1 = t.add_sentences(a.sentences[:1])
    d2, s2 = t.add_sentences(a.sentences[1:])
    assert (
        t.content == d1 + d2 == "Use --amend to replace the tip of the branch [1]. It is quick [no source]."
    )
    for x in s1 + s2:
        assert t.content[x["start"] : x["end"]].startswith(x["text"].rstrip("."))
        assert t.content[x["start"] : x["end"]].endswith(".")
    (citation,) = t.annotations(a.sources)  # the unsupported sentence cites nothing
    span = citation["url_citation"]
    assert citation["type"] == "url_citation" and span["url"] == "git-commit.html"
    assert span["title"] == "git-commit.html — OPTIONS"
    assert (
        t.content[span["start_index"] : span["end_index"]]
        == "Use --amend to replace the tip of the branch [1]."
    )


def test_early_words_stream_first_and_the_spans_still_point_into_the_content() -> None:
    a, whole = _answer(), Transcript()
    whole.add_sentences(a.sentences)
    t = Transcript()
    deltas = [t.add_early("Use --amend to replace "), t.add_sentences(a.sentences[:1])[0]]
    deltas.append(t.add_sentences(a.sentences[1:])[0])
    assert deltas[0] == "Use --amend to replace " and deltas[1] == "the tip of the branch [1]. "
    assert t.content == "".join(deltas) == whole.content  # the same content as without them
    assert t.sentences == whole.sentences and t.annotations(a.sources) == whole.annotations(a.sources)
    assert t.add_early("late words") == ""  # only an answer's start goes early
    odd = Transcript()  # were they not its start, the sentence would follow whole, spans right
    odd.add_early("Something else ")
    delta, added = odd.add_sentences(a.sentences[:1])
    assert delta == "Use --amend to replace the tip of the branch [1]. " and added[0]["start"] == 15
    assert odd.content[added[0]["start"] : added[0]["end"]] == delta.rstrip()


def test_the_completion_is_an_openai_chat_completion_with_the_sources_beside_it() -> None:
    a, t = _answer(), Transcript()
    t.add_sentences(a.sentences)
    t.add_text(a.tail())
    a.usage.add({"prompt_tokens": 900, "completion_tokens": 40})
    body = completion(a, t, request_id="chatcmpl-rag-1", created=1, generation="g1")
    (choice,) = body["choices"]
    assert body["usage"] == {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940}
    last = usage_chunk("chatcmpl-rag-1", 1, a)  # a stream's last chunk, with include_usage
    assert last["choices"] == [] and last["usage"] == body["usage"]
    assert body["object"] == "chat.completion" and body["model"] == "rag"
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].endswith("Sources:\n[1] git-commit.html — OPTIONS")
    rag = body["rag"]
    assert [s["n"] for s in rag["sources"]] == [1, 2] and rag["sources"][0]["snippet"].startswith("--amend")
    assert rag["cited"] == [1] and rag["blocked"] is None and rag["index_generation"] == "g1"
    assert [x["support"] for x in rag["sentences"]] == ["supported", "unsupported"]
    a.blocked = "output"
    assert (
        completion(a, Transcript(), request_id="x", created=1, generation=None)["choices"][0]["finish_reason"]
        == "content_filter"
    )


def _write(folder: Path, texts: list[str]) -> None:
    chunks = [Chunk(f"c{i}", f"doc{i}.md", "t", "", text) for i, text in enumerate(texts)]
    vectors = np.eye(len(texts), 4, dtype=np.float32)
    probe = np.array([1, 0, 0, 0], dtype=np.float32)
    write_index(folder, chunks, vectors, "embed", probe, {}, str(folder), Chunker())


def test_the_live_index_names_rag_index_until_one_exists_then_follows_each_new_generation(
    tmp_path: Path,
) -> None:
    live = LiveIndex(tmp_path / "index")
    with pytest.raises(ConfigError, match="rag index PATH"):
        live.current()
    _write(tmp_path / "index", ["alpha", "beta"])
    first = live.current()
    assert live.current() is first  # unchanged: not reloaded
    _write(tmp_path / "index", ["gamma", "delta", "epsilon"])
    second = live.current()
    assert second is not first and len(second.chunks) == 3 and second.chunks[0].text == "gamma"
    # a request that took the first generation reads it whole, though its files are gone
    assert [c.text for c in first.chunks] == ["alpha", "beta"] and first.vectors.shape == (2, 4)


def test_until_the_engines_an_answer_needs_serve_the_rag_model_is_told_at_once() -> None:
    import asyncio

    states = {"RagIngress": "HEALTHY", "chat": "UPDATING", "guard": "HEALTHY", "embed": "HEALTHY"}
    asked: list[int] = []

    def read() -> dict[str, str]:
        asked.append(1)
        return dict(states)

    async def run() -> list[list[str]]:
        ready = Readiness(read, ttl_s=0.2)
        seen = [await ready.waiting_for(), await ready.waiting_for()]  # the second from the cache
        states["chat"] = "HEALTHY"
        await asyncio.sleep(0.25)
        seen.append(await ready.waiting_for())
        states["score"] = "UNHEALTHY"  # the reranker is not needed by every answer
        await asyncio.sleep(0.25)
        return [*seen, await ready.waiting_for()]

    assert asyncio.run(run()) == [["chat"], ["chat"], [], []]
    assert len(asked) == 3 and NEEDED == ("chat", "guard", "embed")

    def down() -> dict[str, str]:
        raise ConnectionError("controller unreachable")

    # A status that cannot be read holds no answer back: the answer's own calls will tell.
    assert asyncio.run(Readiness(down).waiting_for()) == []
