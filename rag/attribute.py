"""Attribute: which shown source supports each sentence of the answer, judged after generation.

The model's own `[n]` markers are a claim, not evidence: a 0.5B model leaves most
sentences unmarked and sometimes marks the wrong source. So each released sentence
is scored against every source the model was shown, and the sources that clear the
bar are the sentence's citations; a marker the check disagrees with is dropped.

How support is judged (calibrated on hand-labeled sentences, `eval/attribution-*.jsonl`):
  lexical  share of the sentence's rare-term weight (IDF over the whole index) that
           appears in the source: names, options, numbers, file paths (counting only
           the terms the question lacks separated worse: ROC AUC 0.69 against 0.79);
  dense    cosine of the sentence's embedding (the served `embed` engine) with the
           source chunk's stored vector;
  support  = LEXICAL_WEIGHT * lexical + (1 - LEXICAL_WEIGHT) * dense, and a source
           supports a sentence at or above THRESHOLD;
  names    but only a source that holds every name the sentence gives a reader to type
           (a long option, a camelCase setting, a shell variable: `names`). A 0.5B model
           invents them in the shape of the prompt's example ("the --exit-on-failure
           option"), and the rest of such a sentence, copied from a source, scores as
           support (6 of 71 answers over two manuals: 5 wrong, 1 naming `--gpgSign` for
           `tag.gpgSign`, none of the 19 right ones; eval/answer-labels).
A sentence that names nothing the question does not already hold (a lead-in such
as "Here is how:") needs no source; one that only restates the question is not
an answer. When most claims have no support, the caller shows the best passage
next to the answer (`Attributor.best_passage`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rag.answer import NOT_COVERED, Source
from rag.retrieve import terms
from rag.settings import SUPPORT_THRESHOLD

__all__ = [
    "LEXICAL_WEIGHT",
    "THRESHOLD",
    "UNSUPPORTED",
    "Attributor",
    "Sentence",
    "early_point",
    "names",
    "needs_fallback",
    "release_point",
    "render",
    "split_sentences",
    "strip_markers",
]

# From eval/attribution-*.jsonl (hand labels, see the README): the best balanced accuracy.
LEXICAL_WEIGHT = 0.7
THRESHOLD = SUPPORT_THRESHOLD
UNSUPPORTED = "[no source]"  # the mark after a sentence no source supports
MAX_SOURCES = 2  # citations per sentence: the best, and a second only if it clears the bar too
FALLBACK_SHARE = 0.5  # more than this share of claims unsupported: quote the passage instead

_MARKER = re.compile(r"\s*\[(\d+(?:\s*,\s*\d+)*)\]")
_FENCE = "```"
# A sentence ends at . ! ? (and its trailing markers) and the whitespace after it, before
# what starts a sentence: a capital, a digit, code, a list mark (so "e.g. the", "v0.5 is"
# and 'starts with "fixup! " or' stay whole, and a marker after the stop stays with its
# sentence); or at a blank line or a line that starts a list item or heading. A single
# line break is only wrapping: small models copy a source's wrapped lines into answers.
_END = re.compile(
    r"[.!?](?:\s*\[\d+(?:\s*,\s*\d+)*\])*\s+(?=[A-Z0-9`(*#_-])|\n\s*(?:\n|(?=[-*+#|] |\d+[.)] ))\s*"
)
# What a reader would type from an answer: a long option (`--no-ff`), a setting with a
# camelCase key (`tag.gpgSign`, `color.blame.repeatedLines`), a shell variable (`$PATH`).
# Lower-case dotted words are left out: file names and "e.g" look the same.
_NAME = re.compile(
    r"(?<![\w-])--[A-Za-z][\w-]*[A-Za-z0-9]"
    r"|\b[a-z][a-z0-9]*(?:\.[a-z][\w-]*)*\.[a-z][a-z0-9]*[A-Z]\w*"
    r"|\$\{?[A-Z_][A-Z0-9_]+"
)
# Words that introduce what follows without stating anything.
_LEAD_IN = frozenset("here following example steps step yes note also see below above way".split())
_ABBREV = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "Fig.", "No.")


@dataclass(frozen=True)
class Sentence:
    """One unit of the answer (a sentence, a list item, or a whole code block)."""

    text: str  # without the model's [n] markers
    sep: str = ""  # the whitespace that followed it
    model_cited: tuple[int, ...] = ()  # the [n] the model wrote
    sources: tuple[int, ...] = ()  # the [n] the check attached: the best first, then the model's it kept
    scores: dict[int, float] = field(default_factory=dict)  # support per source number
    support: str = "unsupported"  # supported | unsupported | none-needed | restates
    unsourced: tuple[str, ...] = ()  # names it gives that no shown source holds

    @property
    def is_claim(self) -> bool:
        return self.support in ("supported", "unsupported", "restates")

    def as_dict(self) -> dict[str, Any]:
        """The shape `rag ask --json` and `rag eval`'s results give each sentence."""
        return {
            "text": self.text, "sources": list(self.sources), "support": self.support,
            "scores": self.scores, "model_cited": list(self.model_cited), "unsourced": list(self.unsourced),
        }  # fmt: skip


