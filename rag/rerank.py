"""Rerank: the retrieved candidates rescored through /v1/score and put in order.

How much the reranker's scores are trusted depends on what it is (the server says,
rag/served.py; RAG_RERANK_MODE overrides):
- `order`: by the rerank score (a trained cross-encoder);
- `blend`: by reciprocal-rank fusion of the retrieval and rerank orders;
- `floor`: the retrieval order kept, the scores only gate the relevance floor. Since then
  only the candidates that can become sources matter, only they are scored;
- `off`: the retrieval order kept and no floor: an answer never calls the reranker, and
  `rag search` and `rag eval` still show its scores of the would-be sources. The CPU
  profile's reranker (a MiniLM cross-encoder trained here) gets this: on manuals it was
  not trained on it ranks worse than fused retrieval (rag/served.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from rag.retrieve import Hit, rrf

__all__ = ["RERANK_MODES", "rerank", "scored_count"]

RERANK_MODES = ("order", "blend", "floor", "off")

Scorer = Callable[[str, list[str]], list[float]]  # (query, documents) -> one score each


def scored_count(mode: str, rerank_n: int, sources: int) -> int:
    """How many of the top candidates go through the reranker in `mode` when asked to
    (an answer in mode `off` asks for none: rag/pipeline.py)."""
    return sources if mode in ("floor", "off") else rerank_n


def rerank(score: Scorer, query: str, hits: Sequence[Hit], mode: str) -> list[Hit]:
    """`hits` rescored by `score` (each keeps its score in `rerank`), ordered per `mode`."""
    if mode not in RERANK_MODES:
        raise ValueError(f"unknown rerank mode {mode!r}; choose one of {', '.join(RERANK_MODES)}")
    scores = score(query, [h.chunk.embed_text for h in hits])
    scored = [replace(h, rerank=s) for h, s in zip(hits, scores, strict=True)]  # retrieval order
    if mode in ("floor", "off"):
        return scored
    by_rerank = sorted(
        (replace(h, score=s) for h, s in zip(scored, scores, strict=True)), key=lambda h: -h.score
    )
    if mode == "order":
        return by_rerank
    return rrf([scored, by_rerank])
