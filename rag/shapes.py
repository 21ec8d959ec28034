"""The JSON that `rag search --json` and `rag ask --json` print, and the `rag` model's
`rag` field carries (rag/stack/ingress/rag_model.py): a contract for scripts.

Scripts (and tests/test_rag_e2e.py) read these fields: a change here changes the CLI's
interface, not just its looks.
"""

from __future__ import annotations

from typing import Any

from rag.pipeline import Answer
from rag.retrieve import Hit

__all__ = ["answer_json", "fallback_json", "hit_json"]


def hit_json(h: Hit) -> dict[str, Any]:
    """A retrieved passage: where it is, its text, and each score that ranked it."""
    return {
        "path": h.chunk.path, "heading": h.chunk.heading, "chunk_id": h.chunk.id, "score": h.score,
        "dense": h.dense, "lexical": h.lexical, "rerank": h.rerank, "text": h.chunk.text,
    }  # fmt: skip


def fallback_json(a: Answer) -> dict[str, Any] | None:
    """The passage shown under an answer that rests on nothing, and where it is from."""
    if a.fallback is None:
        return None
    src, passage = a.fallback
    return {"n": src.n, "path": src.path, "heading": src.heading, "passage": passage}


def answer_json(a: Answer) -> dict[str, Any]:
    """An answer: its text and sentences with their sources, the hits, guard verdicts and timings."""
    return {
        "question": a.question,
        "answer": a.text,
        "blocked": a.blocked,
        "covered": a.covered,
        "sources": [{"n": x.n, "path": x.path, "heading": x.heading, "score": x.score} for x in a.sources],
        "cited": [x.n for x in a.cited],
        "sentences": [x.as_dict() for x in a.sentences],
        "fallback": fallback_json(a),
        "hits": [hit_json(h) for h in a.hits],
        "guard": [
            {
                "stage": v.stage,
                "safe": v.safe,
                "label": v.label,
                "score": v.score,
                "threshold": v.threshold,
                "categories": list(v.categories),
                "seconds": round(v.seconds, 4),
            }
            for v in a.verdicts
        ],
        "timings": {k: round(v, 4) for k, v in a.timings.items()},
    }
