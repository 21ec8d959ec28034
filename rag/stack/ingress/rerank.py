"""`POST /v1/rerank` (and `/v2/rerank`, the Cohere v2 client's path), served by /v1/score.

One request shape for the rerank clients we claim, Cohere v2 and v1, Jina and vLLM:
`{model, query, documents, top_n?, return_documents?, ...}`. `RerankRequest` turns
the documents into the texts the reranker scores and passes vLLM's score options
through; `rerank_results` turns /v1/score's scores into
`{results: [{index, relevance_score, document?}]}`, best first.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag.stack.ingress.limits import Refusal

__all__ = ["RerankRequest", "rerank_results"]

# Fields vLLM's score request takes that its rerank request defines too: passed through.
_SCORE_FIELDS = (
    "max_tokens_per_doc", "max_tokens_per_query", "truncate_prompt_tokens", "truncation_side",
    "instruction", "chat_template_kwargs", "use_activation", "user", "cache_salt", "mm_processor_kwargs",
)  # fmt: skip


class RerankRequest(BaseModel):
    """One request shape for the rerank clients we claim: every field Cohere v2, Cohere v1,
    Jina and vLLM define is accepted; anything else is a 400 naming the field.

    documents: strings (all), `{"text": ...}` (Cohere v1, Jina, vLLM) or objects of any
    fields ranked on `rank_fields` (Cohere v1: "field: value" lines, in that order).
    """

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    query: str
    documents: list[str | dict[str, Any]] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=0)  # vLLM: 0 means all
    return_documents: bool = True  # Cohere v1, Jina (Cohere v2 never returns them)
    rank_fields: list[str] | None = Field(default=None, min_length=1)  # Cohere v1
    max_chunks_per_doc: int | None = None  # Cohere v1, deprecated: accepted, no effect (no chunking here)
    priority: int | None = None  # Cohere v2, vLLM: accepted; the engines serve in arrival order
    return_embeddings: bool = False  # Jina: only `false` (rerank returns no embeddings here)
    request_id: str | None = None  # vLLM
    # Cohere v2 and vLLM: each document cut to this many tokens before scoring.
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    # vLLM only, passed to the score engine as they are:
    max_tokens_per_query: int | None = Field(default=None, ge=1)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    use_activation: bool | None = None
    user: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    mm_processor_kwargs: dict[str, Any] | None = None

    def texts(self) -> list[str] | Refusal:
        """Each document as the text the reranker scores, or why one cannot be."""
        fields = self.rank_fields or ["text"]
        out: list[str] = []
        for i, doc in enumerate(self.documents):
            if isinstance(doc, str):
                out.append(doc)
                continue
            missing = [f for f in fields if f not in doc]
            if missing:
                named = (
                    "rank_fields"
                    if self.rank_fields
                    else "a `text` field (or name its fields in rank_fields)"
                )
                return Refusal(
                    f"documents[{i}] has no {', '.join(map(repr, missing))}; it needs {named}",
                    f"documents[{i}]",
                )
            if not self.rank_fields:
                out.append(str(doc["text"]))
            else:
                out.append("\n".join(f"{f}: {doc[f]}" for f in fields))
        return out

    def score_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _SCORE_FIELDS if getattr(self, k) is not None}


def rerank_results(
    request: RerankRequest, texts: list[str], scores: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """/v1/score's scores as rerank results: best first, at most `top_n`, documents if asked."""
    ranked = sorted(scores, key=lambda d: -float(d["score"]))
    if request.top_n:
        ranked = ranked[: request.top_n]
    results = []
    for d in ranked:
        item: dict[str, Any] = {"index": int(d["index"]), "relevance_score": float(d["score"])}
        if request.return_documents:  # as sent: an object document comes back whole (Cohere v1)
            sent = request.documents[int(d["index"])]
            item["document"] = sent if isinstance(sent, dict) else {"text": texts[int(d["index"])]}
        results.append(item)
    return results
