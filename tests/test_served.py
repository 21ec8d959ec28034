"""The client takes the guard format and rerank mode from the server it talks to."""

from __future__ import annotations

import dataclasses
import json

import httpx
import pytest

from rag.client import StackClient
from rag.errors import ConfigError
from rag.served import resolve
from rag.settings import MIN_SCORE, Settings
from rag.stack.profiles import ROLE_FACTS


def server(facts: dict[str, dict[str, object]], seen: list[str] | None = None) -> httpx.MockTransport:
    """A /v1/models that describes each model as our ingress does (metadata.rag)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request.url.path)
        data = [{"id": m, "object": "model", "metadata": {"rag": f}} for m, f in facts.items()]
        return httpx.Response(200, content=json.dumps({"object": "list", "data": data}))

    return httpx.MockTransport(handle)


# What each profile's server says of its models (the serve module adds overlap_stages).
GPU = {**ROLE_FACTS["gpu"], "chat": {**ROLE_FACTS["gpu"]["chat"], "overlap_stages": True}}
CPU = ROLE_FACTS["cpu"]  # an older server: no overlap_stages


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for var in ("RAG_GUARD_FORMAT", "RAG_RERANK_MODE", "RAG_PROFILE", "RAG_GUARD_THRESHOLD"):
        monkeypatch.delenv(var, raising=False)
    return Settings.from_env()


def test_a_gpu_stack_is_read_as_one_from_a_machine_without_a_gpu(unset: Settings) -> None:
    assert unset.guard_format == "" and unset.rerank_mode == ""  # nothing guessed from local hardware
    with StackClient(unset, transport=server(GPU)) as client:
        s = resolve(unset, client)
    assert (s.guard_format, s.rerank_mode, s.overlap) == ("qwen3guard", "order", True)


def test_a_cpu_stack_gets_the_classifier_guard_and_the_rerank_floor(unset: Settings) -> None:
    with StackClient(unset, transport=server(CPU)) as client:
        s = resolve(unset, client)
    assert (s.guard_format, s.rerank_mode, s.overlap) == ("score", "off", False)  # unsaid: one at a time


def test_env_vars_still_override_without_asking(unset: Settings) -> None:
    seen: list[str] = []
    chosen = dataclasses.replace(
        unset,
        guard_format="score",
        rerank_mode="blend",
        guard_input_threshold=0.5,
        guard_output_threshold=0.6,
        overlap=False,
        min_score=0.2,
    )
    with StackClient(chosen, transport=server(GPU, seen)) as client:
        assert resolve(chosen, client) == chosen
        qwen3guard = dataclasses.replace(
            unset, guard_format="qwen3guard", rerank_mode="order", overlap=True, min_score=0.1
        )
        assert resolve(qwen3guard, client) == qwen3guard  # needs no thresholds
        off = dataclasses.replace(qwen3guard, rerank_mode="off", min_score=None)
        assert resolve(off, client) == off  # no floor gates anything: nothing to ask
    assert seen == []


def test_the_floor_is_the_servers_unless_set(unset: Settings) -> None:
    served = {"score": {"reranker": "small-cross-encoder", "floor": 0.0138}}
    with StackClient(unset, transport=server(CPU | served)) as client:
        s = resolve(unset, client)
        assert s.rerank_mode == "off" and s.floor == 0.0138
        assert resolve(dataclasses.replace(unset, min_score=0.3), client).floor == 0.3
    with StackClient(unset, transport=server(GPU)) as client:  # a server that names none
        assert resolve(unset, client).floor == MIN_SCORE


def test_a_score_guard_without_thresholds_takes_the_servers(unset: Settings) -> None:
    served = {"guard": {"guard_format": "score", "guard_thresholds": {"input": 0.55, "output": 0.56}}}
    with StackClient(unset, transport=server(CPU | served)) as client:
        s = resolve(unset, client)
    assert (s.guard_threshold("input"), s.guard_threshold("output")) == (0.55, 0.56)


def test_a_server_that_does_not_say_gets_an_error_naming_the_setting(unset: Settings) -> None:
    with (
        StackClient(unset, transport=server({"guard": {}, "score": {}})) as client,
        pytest.raises(ConfigError, match="RAG_GUARD_FORMAT"),
    ):
        resolve(unset, client)
    half = dataclasses.replace(unset, guard_format="score")
    with (
        StackClient(half, transport=server({"score": {"reranker": "something-new"}})) as client,
        pytest.raises(ConfigError, match="RAG_RERANK_MODE"),
    ):
        resolve(half, client)
