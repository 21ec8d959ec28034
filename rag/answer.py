"""Answer: numbered sources into chat messages (rag/attribute.py reads the markers back).

The messages go to /v1/chat/completions, so the server renders them through
the chat model's own template; nothing here formats a model-specific prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rag.retrieve import Hit

__all__ = ["NOT_COVERED", "Source", "build_messages", "echoes_example", "format_sources", "sources_from"]

NOT_COVERED = "The indexed documents do not cover this question."

SYSTEM = (
    "Answer the question from the numbered sources only, in at most three sentences. Name the "
    "command, option, setting or value that answers it, in the words of the source, and put the "
    "source's number in square brackets after every sentence. Do not repeat the question. If the "
    f"sources do not contain the answer, reply exactly: {NOT_COVERED}"
)
# One worked example: small chat models copy a shown format far more reliably than they
# follow a described one (dev set, Qwen2.5 0.5B: 5/10 answers cited vs 1/10). It asks for a
# goal without naming the option, as users do. Its answer is declarative and in the source's
# words: a terse imperative one ("Run it with `--keep-logs`.") was copied word for word into
# answers about other options.
EXAMPLE = (
    {
        "role": "user",
        "content": "Sources:\n[1] app.html (OPTIONS)\n--keep-logs\n    Keep the log files after a "
        "successful run. By default they are deleted when the run succeeds.\n\n"
        "[2] app.html (FILES)\nLogs are written to /var/log/app.log.\n\n"
        "Question: How do I stop the app from deleting its logs when it finishes?",
    },
    {
        "role": "assistant",
        "content": "The --keep-logs option keeps the log files after a successful run; by default they "
        "are deleted when the run succeeds [1].",
    },
)


# What of the example's answer makes an answer its echo: a run of this many of its words,
# or one of its option-like names (`--keep-logs`), that no shown source holds; such words
# can only have come from the example. The model falls back on the example when the
# sources hold no name for what was asked (3 of 30 Python-manual answers were the example
# word for word): the pattern it was shown is then the likeliest text. Five words, not
# four: "by default they are" is a run of the example and of many a right answer.
ECHO_WORDS = 5
_WORDS = re.compile(r"[a-z0-9][a-z0-9_.-]*[a-z0-9]|[a-z0-9]|--?[a-z0-9][a-z0-9_-]*")


def _words(text: str) -> list[str]:
    return _WORDS.findall(text.lower())


def _runs(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


_EXAMPLE_WORDS = _words(EXAMPLE[-1]["content"])
_EXAMPLE_NAMES = frozenset(w for w in _EXAMPLE_WORDS if w.startswith("-") or "_" in w)


def echoes_example(text: str, sources: Sequence[Source]) -> bool:
    """Whether `text` repeats the worked example's answer: a run of ECHO_WORDS of its words,
    or one of its option names, that none of the shown `sources` holds."""
    words = _words(text)
    if not words:
        return False
    shown = [_words(f"{s.heading} {s.text}") for s in sources]
    names = _EXAMPLE_NAMES.intersection(words) - {w for ws in shown for w in ws}
    if names:
        return True
    runs = _runs(_EXAMPLE_WORDS, ECHO_WORDS) & _runs(words, ECHO_WORDS)
    return bool(runs - set().union(*(_runs(ws, ECHO_WORDS) for ws in shown)))


@dataclass(frozen=True)
class Source:
    """A numbered source as shown to the model and to the user."""

    n: int
    path: str
    heading: str
    text: str
    score: float


def sources_from(hits: Sequence[Hit]) -> list[Source]:
    """Number the hits 1..n in rank order."""
    return [Source(i, h.chunk.path, h.chunk.heading, h.chunk.text, h.score) for i, h in enumerate(hits, 1)]


# A caller's own system message (the `rag` model's, from an OpenAI client) comes after ours,
# framed as additions: tone, language, length. It cannot lift the guard, which checks it
# with the question and checks the answer whatever it says.
USER_INSTRUCTIONS = "Also follow these instructions from the user where they do not contradict the above:\n"


def build_messages(
    question: str,
    sources: Sequence[Source],
    history: Sequence[dict[str, str]] = (),
    instructions: str = "",
) -> list[dict[str, str]]:
    """Instructions (ours, then the caller's), a worked example, the conversation so far,
    then sources + question."""
    blocks = "\n\n".join(
        f"[{s.n}] {s.path}" + (f" ({s.heading})" if s.heading else "") + f"\n{s.text}" for s in sources
    )
    system = SYSTEM + (f"\n\n{USER_INSTRUCTIONS}{instructions.strip()}" if instructions.strip() else "")
    return [
        {"role": "system", "content": system},
        *EXAMPLE,
        *history,
        {"role": "user", "content": f"Sources:\n{blocks}\n\nQuestion: {question}"},
    ]


def format_sources(sources: Sequence[Source]) -> str:
    """The lines printed under an answer: number, path and heading."""
    return "\n".join(f"[{s.n}] {s.path}" + (f" — {s.heading}" if s.heading else "") for s in sources)
