"""Chunk: a document's sections -> pieces that fill the embedding model's window.

A chunk is what gets embedded, so its size is counted in the embedding model's
own tokens (`Tokens.load` finds its tokenizer.json; an estimate stands in only
when none is found, and says so). Blocks (paragraphs, list items, whole code
blocks) are packed greedily up to the budget, and consecutive sections of the
same page share a chunk when they fit: a later section's heading path is kept
as a line inside the text. A block is split only when it alone is over budget:
prose at sentence ends, code at line ends, then at words. Chunks never mix
pages. Within a section, each chunk starts with the last block(s) of the one
before, up to `overlap` tokens. Each chunk's id is a hash of its path, heading
and text, so it is stable across runs and changes exactly when the content does.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from rag.ingest import Document

__all__ = ["Chunk", "Chunker", "Estimate", "TokenCounter", "Tokens", "chunk_document", "count_tokens"]

# Words, numbers and single punctuation marks; a long word is charged ~1 token per
# 4 characters, what WordPiece and BPE vocabularies do to identifiers and URLs.
_TOKEN = re.compile(r"\w+|[^\w\s]")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
# [CLS]/[SEP] or BOS/EOS, and the newline between the context line and the text.
_RESERVED = 3


def count_tokens(text: str) -> int:
    """Estimated token count of `text` (no tokenizer needed; errs high for English prose)."""
    return sum(1 + len(t) // 4 for t in _TOKEN.findall(text))


class TokenCounter(Protocol):
    """Counts tokens the way the embedding model will."""

    name: str

    def counts(self, texts: Sequence[str]) -> list[int]: ...


class Estimate:
    """The estimate of `count_tokens`, for when the model's tokenizer is not at hand."""

    name = "estimate"

    def counts(self, texts: Sequence[str]) -> list[int]:
        return [count_tokens(t) for t in texts]


