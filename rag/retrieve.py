"""Retrieve: dense top-k, lexical BM25, and reciprocal rank fusion of the two."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rag.chunk import Chunk

__all__ = ["BM25", "MODES", "Hit", "dense", "fuse", "retrieve", "rrf"]

MODES = ("dense", "lexical", "fused")

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
    row: int = -1  # the chunk's row in the index (its stored vector), where known


class BM25:
    """Okapi BM25 over the chunks' title, heading and text, as bm25s computes it.

    bm25s scores every (term, chunk) pair once, into a sparse matrix; a query sums
    the rows of its terms. `rag index` saves the matrix beside the vectors and a
    query process memory-maps it (no pickle), so nothing is rebuilt per process.
    Terms are ours (`terms`): lower-cased words without stop words.
    """

    def __init__(self, chunks: Sequence[Chunk], engine: Any = None, k1: float = 1.2, b: float = 0.75) -> None:
        bm25s = _bm25s()
        self.chunks = chunks
        if engine is None:
            engine = bm25s.BM25(k1=k1, b=b)
            engine.index([terms(c.embed_text) for c in chunks], show_progress=False)
        self.engine = engine
        self._df: tuple[dict[str, int], np.ndarray, int] | None = None

    @classmethod
    def load(cls, folder: Path, chunks: Sequence[Chunk]) -> BM25:
        """The index `save` wrote, memory-mapped."""
        return cls(chunks, _bm25s().BM25.load(str(folder), mmap=True, show_progress=False))

    def save(self, folder: Path) -> None:
        self.engine.save(str(folder), show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        words = list(dict.fromkeys(terms(query)))  # each term once, as Okapi BM25 counts them
        if not words:
            return np.zeros(len(self.chunks), dtype=np.float32)
        return np.asarray(self.engine.get_scores(words), dtype=np.float32)

    def idf(self, term: str) -> float:
        """The term's inverse document frequency over the whole index; a word no chunk
        holds weighs as one that a single chunk holds."""
        if self._df is None:
            indptr = np.asarray(self.engine.scores["indptr"])
            self._df = (dict(self.engine.vocab_dict), np.diff(indptr), int(self.engine.scores["num_docs"]))
        vocab, df, n = self._df
        t = vocab.get(term)
        return idf_from_df(int(df[t]) if t is not None and t < len(df) else 1, n)

    def top(self, query: str, k: int) -> list[Hit]:
        s = self.scores(query)
        order = [i for i in _top(s, k) if s[i] > 0]
        return [Hit(self.chunks[i], float(s[i]), lexical=float(s[i]), row=i) for i in order]


def idf_from_df(df: int, n_docs: int) -> float:
    """BM25's IDF as Lucene and bm25s compute it: rare terms weigh most."""
    return math.log(1 + (n_docs - df + 0.5) / (df + 0.5))


def _bm25s() -> Any:
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it sets DEBUG on import: lines not for users
    return bm25s


def _top(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the k highest scores, best first, ties in index order (O(n), not a full sort)."""
    part = np.argpartition(-scores, k - 1)[:k] if len(scores) > k else np.arange(len(scores))
    return [int(i) for i in part[np.lexsort((part, -scores[part]))]]


def dense(chunks: Sequence[Chunk], vectors: np.ndarray, query_vec: np.ndarray, k: int) -> list[Hit]:
    """Top-k chunks by cosine (the vectors are unit length)."""
    sims = vectors @ query_vec
    return [Hit(chunks[i], float(sims[i]), dense=float(sims[i]), row=i) for i in _top(sims, k)]


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


def retrieve(
    chunks: Sequence[Chunk],
    vectors: np.ndarray,
    bm25: BM25,
    query: str,
    query_vec: np.ndarray | None,
    mode: str,
    k: int,
) -> list[Hit]:
    """Top-k candidates by `mode`: dense, lexical (no query vector needed) or fused."""
    if mode == "lexical":
        return bm25.top(query, k)
    if mode not in MODES:
        raise ValueError(f"unknown retrieval mode {mode!r}; choose one of {', '.join(MODES)}")
    if query_vec is None:
        raise ValueError(f"retrieval mode {mode!r} needs the query's vector")
    if mode == "dense":
        return dense(chunks, vectors, query_vec, k)
    return fuse(chunks, vectors, bm25, query, query_vec, k)
