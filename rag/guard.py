"""Guard: a verdict on the question before retrieval and on the answer before it is shown.

Each profile's guard speaks its own format:
- `score` (CPU): P(unsafe) from /v1/score, blocked at a per-stage threshold. With the
  `qwen` sets it is the chat LM's hidden state read by a head trained on eval/guard
  (scripts/train_guard_head.py), and the server publishes the thresholds the head was
  calibrated for; SmolLM2's is the LM asked yes/no, a stand-in.
- `qwen3guard` (GPU): Qwen3Guard-Gen through /v1/chat/completions, answering
  "Safety: Safe|Unsafe|Controversial" and "Categories: ..." lines.
- `llamaguard3` (GPU, the swap rag/stack/model_facts.yaml allows): Llama Guard 3 through
  /v1/chat/completions, answering "safe", or "unsafe" and a line of category codes
  ("S1,S10"), which its model card defines (LLAMA_GUARD_3_CATEGORIES).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

__all__ = [
    "CHAT_GUARD_FORMATS",
    "GUARD_FORMATS",
    "LLAMA_GUARD_3_CATEGORIES",
    "GuardClient",
    "Verdict",
    "check",
    "parse_llamaguard3",
    "parse_qwen3guard",
]

GUARD_FORMATS = ("score", "qwen3guard", "llamaguard3")
CHAT_GUARD_FORMATS = ("qwen3guard", "llamaguard3")  # generative guards: they answer through chat
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
    threshold: float | None = None  # the score format's bar, which `score` met or did not

    def why(self) -> str:
        """What the guard said, for a person: "input stage, P(unsafe) 0.97 >= 0.62"."""
        parts = [f"{self.stage} stage"]
        if self.score is not None:
            op = ">=" if self.threshold is not None and self.score >= self.threshold else "<"
            parts.append(
                f"P(unsafe) {self.score:.2f}"
                + ("" if self.threshold is None else f" {op} {self.threshold:.2f}")
            )
        else:
            parts.append(
                self.label.capitalize() + (f": {', '.join(self.categories)}" if self.categories else "")
            )
        return ", ".join(parts)


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


# Llama Guard 3's hazard taxonomy (MLCommons), as its model card numbers it.
LLAMA_GUARD_3_CATEGORIES = {
    "S1": "Violent Crimes",
    "S2": "Non-Violent Crimes",
    "S3": "Sex-Related Crimes",
    "S4": "Child Sexual Exploitation",
    "S5": "Defamation",
    "S6": "Specialized Advice",
    "S7": "Privacy",
    "S8": "Intellectual Property",
    "S9": "Indiscriminate Weapons",
    "S10": "Hate",
    "S11": "Suicide & Self-Harm",
    "S12": "Sexual Content",
    "S13": "Elections",
    "S14": "Code Interpreter Abuse",
}
_CODE = re.compile(r"\bS(\d{1,2})\b")


def parse_llamaguard3(text: str, stage: str) -> Verdict:
    """Parse Llama Guard 3's reply ("safe", or "unsafe" then "S1,S10"): the categories by
    name, an unknown code as itself; anything else counts as unsafe (fail closed)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    label = lines[0].lower() if lines else ""
    if label == "safe":
        return Verdict(stage, safe=True, label="safe")
    if label != "unsafe":
        return Verdict(stage, safe=False, label="unparseable")
    codes = [f"S{m.group(1)}" for ln in lines[1:] for m in _CODE.finditer(ln)]
    cats = tuple(f"{c} {LLAMA_GUARD_3_CATEGORIES[c]}" if c in LLAMA_GUARD_3_CATEGORIES else c for c in codes)
    return Verdict(stage, safe=False, label="unsafe", categories=cats)


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
        v = Verdict(stage, safe=p < threshold, label=label, score=p, threshold=threshold)
    elif fmt in CHAT_GUARD_FORMATS:
        # Both read the conversation through their own chat template: the request, and the
        # answer as the assistant's turn.
        messages = [{"role": "user", "content": question}]
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
        reply = client.chat(messages, model=model, max_tokens=64 if fmt == "qwen3guard" else 20)
        v = (
            parse_qwen3guard(reply, stage, strict=strict)
            if fmt == "qwen3guard"
            else parse_llamaguard3(reply, stage)
        )
    else:
        raise ValueError(f"unknown guard format {fmt!r}; choose one of {', '.join(GUARD_FORMATS)}")
    return replace(v, seconds=time.monotonic() - start)