class Tokens:
    """The embedding model's own tokenizer (a Hugging Face tokenizer.json)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.path = path
        self.name = f"tokenizer:{path}"
        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_truncation()
        self._tok.no_padding()

    def counts(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    @staticmethod
    def find(folders: Sequence[Path]) -> Path | None:
        """The first tokenizer.json in `folders` (a model folder or a file itself)."""
        for f in folders:
            candidate = f if f.name == "tokenizer.json" else f / "tokenizer.json"
            if candidate.is_file():
                return candidate
        return None


@lru_cache(maxsize=4)
def counter_for(tokenizer: str | None) -> TokenCounter:
    """A counter from a tokenizer.json path, or the estimate for None (cached per process)."""
    return Tokens(Path(tokenizer)) if tokenizer else Estimate()


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

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "title": self.title, "heading": self.heading,
                "text": self.text}  # fmt: skip


@dataclass(frozen=True)
class Chunker:
    """How documents are cut: the budget (tokens of the whole embedded text), the
    overlap, and the tokenizer that counts (None: the estimate)."""

    max_tokens: int = 256
    overlap: int = 32
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.overlap >= self.max_tokens:
            raise ValueError("overlap must be smaller than max_tokens")

    @property
    def counter(self) -> TokenCounter:
        return counter_for(self.tokenizer)

    def describe(self) -> dict[str, Any]:
        """What the manifest records, so a changed chunker is visible."""
        return {"max_tokens": self.max_tokens, "overlap": self.overlap, "counted_with": self.counter.name}

    def __call__(self, doc: Document) -> list[Chunk]:
        return chunk_document(doc, self)


@dataclass
class _Unit:
    heading: str
    text: str
    tokens: int


def _split(block: str, limit: int, counter: TokenCounter) -> list[str]:
    """Cut one over-budget block: code at lines, prose at sentences, then at words."""
    parts = block.split("\n") if "\n" in block else _SENTENCE.split(block)
    joiner = "\n" if "\n" in block else " "
    sizes = counter.counts(parts)
    out: list[str] = []
    buf: list[str] = []
    used = 0
    for part, size in zip(parts, sizes, strict=True):
        if size > limit:
            if buf:
                out.append(joiner.join(buf))
                buf, used = [], 0
            out.extend(_words(part, limit, counter))
            continue
        if buf and used + size + 1 > limit:
            out.append(joiner.join(buf))
            buf, used = [], 0
        buf.append(part)
        used += size + 1
    if buf:
        out.append(joiner.join(buf))
    return [p for p in out if p.strip()]


def _words(text: str, limit: int, counter: TokenCounter) -> list[str]:
    words = text.split()
    sizes = counter.counts(words)
    out: list[str] = []
    buf: list[str] = []
    used = 0
    for w, size in zip(words, sizes, strict=True):
        if buf and used + size > limit:
            out.append(" ".join(buf))
            buf, used = [], 0
        if size > limit:  # one "word" longer than a chunk (a minified line): cut by characters
            step = max(1, len(w) * limit // size)
            out.extend(w[i : i + step] for i in range(0, len(w), step))
            continue
        buf.append(w)
        used += size
    if buf:
        out.append(" ".join(buf))
    return out


def chunk_document(doc: Document, chunker: Chunker | None = None) -> list[Chunk]:
    """Chunks of `doc`, in reading order; each embed_text fits chunker.max_tokens."""
    chunker = chunker or Chunker()
    counter = chunker.counter
    headings = list(dict.fromkeys(s.heading for s in doc.sections))
    context = counter.counts([" > ".join(x for x in (doc.title, h) if x) for h in headings])
    inline = counter.counts([h or doc.title for h in headings])  # a later section's heading line
    room = {h: chunker.max_tokens - _RESERVED - c for h, c in zip(headings, context, strict=True)}
    line_cost = {h: c + 1 for h, c in zip(headings, inline, strict=True)}
    floor = max(16, chunker.max_tokens // 4)

    units: list[_Unit] = []
    for section in doc.sections:
        limit = max(floor, room[section.heading] - line_cost[section.heading])
        for block, size in zip(section.blocks, counter.counts(section.blocks), strict=True):
            if size <= limit:
                units.append(_Unit(section.heading, block, size))
            else:
                pieces = _split(block, limit, counter)
                units.extend(
                    _Unit(section.heading, p, n) for p, n in zip(pieces, counter.counts(pieces), strict=True)
                )

    out: list[Chunk] = []
    cur: list[_Unit] = []
    used = 0

    def cost(unit: _Unit, after: list[_Unit]) -> int:
        new_heading = bool(after) and after[-1].heading != unit.heading
        return unit.tokens + 1 + (line_cost[unit.heading] if new_heading else 0)

    def emit() -> None:
        parts: list[str] = []
        for i, u in enumerate(cur):
            if i and u.heading != cur[i - 1].heading:
                parts.append(u.heading or doc.title)
            parts.append(u.text)
        heading, text = cur[0].heading, "\n\n".join(parts)
        digest = hashlib.sha256(f"{doc.path}\0{heading}\0{text}".encode()).hexdigest()[:20]
        out.append(Chunk(id=digest, path=doc.path, title=doc.title, heading=heading, text=text))

    for unit in units:
        if cur and used + cost(unit, cur) > max(floor, room[cur[0].heading]):
            emit()
            tail: list[_Unit] = []  # overlap: whole trailing blocks of this same section
            for prev in reversed(cur):
                carried = sum(u.tokens for u in tail)
                if prev.heading != unit.heading or carried + prev.tokens > chunker.overlap:
                    break
                tail.insert(0, prev)
            cur = tail
            used = sum(cost(u, cur[:i]) for i, u in enumerate(cur))
            if cur and used + cost(unit, cur) > max(floor, room[cur[0].heading]):
                cur, used = [], 0
        used += cost(unit, cur)
        cur.append(unit)
    if cur:
        emit()
    return out
