"""What the server says about its models, and the client settings that follow from it.

The stack's ingress lists each role's facts in /v1/models as `metadata["rag"]`
(rag/stack/ingress/): which reply format the guard speaks, the thresholds a
trained score-format guard was calibrated for, and what kind of reranker `score` is.
The client reads them from the server it talks to, never from the hardware it runs
on, so a laptop pointed at a GPU stack (RAG_BASE_URL) reads Qwen3Guard's answers as
Qwen3Guard's. RAG_GUARD_FORMAT, RAG_GUARD_*THRESHOLD and RAG_RERANK_MODE still
override.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol, cast

from rag.errors import ConfigError
from rag.guard import GUARD_FORMATS
from rag.settings import GuardFormat, RerankMode, Settings

__all__ = ["RERANK_MODE_FOR", "facts_from_models", "resolve"]

# A trained cross-encoder (the GPU's bge-reranker-base) orders the candidates. The CPU
# profile's rerankers so far rank worse than fused retrieval, so an answer does not call
# them (RAG_RERANK_MODE=floor or order brings them back):
# - `small-cross-encoder`, MiniLM-L6 with a LoRA adapter and head trained on PostgreSQL's
#   and the Debian Reference's pages (scripts/train_reranker.py, issue 34): reordering the
#   fused top 20 took recall@1 from 0.75 to 0.45 on the Git manual (40 questions), 0.75 to
#   0.50 on bash's (32), 0.90 to 0.70 on the dev set; RRF with the fused order, 0.625 /
#   0.5625 / 0.90. Its best-passage score tells on- from off-topic questions with AUC 0.90
#   (Git), 0.92 (bash), 0.98 (dev): not yet a floor that passes 98 % of real questions.
# - `yes-no-llm`, the 0.5B chat model asked yes/no (before): over 240 pairs it scored
#   0.09-0.39, an off-topic question's best passage as high as an on-topic one's.
RERANK_MODE_FOR = {"cross-encoder": "order", "small-cross-encoder": "off", "yes-no-llm": "off"}


def facts_from_models(listing: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each model's facts by id, from a /v1/models response: its `metadata["rag"]`
    ({} for a model that publishes none, as a plain vLLM server's)."""
    return {
        str(m["id"]): dict((m.get("metadata") or {}).get("rag") or {})
        for m in listing.get("data", [])
        if isinstance(m, Mapping) and "id" in m
    }


class FactsClient(Protocol):
    def facts(self) -> Mapping[str, Mapping[str, Any]]: ...


def _unresolved(s: Settings) -> bool:
    if not (s.guard_format and s.rerank_mode) or s.overlap is None:
        return True
    if s.min_score is None and s.rerank_mode != "off":  # a floor that gates something
        return True
    # A score-format guard blocks at thresholds; a qwen3guard at its own labels.
    return s.guard_format == "score" and None in (s.guard_input_threshold, s.guard_output_threshold)


def resolve(settings: Settings, client: FactsClient) -> Settings:
    """`settings` with guard_format, the guard's thresholds, rerank_mode and overlap filled
    in from the server where unset."""
    if not _unresolved(settings):
        return settings
    facts = client.facts()
    thresholds = facts.get(settings.guard_model, {}).get("guard_thresholds") or {}
    if not isinstance(thresholds, Mapping):
        thresholds = {}
    settings = dataclasses.replace(
        settings,
        guard_input_threshold=_number(settings.guard_input_threshold, thresholds.get("input")),
        guard_output_threshold=_number(settings.guard_output_threshold, thresholds.get("output")),
    )
    url = settings.base_url
    guard_format: str = settings.guard_format
    rerank_mode: str = settings.rerank_mode
    if not settings.guard_format:
        fmt = facts.get(settings.guard_model, {}).get("guard_format")
        if fmt not in GUARD_FORMATS:
            raise ConfigError(
                f"the server at {url} does not say which reply format its `{settings.guard_model}` model "
                f"speaks (no metadata.rag.guard_format in /v1/models, got {fmt!r}); set "
                f"RAG_GUARD_FORMAT to one of {', '.join(GUARD_FORMATS)}"
            )
        guard_format = str(fmt)
    if not settings.rerank_mode:
        kind = facts.get(settings.score_model, {}).get("reranker")
        mode = RERANK_MODE_FOR.get(str(kind))
        if mode is None:
            raise ConfigError(
                f"the server at {url} does not say what kind of reranker `{settings.score_model}` is "
                f"(metadata.rag.reranker in /v1/models is {kind!r}); set RAG_RERANK_MODE to "
                "order, blend, floor or off"
            )
        rerank_mode = mode
    overlap = settings.overlap
    if overlap is None:  # a server that does not say: one stage at a time
        overlap = facts.get(settings.chat_model, {}).get("overlap_stages") is True
    min_score = _number(settings.min_score, facts.get(settings.score_model, {}).get("floor"))
    return dataclasses.replace(  # pydantic checks both against the Literals again
        settings,
        guard_format=cast(GuardFormat, guard_format),
        rerank_mode=cast(RerankMode, rerank_mode),
        overlap=overlap,
        min_score=min_score,
    )


def _number(given: float | None, served: Any) -> float | None:
    """The setting where given; else the server's value where it is a number; else None,
    which Settings reads as its default (the untrained guard's thresholds, MIN_SCORE)."""
    if given is not None:
        return given
    return float(served) if isinstance(served, int | float) and not isinstance(served, bool) else None
