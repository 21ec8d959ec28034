"""Chunk: sections -> overlapping pieces that fit the embedding model's window.

Chunks never cross a heading; inside a section they are packed from whole
paragraphs, and only a paragraph longer than a chunk is cut (at sentence
ends, then at words). Sizes are in tokens, counted with a word-piece-like
estimate that runs without the model's tokenizer and errs high for English
prose. Each chunk's id is a hash of its path, heading and text, so it is
stable across runs and changes exactly when the content does.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from rag.ingest import Document

__all__ = ["Chunk", "chunk_document", "count_tokens"]

# Words, numbers and single punctuation marks; a long word is charged ~1 token per
# 4 characters, what WordPiece and BPE vocabularies do to identifiers and URLs
# (1 per 6 undercounted code-heavy Markdown past MiniLM's 256-token window).
_TOKEN = re.compile(r"\w+|[^\w\s]")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


def count_tokens(text: str) -> int:
    """Estimated token count of `text`."""
    return sum(1 + len(t) // 4 for t in _TOKEN.findall(text))


@dataclass(frozen=True)
class Chunk:
    """One piece of one document: what gets embedded, retrieved and cited."""

    id: str
    path: str
    title: str
    heading: str
    text: str

    @property
    def embed_text(self) -> str:
        """Text sent to the embedder: title and heading give a short chunk its context."""
        where = " > ".join(x for x in (self.title, self.heading) if x)
        return f"{where}\n{self.text}" if where else self.text


def _pieces(paragraph: str, max_tokens: int) -> list[str]:
    """Split a paragraph that exceeds max_tokens at sentences, then at words."""
    if count_tokens(paragraph) <= max_tokens:
        return [paragraph]
    out: list[str] = []
    for sentence in _SENTENCE.split(paragraph):
        if count_tokens(sentence) <= max_tokens:
            out.append(sentence)
            continue
        words, buf = sentence.split(), list[str]()
        for w in words:
            if buf and count_tokens(" ".join([*buf, w])) > max_tokens:
                out.append(" ".join(buf))
                buf = []
            buf.append(w)
        if buf:
            out.append(" ".join(buf))
    return out


def _pack(units: list[str], max_tokens: int, overlap: int) -> list[str]:
    """Greedy packing of units into chunks; each chunk starts with the tail of the last."""
    chunks: list[str] = []
    cur: list[str] = []
    cur_tokens = 0
    for unit in units:
        t = count_tokens(unit)
        if cur and cur_tokens + t > max_tokens:
            chunks.append("\n\n".join(cur))
            tail: list[str] = []
            tail_tokens = 0
            for prev in reversed(cur):  # carry whole units worth up to `overlap` tokens
                pt = count_tokens(prev)
                if tail_tokens + pt > overlap:
                    break
                tail.insert(0, prev)
                tail_tokens += pt
            cur, cur_tokens = tail, tail_tokens
            if cur_tokens + t > max_tokens:
                cur, cur_tokens = [], 0
        cur.append(unit)
        cur_tokens += t
    if cur:
        chunks.append("\n\n".join(cur))
    return chunks


def chunk_document(doc: Document, max_tokens: int = 200, overlap: int = 40) -> list[Chunk]:
    """Chunks of `doc`, in reading order; none longer than max_tokens (estimated)."""
    if overlap >= max_tokens:
        raise ValueError("overlap must be smaller than max_tokens")
    budget = max_tokens - count_tokens(f"{doc.title} > ") - 8  # room for the context line
    out: list[Chunk] = []
    for section in doc.sections:
        section_budget = max(32, budget - count_tokens(section.heading))
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", section.text) if p.strip()]
        units = [piece for p in paragraphs for piece in _pieces(p, section_budget // 2 or 1)]
        for text in _pack(units, section_budget, overlap):
            digest = hashlib.sha256(f"{doc.path}\0{section.heading}\0{text}".encode()).hexdigest()[:20]
            out.append(Chunk(id=digest, path=doc.path, title=doc.title, heading=section.heading, text=text))
    return out