def strip_markers(text: str) -> tuple[str, tuple[int, ...]]:
    """The text without [n] markers, and the numbers they held in order of first use."""
    found: list[int] = []
    for m in _MARKER.finditer(text):
        for part in m.group(1).split(","):
            n = int(part)
            if n not in found:
                found.append(n)
    return _MARKER.sub("", text), tuple(found)


def names(text: str) -> set[str]:
    """The options, settings and variables `text` names (`_NAME`), `{` dropped."""
    return {m.replace("{", "") for m in _NAME.findall(text)}


def _boundaries(text: str, start: int = 0) -> list[int]:
    """Offsets just past each sentence end in text[start:], never inside a code fence."""
    out: list[int] = []
    pos = start
    while pos < len(text):
        fence = text.find(_FENCE, pos)
        stop = len(text) if fence < 0 else fence
        for m in _END.finditer(text, pos, stop):
            if not m.group().startswith("\n") and text[: m.start() + 1].endswith(_ABBREV):
                continue
            out.append(m.end())
        if fence < 0:
            break
        if fence > pos:
            out.append(fence)  # text before a code block ends there
        close = text.find(_FENCE, fence + len(_FENCE))
        if close < 0:
            break  # an open block: no boundary until it closes
        end = text.find("\n", close + len(_FENCE))
        end = len(text) if end < 0 else end + 1
        out.append(end)
        pos = end
    return sorted(set(b for b in out if start < b <= len(text)))


def split_sentences(text: str) -> list[Sentence]:
    """Sentences (a fenced code block stays one unit), markers moved into `model_cited`."""
    out: list[Sentence] = []
    prev = 0
    for b in [*_boundaries(text), len(text)]:
        if b <= prev:
            continue
        piece = text[prev:b]
        prev = b
        body = piece.rstrip()
        sep = piece[len(body) :]
        if not body.strip():
            if out:
                out[-1] = replace(out[-1], sep=out[-1].sep + piece)
            continue
        lead = body[: len(body) - len(body.lstrip())]
        if lead and out:
            out[-1] = replace(out[-1], sep=out[-1].sep + lead)
        clean, cited = strip_markers(body.strip())
        out.append(Sentence(clean.strip(), sep, cited))
    return out


def release_point(text: str, after: int) -> int:
    """Where text held back for checking may be released: just past the last finished
    sentence that is followed by the start of another (so a marker after a full stop
    stays with its sentence, and an open code block is held whole); `after` if none."""
    ends = [b for b in _boundaries(text) if b > after]
    done = [b for b in ends if text[b:].strip()]
    return max(done, default=after)


def early_point(text: str, words: int) -> int:
    """Where the start of an unfinished first sentence may be shown early: just past its
    first `words` words once another has begun, while nothing in them can change as the
    sentence is rendered (a marker, a code block or an unclosed code span, a line
    break); 0 if not yet or never. A closed `inline code` span is kept as it is.

    What is shown early is then a prefix of the sentence as `render` shows it."""
    lead = len(text) - len(text.lstrip())
    ends = [m.end() for m in re.finditer(r"\S+\s+", text[lead:])]
    if len(ends) < words:
        return 0
    point = lead + ends[words - 1]
    head = text[:point]
    code = _FENCE in head or head.count("`") % 2 == 1
    if "[" in head or code or "\n" in head.strip() or _boundaries(text[: point + 1]):
        return 0
    return point


def render(s: Sentence, unsupported_mark: str = UNSUPPORTED) -> str:
    """The sentence as shown: its attached [n] (before the final stop), or the mark."""
    if s.text.startswith(_FENCE):
        tag = " ".join(f"[{n}]" for n in s.sources) or (
            unsupported_mark if s.support == "unsupported" else ""
        )
        return s.text + (f"\n{tag}" if tag else "") + s.sep
    if s.sources:
        tag = "[" + ", ".join(str(n) for n in s.sources) + "]"
    elif s.support in ("unsupported", "restates"):
        tag = unsupported_mark
    else:
        return s.text + s.sep
    body, stop = (s.text[:-1], s.text[-1]) if s.text[-1:] in ".!?:" else (s.text, "")
    return f"{body} {tag}{stop}{s.sep}"


