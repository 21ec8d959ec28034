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
from typing import Any, Protocol

from rag.errors import ConfigError
from rag.guard import GUARD_FORMATS
from rag.settings import Settings

__all__ = ["RERANK_MODE_FOR", "facts_from_models", "resolve"]

# A trained cross-encoder orders the candidates. An LLM asked yes/no (the CPU profile's
# Qwen 0.5B) ranks worse than fused retrieval on the dev set, and cannot gate a floor
# either: over the top three passages of 40 Git-manual and 20 dev questions, and of 10
# off-topic ones asked of each corpus (240 pairs), it scored 0.09-0.39, never under the
# 0.05 floor; over the Git manual an off-topic question's best passage scored 0.25 on
# average, an on-topic one's 0.24. So an answer does not call it at all (issue 18;
# RAG_RERANK_MODE=floor brings it back).
RERANK_MODE_FOR = {"cross-encoder": "order", "yes-no-llm": "off"}


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
    guard_format, rerank_mode = settings.guard_format, settings.rerank_mode
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
    return dataclasses.replace(settings, guard_format=guard_format, rerank_mode=rerank_mode, overlap=overlap)


def _number(given: float | None, served: Any) -> float | None:
    """The setting where given; else the server's value where it is a number; else None,
    which Settings.guard_threshold reads as the untrained guard's default."""
    if given is not None:
        return given
    return float(served) if isinstance(served, int | float) and not isinstance(served, bool) else None
