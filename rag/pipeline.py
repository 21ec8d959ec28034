"""The query path, top-down: guard in -> embed -> retrieve -> rerank -> answer -> guard out
-> attribute, each stage in its own module (rag/guard.py, rag/embed.py, rag/retrieve.py,
rag/rerank.py, rag/answer.py, rag/attribute.py); this one runs them in order and times them.

The answer streams, but no text reaches the caller before the guard has seen
it: generated text is held back a sentence at a time and released once the
guard has passed the answer so far. Each released sentence is then attributed
(rag/attribute.py): it goes out carrying the sources that support it, or marked
as having none. An answer most of whose claims rest on nothing is followed by
the passage of the sources that best covers the question (`Answer.fallback`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rag.answer import NOT_COVERED, Source, build_messages, format_sources, sources_from
from rag.attribute import (
    UNSUPPORTED,
    Attributor,
    Sentence,
    needs_fallback,
    release_point,
    render,
    split_sentences,
)
from rag.embed import embed_query
from rag.engines import Engines
from rag.guard import Verdict
from rag.guard import check as guard_check
from rag.rerank import rerank, scored_count
from rag.retrieve import BM25, Hit, retrieve
from rag.served import resolve
from rag.settings import Settings
from rag.store import Index

__all__ = ["Answer", "Pipeline"]


@dataclass
class Answer:
    """What `rag ask` produced, with everything needed to check it."""

    question: str
    text: str = ""  # as shown: each sentence with its attributed [n] or the unsupported mark
    sources: list[Source] = field(default_factory=list)  # shown to the model
    cited: list[Source] = field(default_factory=list)  # that support a sentence, in order of use
    sentences: list[Sentence] = field(default_factory=list)
    fallback: tuple[Source, str] | None = None  # (source, passage) shown when the answer rests on nothing
    hits: list[Hit] = field(default_factory=list)  # reranked candidates
    verdicts: list[Verdict] = field(default_factory=list)
    blocked: str | None = None  # "input" or "output" when the guard refused
    covered: bool = True
    timings: dict[str, float] = field(default_factory=dict)

    def fallback_note(self) -> str:
        """What is shown under an answer that rests on nothing: the passage that best covers
        the question ("" when there is none)."""
        if self.fallback is None:
            return ""
        src, passage = self.fallback
        where = src.path + (f" — {src.heading}" if src.heading else "")
        return (
            f"Most of this answer has no support in the sources. What the documents say, "
            f"[{src.n}] {where}:\n" + "\n".join(f"  > {line}" for line in passage.splitlines())
        )

    def tail(self) -> str:
        """What follows the answer's sentences for a reader: the refusal; or the fallback
        passage, what the unsupported mark means, and the sources the sentences cite."""
        if self.blocked:
            return self.refusal()
        parts = [self.fallback_note()] if self.fallback is not None else []
        if any(x.support in ("unsupported", "restates") for x in self.sentences):
            parts.append(f"{UNSUPPORTED}: no shown source supports that sentence")
        if self.cited:
            parts.append("Sources:\n" + format_sources(self.cited))
        elif self.covered:
            parts.append("(no source supports this answer) Retrieved:\n" + format_sources(self.sources))
        return "\n\n".join(parts)

    def refusal(self) -> str:
        """What a refused question or answer shows, naming the stage and the guard's reason."""
        what = "question" if self.blocked == "input" else "answer"
        verdict = next((v for v in self.verdicts if v.stage == self.blocked), None)
        why = verdict.why() if verdict else f"{self.blocked} stage"
        return f"refused: the guard blocked the {what} ({why})"


class _Clock:
    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings

    def __call__(self, stage: str) -> _Stage:
        return _Stage(self.timings, stage)


class _Stage:
    def __init__(self, timings: dict[str, float], stage: str) -> None:
        self.timings, self.stage = timings, stage

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.stage] = self.timings.get(self.stage, 0.0) + time.monotonic() - self.start


