"""The real four-engine CPU stack, through the clients a user has: OpenAI client and plain HTTP."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import BadRequestError, OpenAI

from rag.stack.profiles import ROLES
from tests.conftest import Stack

pytestmark = pytest.mark.stack


def _still_serving(oai: OpenAI) -> None:
    reply = oai.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Say yes."}], max_tokens=3
    )
    assert reply.choices[0].message.content


def test_models_lists_the_four_roles_and_the_rag_model(oai: OpenAI) -> None:
    assert sorted(m.id for m in oai.models.list()) == sorted([*ROLES, "rag"])


def test_chat_plain_answers_from_real_weights(oai: OpenAI) -> None:
    reply = oai.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        max_tokens=8,
        temperature=0,
    )
    text = reply.choices[0].message.content or ""
    assert "paris" in text.lower()
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_chat_streamed_arrives_in_pieces(oai: OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "Count from one to five in words."}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 3
    assert "three" in "".join(pieces).lower()


def test_embeddings_are_384_dim_normalized_and_semantic(oai: OpenAI) -> None:
    texts = [
        "How do I split GPU memory between the engines?",
        "What share of the graphics card's memory does each model get?",
        "My cat likes to sleep in the sun.",
    ]
    data = oai.embeddings.create(model="embed", input=texts).data
    vecs = np.array([d.embedding for d in data], dtype=np.float32)
    assert vecs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-3)
    paraphrase, unrelated = float(vecs[0] @ vecs[1]), float(vecs[0] @ vecs[2])
    assert paraphrase > unrelated + 0.2


def test_score_over_http_ranks_the_relevant_passage_first(http: httpx.Client) -> None:
    passages = [
        "Bananas are a good source of potassium and are often eaten at breakfast.",
        "Each engine's gpu_memory_utilization sets the share of the card it claims at boot.",
        "The Eiffel Tower was completed in 1889.",
    ]
    r = http.post(
        "/score",
        json={"model": "score", "text_1": "Which setting controls how much GPU memory an engine takes?",
              "text_2": passages},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    scores = {d["index"]: d["score"] for d in r.json()["data"]}
    assert sorted(scores) == [0, 1, 2]
    assert all(0.0 <= s <= 1.0 and math.isfinite(s) for s in scores.values())
    assert max(scores, key=lambda i: scores[i]) == 1


def test_request_without_model_is_refused_readably(http: httpx.Client, oai: OpenAI) -> None:
    r = http.post("/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert 400 <= r.status_code < 500
    assert "model" in r.text.lower()
    _still_serving(oai)


def test_prompt_longer_than_max_model_len_is_refused(oai: OpenAI) -> None:
    long_prompt = "word " * 6000  # the CPU chat engine's max_model_len is 4096
    with pytest.raises(BadRequestError) as info:
        oai.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": long_prompt}], max_tokens=4
        )
    message = str(info.value).lower()
    assert "context" in message or "length" in message or "token" in message
    _still_serving(oai)


def test_serve_says_which_dtype_this_cpu_got(stack: Stack) -> None:
    from rag.stack.hardware import detect

    if stack.log is None:
        pytest.skip("needs a stack this session started")
    assert detect().describe() in stack.log.read_text()


def test_each_engine_is_one_process_and_no_idle_workers_hold_memory(stack: Stack) -> None:
    from rag.stack import footprint

    if stack.pid is None:
        pytest.skip("needs a stack this session started")
    mem = footprint.measure(stack.pid)
    kinds = mem.by_kind()
    cores = sorted(p.role or "?" for p in mem.processes if p.kind == "engine core")
    assert cores == sorted(ROLES)  # the model runs inside its EngineCore: no worker process
    assert "engine worker" not in kinds and "idle ray worker" not in kinds, kinds
    assert sorted(mem.by_role()) == sorted(ROLES)


def test_idle_engines_keep_no_gloo_group_per_parallel_dimension(stack: Stack) -> None:
    """An engine of one rank shares one process group among vLLM's parallel
    dimensions (rag/stack/engine_hooks.py _one_gloo_group). Each gloo group owns an
    event loop thread waking 100 times a second: 13 per engine before, 52 on the cores
    the chat computes on, doing nothing."""
    import psutil

    if stack.pid is None:
        pytest.skip("needs a stack this session started")
    tree = psutil.Process(stack.pid).children(recursive=True)
    engines = [p for p in tree if p.name().startswith("VLLM::EngineCor")]
    assert len(engines) == len(ROLES)
    for p in engines:
        loops = [t for t in Path(f"/proc/{p.pid}/task").iterdir() if _comm(t) == "gloo_tcp_loop"]
        assert len(loops) <= 3, (p.pid, len(loops))


def _comm(task: Path) -> str:
    try:
        return (task / "comm").read_text().strip()
    except FileNotFoundError:  # the thread just ended
        return ""
