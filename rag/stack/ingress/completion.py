"""The `rag` model's answer in the OpenAI chat shape, with its sources.

An OpenAI client reads a plain chat completion: `message.content` is the answer as
`rag ask` shows it (each sentence with its [n], or `[no source]`), followed by the
sources it cites, so a front end that knows nothing of this stack still shows where
each claim comes from. Two places carry the structure:

- `message.annotations`: OpenAI's own `url_citation` annotations (the shape its
  web-search models return and its SDK types), one per sentence and source, with the
  sentence's character span in `content`; `url` is the document's path in the index,
  `title` its path and heading.
- `rag`, an extension field beside `choices` (OpenAI clients keep unknown fields:
  `completion.model_extra["rag"]` in the Python SDK): the numbered sources with path,
  heading and the passage shown to the model; each sentence with its span, sources
  and support; `covered`, `blocked` (the guard's stage) and per-stage timings.

A refusal is an assistant message naming the stage, with `finish_reason:
"content_filter"`; "not covered" is an ordinary answer saying so. Streamed, each
chunk's `rag.sentences` carries the sentences its delta holds, the first content
chunk `rag.sources`, and the last chunk the whole `rag` field and the annotations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag.answer import Source
from rag.attribute import Sentence, render
from rag.pipeline import Answer
from rag.shapes import fallback_json

__all__ = ["Transcript", "chunk", "completion", "finish_reason", "rag_field", "source_json", "usage_chunk"]

SNIPPET_CHARS = 1200  # of each source's passage: what the model was shown, cut for the page


def source_json(s: Source) -> dict[str, Any]:
    return {
        "n": s.n,
        "path": s.path,
        "heading": s.heading,
        "snippet": s.text[:SNIPPET_CHARS],
        "score": s.score,
    }


class Transcript:
    """`message.content` as it is built, with the span of each sentence in it."""

    def __init__(self) -> None:
        self.content = ""
        self.sentences: list[dict[str, Any]] = []
        self._early = ""  # the first sentence's first words, sent before the sentence

    def add_early(self, words: str) -> str:
        """The first sentence's first words, sent ahead of it (Pipeline.ask's on_early, a
        prefix of that sentence as rendered): the delta they make."""
        if self.content:
            return ""
        self._early = self.content = words.lstrip()
        return self.content

    def add_sentences(self, sentences: Sequence[Sentence]) -> tuple[str, list[dict[str, Any]]]:
        """The delta the sentences make (less the early words already sent), and their
        JSON (text, span, sources, support)."""
        text, added = "", list[dict[str, Any]]()
        early, self._early = self._early, ""
        if early and not self._starts_with(sentences, early):  # cannot happen (early_point)
            early = ""  # then the sentence follows whole, as `rag ask` prints it too
        base = len(self.content) - len(early)
        for x in sentences:
            shown = render(x)
            if not self.sentences and not added:  # the answer starts at its first word
                shown = shown.lstrip()
            start = base + len(text)
            text += shown
            added.append(
                {
                    "text": x.text, "start": start, "end": start + len(shown.rstrip()),
                    "sources": list(x.sources), "support": x.support, "sep": x.sep,
                }
            )  # fmt: skip
        delta = text[len(early) :]
        self.content += delta
        self.sentences += added
        return delta, added

    @staticmethod
    def _starts_with(sentences: Sequence[Sentence], early: str) -> bool:
        return bool(sentences) and render(sentences[0]).lstrip().startswith(early)

    def add_text(self, text: str) -> str:
        """Plain text after the sentences (the sources list, a refusal): the delta it makes."""
        delta = ("\n\n" if self.content else "") + text
        self.content += delta
        return delta

    def annotations(self, sources: Sequence[Source]) -> list[dict[str, Any]]:
        """OpenAI url_citation annotations: each sentence's span, once per source it cites."""
        by_n = {s.n: s for s in sources}
        out = []
        for x in self.sentences:
            for s in (by_n[n] for n in x["sources"] if n in by_n):
                title = s.path + (f" — {s.heading}" if s.heading else "")
                span = {"start_index": x["start"], "end_index": x["end"], "url": s.path, "title": title}
                out.append({"type": "url_citation", "url_citation": span})
        return out


def finish_reason(answer: Answer) -> str:
    return "content_filter" if answer.blocked else "stop"


def rag_field(answer: Answer, transcript: Transcript, generation: str | None) -> dict[str, Any]:
    """The extension field: everything a page needs to show the answer with its sources."""
    verdict = next((v for v in answer.verdicts if v.stage == answer.blocked), None)
    return {
        "sources": [source_json(s) for s in answer.sources],
        "cited": [s.n for s in answer.cited],
        "sentences": transcript.sentences,
        "covered": answer.covered,
        "blocked": answer.blocked,  # None, "input" or "output"
        "refusal": answer.refusal() if answer.blocked else None,
        "guard": verdict.why() if verdict else None,
        "fallback": fallback_json(answer),
        "index_generation": generation,
        "timings": {k: round(v, 4) for k, v in answer.timings.items()},
    }


def completion(
    answer: Answer, transcript: Transcript, *, request_id: str, created: int, generation: str | None
) -> dict[str, Any]:
    """The whole (non-streamed) chat completion."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": "rag",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": transcript.content,
                    "annotations": transcript.annotations(answer.sources),
                },
                "finish_reason": finish_reason(answer),
                "logprobs": None,
            }
        ],
        "usage": answer.usage.as_dict(),
        "rag": rag_field(answer, transcript, generation),
    }


def usage_chunk(request_id: str, created: int, answer: Answer) -> dict[str, Any]:
    """The chunk that ends a stream asked for with `stream_options.include_usage`: no
    choices, the answer's `usage` (OpenAI's shape for it)."""
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": "rag",
        "choices": [],
        "usage": answer.usage.as_dict(),
    }


def chunk(
    request_id: str,
    created: int,
    delta: dict[str, Any],
    *,
    finish: str | None = None,
    rag: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chat.completion.chunk."""
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": "rag",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    if rag is not None:
        body["rag"] = rag
    return body