class Pipeline:
    """Search and ask over one index through one running stack."""

    def __init__(self, settings: Settings, client: Engines, index: Index) -> None:
        self.s = settings
        self.client = client
        self.index = index
        self._resolved = False

    def _settled(self) -> Settings:
        """The settings, with the guard format and rerank mode the server names where unset
        (asked once, on first use: lexical retrieval alone needs no server)."""
        if not self._resolved:
            self.s = resolve(self.s, self.client)
            self._resolved = True
        return self.s

    @property
    def bm25(self) -> BM25:
        return self.index.bm25

    def embed_query(self, query: str) -> np.ndarray:
        """The query's vector, after proving the index's embedding model is the one answering."""
        return embed_query(self.client.embed, self.index, self.s.embed_model, query)

    def retrieve(self, query: str, query_vec: np.ndarray | None, mode: str, k: int) -> list[Hit]:
        """Top-k candidates by `mode` (dense, lexical or fused)."""
        return retrieve(self.index.chunks, self.index.vectors, self.bm25, query, query_vec, mode, k)

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        """Rescore the candidates through /v1/score, ordered per the rerank mode (rag/rerank.py)."""
        return rerank(self.client.score, query, hits, self._settled().rerank_mode)

    def search(
        self,
        query: str,
        *,
        mode: str | None = None,
        rerank: bool = True,
        timings: dict[str, float] | None = None,
    ) -> list[Hit]:
        """Retrieval and rerank only: the ranked hits with their scores."""
        timings = {} if timings is None else timings
        clock = _Clock(timings)
        mode = mode or self.s.retrieval
        vec = None
        if mode != "lexical":
            with clock("embed"):
                vec = self.embed_query(query)
        with clock("retrieve"):
            hits = self.retrieve(query, vec, mode, self.s.top_k)
        if rerank and hits:
            # On CPU the reranker is the slowest stage of an answer: score no more than matters.
            n = scored_count(self._settled().rerank_mode, self.s.rerank_n, self.s.sources)
            with clock("rerank"):
                hits = self.rerank(query, hits[:n]) + hits[n:]
        return hits

    def guard(self, question: str, answer: str | None = None) -> Verdict:
        s = self._settled()
        return guard_check(
            self.client, s.guard_format, s.guard_model, question, answer,
            threshold=s.guard_threshold("input" if answer is None else "output"), strict=s.guard_strict,
        )  # fmt: skip

    def ask(
        self,
        question: str,
        *,
        history: Sequence[dict[str, str]] = (),
        on_text: Callable[[str], None] = lambda text: None,
        on_sentences: Callable[[Answer, list[Sentence]], None] = lambda answer, sentences: None,
    ) -> Answer:
        """Answer `question` from the index, guarded on both sides, citing numbered sources.

        Released text goes to `on_text` as shown (rendered with its [n] marks), and the
        same sentences, attributed, to `on_sentences` with the answer so far (its sources
        are set by then); either may raise to stop the answer (a client that went away)."""
        ans = Answer(question)
        clock = _Clock(ans.timings)
        with clock("guard_in"):
            v = self.guard(question)
        ans.verdicts.append(v)
        if not v.safe:
            ans.blocked = "input"
            return ans
        # A follow-up ("and what does it print?") means little alone: retrieve with the
        # previous question too. The model still sees the whole conversation.
        previous = [m["content"] for m in history if m.get("role") == "user"][-1:]
        ans.hits = self.search(" ".join([*previous, question]), timings=ans.timings)
        good = [h for h in ans.hits if (h.rerank if h.rerank is not None else h.score) >= self.s.min_score]
        good = good[: self.s.sources]
        if not good:
            ans.covered = False
            ans.text = NOT_COVERED
            on_text(ans.text)
            return ans
        ans.sources = sources_from(good)
        attributor = Attributor(
            question, ans.sources, np.stack([self.index.vectors[h.row] for h in good]),
            self.client.embed, self.bm25.idf, threshold=self.s.support_threshold,
        )  # fmt: skip
        messages = build_messages(question, ans.sources, history)
        shown = 0
        generated = ""
        start = time.monotonic()
        for piece in self.client.chat_stream(messages, max_tokens=self.s.max_tokens):
            if "chat_first_token" not in ans.timings:
                ans.timings["chat_first_token"] = time.monotonic() - start
            generated += piece
            end = release_point(generated, shown)
            if end > shown:
                if not self._release(ans, clock, generated[:end]):
                    return ans
                self._attribute(ans, clock, attributor, generated[shown:end], on_text, on_sentences)
                shown = end
        ans.timings["chat"] = (
            time.monotonic() - start - ans.timings.get("guard_out", 0.0) - ans.timings.get("attribute", 0.0)
        )
        if shown < len(generated.rstrip()):
            if not self._release(ans, clock, generated):
                return ans
            self._attribute(ans, clock, attributor, generated[shown:], on_text, on_sentences)
        ans.text = "".join(render(x) for x in ans.sentences).strip()
        by_n = {x.n: x for x in ans.sources}
        ans.cited = [by_n[n] for n in dict.fromkeys(n for x in ans.sentences for n in x.sources)]
        ans.covered = NOT_COVERED.rstrip(".") not in generated
        if ans.covered and needs_fallback(ans.sentences):
            ans.fallback = attributor.best_passage()
        return ans

    def _attribute(
        self,
        ans: Answer,
        clock: _Clock,
        attributor: Attributor,
        released: str,
        on_text: Callable[[str], None],
        on_sentences: Callable[[Answer, list[Sentence]], None],
    ) -> None:
        """Attribute the sentences just released and hand them on, rendered."""
        with clock("attribute"):
            sentences = attributor.attribute(split_sentences(released))
        ans.sentences += sentences
        on_text("".join(render(x) for x in sentences))
        on_sentences(ans, sentences)

    def _release(self, ans: Answer, clock: _Clock, text_so_far: str) -> bool:
        """Guard the answer so far; False (and blocked) if it is unsafe."""
        with clock("guard_out"):
            v = self.guard(ans.question, text_so_far)
        ans.verdicts = [x for x in ans.verdicts if x.stage == "input"] + [v]
        if not v.safe:
            ans.blocked = "output"
            ans.text = ""
            return False
        return True
