"""Answer: numbered sources into chat messages (rag/attribute.py reads the markers back).

The messages go to /v1/chat/completions, so the server renders them through
the chat model's own template; nothing here formats a model-specific prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rag.retrieve import Hit

__all__ = ["NOT_COVERED", "Source", "build_messages", "format_sources", "sources_from"]

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


def build_messages(
    question: str, sources: Sequence[Source], history: Sequence[dict[str, str]] = ()
) -> list[dict[str, str]]:
    """Instructions, a worked example, the conversation so far, then sources + question."""
    blocks = "\n\n".join(
        f"[{s.n}] {s.path}" + (f" ({s.heading})" if s.heading else "") + f"\n{s.text}" for s in sources
    )
    return [
        {"role": "system", "content": SYSTEM},
        *EXAMPLE,
        *history,
        {"role": "user", "content": f"Sources:\n{blocks}\n\nQuestion: {question}"},
    ]


def format_sources(sources: Sequence[Source]) -> str:
    """The lines printed under an answer: number, path and heading."""
    return "\n".join(f"[{s.n}] {s.path}" + (f" — {s.heading}" if s.heading else "") for s in sources)
