"""Retrieve: dense top-k, lexical BM25, and reciprocal rank fusion of the two."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from rag.chunk import Chunk

__all__ = ["BM25", "Hit", "dense", "fuse", "rrf"]

_WORD = re.compile(r"[a-z0-9_]+")
# Function words carry no evidence about which chunk answers a question.
_STOP = frozenset(
    """a an and are as at be by can do does for from how i if in is it its of on or so that the this
    to what when where which who why will with you your my we our""".split()
)


def terms(text: str) -> list[str]:
    """Lower-cased word terms without stop words."""
    return [t for t in _WORD.findall(text.lower()) if t not in _STOP]


@dataclass(frozen=True)
class Hit:
    """A chunk and how it scored at each stage that saw it."""

    chunk: Chunk
    score: float  # the stage's own score: cosine, BM25, RRF or rerank probability
    dense: float | None = None
    lexical: float | None = None
    rerank: float | None = None


class BM25:
    """Okapi BM25 over the chunks' title, heading and text."""

    def __init__(self, chunks: Sequence[Chunk], k1: float = 1.2, b: float = 0.75) -> None:
        self.chunks = list(chunks)
        self.docs = [Counter(terms(c.embed_text)) for c in self.chunks]
        self.lengths = np.array([sum(d.values()) for d in self.docs], dtype=np.float32)
        self.avg = float(self.lengths.mean()) if len(self.docs) else 0.0
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.k1, self.b = k1, b

    def scores(self, query: str) -> np.ndarray:
        out = np.zeros(len(self.docs), dtype=np.float32)
        for t in set(terms(query)):
            idf = self.idf.get(t)
            if idf is None:
                continue
            for i, d in enumerate(self.docs):
                f = d.get(t)
                if f:
                    norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg)
                    out[i] += idf * f * (self.k1 + 1) / (f + norm)
        return out

    def top(self, query: str, k: int) -> list[Hit]:
        s = self.scores(query)
        order = [int(i) for i in np.argsort(-s, kind="stable")[:k] if s[i] > 0]
        return [Hit(self.chunks[i], float(s[i]), lexical=float(s[i])) for i in order]


def dense(chunks: Sequence[Chunk], vectors: np.ndarray, query_vec: np.ndarray, k: int) -> list[Hit]:
    """Top-k chunks by cosine (the vectors are unit length)."""
    sims = vectors @ query_vec
    order = np.argsort(-sims, kind="stable")[:k]
    return [Hit(chunks[int(i)], float(sims[i]), dense=float(sims[i])) for i in order]


def rrf(rankings: Sequence[Sequence[Hit]], k: int = 60) -> list[Hit]:
    """Reciprocal rank fusion: sum of 1/(k + rank) over the rankings a chunk appears in.

    Each fused hit keeps every stage score (dense, lexical, rerank) any ranking had for it."""
    fused: dict[str, float] = {}
    merged: dict[str, Hit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, 1):
            cid = hit.chunk.id
            fused[cid] = fused.get(cid, 0.0) + 1.0 / (k + rank)
            seen = merged.get(cid, hit)
            merged[cid] = replace(
                seen,
                dense=hit.dense if hit.dense is not None else seen.dense,
                lexical=hit.lexical if hit.lexical is not None else seen.lexical,
                rerank=hit.rerank if hit.rerank is not None else seen.rerank,
            )
    return [replace(merged[cid], score=fused[cid]) for cid in sorted(fused, key=lambda cid: -fused[cid])]


def fuse(
    chunks: Sequence[Chunk], vectors: np.ndarray, bm25: BM25, query: str, query_vec: np.ndarray, k: int
) -> list[Hit]:
    """Dense and BM25 top-k, fused by RRF, cut to k."""
    return rrf([dense(chunks, vectors, query_vec, k), bm25.top(query, k)])[:k]
