"""Guard: a verdict on the question before retrieval and on the answer before it is shown.

Each profile's guard speaks its own format:
- `score` (CPU): the chat LM as a two-token classifier behind /v1/score; the
  score is P(unsafe) and a threshold decides. A stand-in, not a trained guard.
- `qwen3guard` (GPU): Qwen3Guard-Gen through /v1/chat/completions, answering
  "Safety: Safe|Unsafe|Controversial" and "Categories: ..." lines.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["GUARD_FORMATS", "GuardClient", "Verdict", "check", "parse_qwen3guard"]

GUARD_FORMATS = ("score", "qwen3guard")
NO_REPLY = "(none)"  # what the score-format template reads as "checking the request alone"


class GuardClient(Protocol):
    def score(self, query: str, documents: list[str], model: str | None = None) -> list[float]: ...

    def chat(
        self, messages: list[dict[str, str]], *, model: str | None = None, max_tokens: int = 512
    ) -> str: ...


@dataclass(frozen=True)
class Verdict:
    """The guard's decision at one stage (`input` or `output`)."""

    stage: str
    safe: bool
    label: str  # "safe", "unsafe", "controversial"
    score: float | None = None  # P(unsafe) for the score format
    categories: tuple[str, ...] = field(default_factory=tuple)
    seconds: float = 0.0


_SAFETY = re.compile(r"Safety:\s*(Safe|Unsafe|Controversial)", re.IGNORECASE)
_CATEGORIES = re.compile(r"Categories:\s*(.+)", re.IGNORECASE)


def parse_qwen3guard(text: str, stage: str, strict: bool = False) -> Verdict:
    """Parse Qwen3Guard-Gen's reply; an unparseable reply counts as unsafe (fail closed)."""
    m = _SAFETY.search(text)
    if not m:
        return Verdict(stage, safe=False, label="unparseable")
    label = m.group(1).lower()
    cats: tuple[str, ...] = ()
    if c := _CATEGORIES.search(text):
        cats = tuple(x.strip() for x in c.group(1).split(",") if x.strip() and x.strip().lower() != "none")
    safe = label == "safe" or (label == "controversial" and not strict)
    return Verdict(stage, safe=safe, label=label, categories=cats)


def check(
    client: GuardClient,
    fmt: str,
    model: str,
    question: str,
    answer: str | None = None,
    *,
    threshold: float = 0.5,
    strict: bool = False,
) -> Verdict:
    """Ask the guard about `question` (stage input) or `question` + `answer` (stage output)."""
    stage = "input" if answer is None else "output"
    start = time.monotonic()
    if fmt == "score":
        p = client.score(question, [answer if answer is not None else NO_REPLY], model=model)[0]
        label = "unsafe" if p >= threshold else "safe"
        v = Verdict(stage, safe=p < threshold, label=label, score=p)
    elif fmt == "qwen3guard":
        messages = [{"role": "user", "content": question}]
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
        v = parse_qwen3guard(client.chat(messages, model=model, max_tokens=64), stage, strict=strict)
    else:
        raise ValueError(f"unknown guard format {fmt!r}; choose one of {', '.join(GUARD_FORMATS)}")
    return Verdict(v.stage, v.safe, v.label, v.score, v.categories, time.monotonic() - start)