class Attributor:
    """Scores sentences against the sources shown to the model."""

    def __init__(
        self,
        question: str,
        sources: Sequence[Source],
        source_vectors: np.ndarray,
        embed: Callable[[Sequence[str]], np.ndarray],
        idf: Callable[[str], float],
        *,
        threshold: float = THRESHOLD,
        lexical_weight: float = LEXICAL_WEIGHT,
    ) -> None:
        self.question = question
        self.question_terms = set(terms(question))
        self.sources = list(sources)
        self.vectors = source_vectors
        self._embed, self._idf = embed, idf
        self.threshold, self.lexical_weight = threshold, lexical_weight
        self._source_terms = [set(terms(f"{s.heading} {s.text}")) for s in self.sources]
        self._source_text = [f"{s.heading} {s.text}" for s in self.sources]
        self._source_lower = [t.lower() for t in self._source_text]

    def lexical(self, sentence: str) -> list[float]:
        """Per source: share of the sentence's IDF weight that the source holds."""
        words = set(terms(sentence))
        total = sum(self._idf(w) for w in words)
        if total <= 0:
            return [0.0] * len(self.sources)
        return [sum(self._idf(w) for w in words & st) / total for st in self._source_terms]

    def scores(self, sentences: Sequence[str]) -> list[tuple[list[float], list[float]]]:
        """(lexical, dense) per source for each sentence; one embedding call for all."""
        if not sentences:
            return []
        vecs = self._embed(list(sentences))
        dense = (vecs @ np.asarray(self.vectors, dtype=np.float32).T).tolist()
        return [(self.lexical(s), d) for s, d in zip(sentences, dense, strict=True)]

    def attribute(self, sentences: Sequence[Sentence]) -> list[Sentence]:
        """Each sentence with its supporting sources, support label and per-source scores."""
        out: list[Sentence] = []
        claims = [s for s in sentences if self._needs_source(s.text)]
        scored = dict(zip([id(s) for s in claims], self.scores([s.text for s in claims]), strict=True))
        for s in sentences:
            if id(s) not in scored or NOT_COVERED.rstrip(".") in s.text:  # saying so is no claim
                out.append(replace(s, support="none-needed"))
                continue
            lex, dense = scored[id(s)]
            w = self.lexical_weight
            blend = {
                src.n: w * lx + (1 - w) * max(dn, 0.0)
                for src, lx, dn in zip(self.sources, lex, dense, strict=True)
            }
            # A source that lacks a name the sentence gives cannot back it, however alike they read.
            named = names(s.text)
            lacking = {
                src.n: {n for n in named if not self._holds(i, n)} for i, src in enumerate(self.sources)
            }
            unsourced = tuple(sorted(set.intersection(*lacking.values()))) if lacking else ()
            ranked = sorted(blend, key=lambda n: -blend[n])
            # The best sources that clear the bar, and the model's own [n] where the check agrees.
            backs = {n for n in blend if blend[n] >= self.threshold and not lacking[n]}
            keep = [n for n in ranked if n in backs][:MAX_SOURCES]
            keep += [n for n in s.model_cited if n in backs and n not in keep]
            attached = tuple(keep)
            support = "supported" if attached else "unsupported"
            if not attached and self._restates(s.text):
                support = "restates"
            rounded = {n: round(v, 4) for n, v in blend.items()}
            out.append(replace(s, sources=attached, scores=rounded, support=support, unsourced=unsourced))
        return out

    def _holds(self, i: int, name: str) -> bool:
        """Whether source i holds `name`: options and settings in any case (git's keys are
        case-blind), a variable as written and with or without its `$` ("the PATH variable")."""
        if name.startswith("$"):
            return name[1:] in self._source_text[i]
        return name.lower() in self._source_lower[i]

    def _needs_source(self, text: str) -> bool:
        """A sentence that states something: a term the question does not already hold,
        beyond the words of a lead-in ("Here is how:", "See below."), or one that only
        restates the question."""
        return bool(set(terms(text)) - self.question_terms - _LEAD_IN) or self._restates(text)

    def _restates(self, text: str) -> bool:
        """Most of the sentence's terms come from the question."""
        words = set(terms(text))
        return len(words) >= 2 and len(words & self.question_terms) / len(words) >= 0.8

    def best_passage(self, max_chars: int = 480) -> tuple[Source, str] | None:
        """The run of up to three sentences of the shown sources that best covers the
        question: the share of the question's rare-term weight it holds, blended (as for
        support) with the cosine of its embedding to the question's (one embedding call)."""
        windows: list[tuple[Source, str]] = []
        for src in self.sources:
            units = [s.text for s in split_sentences(src.text) if s.text]
            for i in range(len(units)):
                passage = units[i]
                for nxt in units[i + 1 : i + 3]:
                    if len(passage) + len(nxt) + 1 > max_chars:
                        break
                    passage += " " + nxt
                windows.append((src, passage[:max_chars]))
        if not windows:
            return None
        vecs = self._embed([self.question, *(text for _, text in windows)])
        cosine = vecs[1:] @ vecs[0]
        total = sum(self._idf(w) for w in self.question_terms) or 1.0
        w = self.lexical_weight

        def score(i: int) -> float:
            held = set(terms(windows[i][1])) & self.question_terms
            return w * sum(self._idf(t) for t in held) / total + (1 - w) * max(float(cosine[i]), 0.0)

        return windows[max(range(len(windows)), key=score)]


def needs_fallback(sentences: Sequence[Sentence]) -> bool:
    """Too little of the answer rests on a source to present it as an answer."""
    claims = [s for s in sentences if s.is_claim]
    if not claims:
        return False
    unsupported = sum(s.support != "supported" for s in claims)
    return unsupported / len(claims) > FALLBACK_SHARE
