"""The query path, top-down: guard in -> embed -> retrieve -> rerank -> answer -> guard out
-> attribute, each stage in its own module (rag/guard.py, rag/embed.py, rag/retrieve.py,
rag/rerank.py, rag/answer.py, rag/attribute.py); this one runs them in order and times them.

The answer streams, but no text reaches the caller before the guard has seen
it: generated text is held back a sentence at a time and released once the
guard has passed the answer so far; only the first sentence's first EARLY_WORDS
words go out ahead of its end, guarded the same way, so the first word comes
while the first sentence is still being written. The input guard runs beside
retrieval and generation, and in floor mode, where the server's chat and reranker
fit its cores together (Settings.overlap), so does the reranker; nothing is shown
before the verdicts are in. In mode `off` (the CPU reranker, whose scores tell
nothing: rag/served.py) the reranker is not called.

Each released sentence is then attributed (rag/attribute.py): it goes out carrying
the sources that support it, or marked as having none. An answer most of whose
claims rest on nothing is followed by the passage of the sources that best covers
the question (`Answer.fallback`).

Over 300 lines because the release loop and what it waits on (`_Pending`, the
speculative start) are one piece of logic about what may be shown when.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from rag.answer import NOT_COVERED, Source, build_messages, echoes_example, format_sources, sources_from
from rag.attribute import (
    UNSUPPORTED,
    Attributor,
    Sentence,
    early_point,
    needs_fallback,
    release_point,
    render,
    split_sentences,
)
from rag.embed import embed_query
from rag.engines import Engines, Usage
from rag.focus import focus
from rag.guard import Verdict
from rag.guard import check as guard_check
from rag.rerank import rerank, scored_count
from rag.retrieve import BM25, Hit, retrieve
from rag.served import resolve
from rag.settings import Settings
from rag.store import Index

__all__ = ["EARLY_WORDS", "Answer", "Pipeline"]

T = TypeVar("T")


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
    echoed: bool = False  # the model wrote the prompt's worked example: withheld from here on
    looped: bool = False  # the model began a sentence it had written already: stopped there
    usage: Usage = field(default_factory=Usage)  # the chat engine's tokens, every attempt
    timings: dict[str, float] = field(default_factory=dict)

    def fallback_note(self) -> str:
        """What is shown under an answer that rests on nothing, or instead of one that was
        withheld: the passage that best covers the question ("" when there is none)."""
        if self.fallback is None:
            return ""
        src, passage = self.fallback
        where = src.path + (f" — {src.heading}" if src.heading else "")
        lead = (
            "No answer could be written from the sources."
            if not self.sentences
            else "Most of this answer has no support in the sources."
            if self.echoed or needs_fallback(self.sentences)
            else "Part of this answer has no support in the sources."
        )
        return f"{lead} What the documents say, [{src.n}] {where}:\n" + "\n".join(
            f"  > {line}" for line in passage.splitlines()
        )

    def tail(self) -> str:
        """What follows the answer's sentences for a reader: the refusal; or the fallback
        passage, what the unsupported mark means, and the sources the sentences cite."""
        if self.blocked:
            return self.refusal()
        parts = [self.fallback_note()] if self.fallback is not None else []
        if any(x.support in ("unsupported", "restates") for x in self.sentences):
            parts.append(f"{UNSUPPORTED}: no shown source supports that sentence")
        if invented := sorted({n for x in self.sentences for n in x.unsourced}):
            parts.append(f"{', '.join(invented)}: in none of the sources; check before relying on it")
        if self.cited:
            parts.append("Sources:\n" + format_sources(self.cited))
        elif self.covered and self.sentences:
            parts.append("(no source supports this answer) Retrieved:\n" + format_sources(self.sources))
        return "\n\n".join(parts)

    def refusal(self) -> str:
        """What a refused question or answer shows, naming the stage and the guard's reason."""
        what = "question" if self.blocked == "input" else "answer"
        verdict = next((v for v in self.verdicts if v.stage == self.blocked), None)
        why = verdict.why() if verdict else f"{self.blocked} stage"
        return f"refused: the guard blocked the {what} ({why})"


# The first sentence's first words are shown once this many have been generated (and
# guarded) rather than when the sentence ends: on CPU a sentence takes 1-3 s to generate.
EARLY_WORDS = 4


# A small model at temperature 0 can fall into a loop, writing the same sentences until
# max_tokens (3 of 71 answers over the Git and bash manuals, 20-27 s each). A sentence of
# this many characters written a second time ends the answer there; shorter ones ("See
# below.") may well recur.
LOOP_CHARS = 24


def _said(text: str) -> str:
    """A sentence as compared for repeats: its words, lower-cased."""
    return " ".join(text.lower().split())


def _background(timings: dict[str, float], stage: str, fn: Callable[..., T], *args: Any) -> Future[T]:
    """fn(*args) on a thread of its own, its seconds recorded under `stage` when it ends.

    A daemon thread, not a pool's: a call an answer no longer waits for (the reranker
    after the guard refused) must not keep the process from exiting while it waits out
    an engine's read timeout, as a ThreadPoolExecutor's workers would at interpreter exit."""
    future: Future[T] = Future()

    def run() -> None:
        start = time.monotonic()
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to whoever waits on the future
            timings[stage] = timings.get(stage, 0.0) + time.monotonic() - start
            future.set_exception(exc)
            return
        timings[stage] = timings.get(stage, 0.0) + time.monotonic() - start  # before it is seen
        future.set_result(result)

    threading.Thread(target=run, name=f"rag-{stage}", daemon=True).start()
    return future


@dataclass
class _Pending:
    """Verdicts an answer may run ahead of: the input guard's, and the reranker's scores."""

    guard_in: Future[Verdict]
    scored: Future[list[Hit]] | None = None
    rest: list[Hit] = field(default_factory=list)  # the candidates not scored
    judged: bool = False
    done: bool = False

    def admitted(self, ans: Answer) -> bool:
        """Wait for the input guard; False, and the answer blocked, if it refused the question."""
        v = self.guard_in.result()
        if not self.judged:
            ans.verdicts.insert(0, v)
            self.judged = True
        if not v.safe:
            ans.blocked = "input"
        return v.safe

    def settle(self, ans: Answer) -> bool:
        """Wait for both verdicts (the answer's hits set from the scores); False if refused."""
        if not self.admitted(ans):
            return False
        if not self.done:
            ans.hits = (self.scored.result() if self.scored is not None else []) + self.rest
            self.done = True
        return True


@dataclass(frozen=True)
class _Hooks:
    """Where an answer's released text goes (Pipeline.ask's callbacks)."""

    text: Callable[[str], None]
    sentences: Callable[[Answer, list[Sentence]], None]
    early: Callable[[str], None]
    instructions: str = ""  # the caller's, after the pipeline's own (rag/answer.py)


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
        instructions: str = "",
        on_text: Callable[[str], None] = lambda text: None,
        on_sentences: Callable[[Answer, list[Sentence]], None] = lambda answer, sentences: None,
        on_early: Callable[[str], None] = lambda words: None,
    ) -> Answer:
        """Answer `question` from the index, guarded on both sides, citing numbered sources.

        Released text goes to `on_text` as shown (rendered with its [n] marks; the first
        sentence may come in two pieces, its first words early), and the same sentences,
        attributed, to `on_sentences` with the answer so far (its sources are set by
        then); the first words shown early go to `on_early` too (a prefix of the first
        sentence as rendered). Any of them may raise to stop the answer (a client that
        went away). `instructions` (a caller's system message) go to the chat model after
        the pipeline's own, and to the input guard with the question."""
        ans = Answer(question)
        hooks = _Hooks(on_text, on_sentences, on_early, instructions)
        overlap = bool(self._settled().overlap)
        # The input guard (0.1 s on CPU) runs beside retrieval and generation; nothing is
        # shown before its verdict. The reranker runs beside the chat only where the
        # server's chat and reranker fit its cores together (`overlap`, rag/served.py):
        # sharing cores, they only slowed each other down.
        asked = f"{instructions.strip()}\n\n{question}" if instructions.strip() else question
        pending = _Pending(_background(ans.timings, "guard_in", self.guard, asked))
        # A follow-up ("and what does it print?") means little alone: retrieve with the
        # previous question too. The model still sees the whole conversation.
        previous = [m["content"] for m in history if m.get("role") == "user"][-1:]
        query = " ".join([*previous, question])
        hits = self.search(query, rerank=False, timings=ans.timings)
        mode = self.s.rerank_mode
        # Mode `off`: the reranker's scores could change nothing, so it is not called.
        n = scored_count(mode, self.s.rerank_n, self.s.sources) if hits and mode != "off" else 0
        if n:
            pending.scored = _background(ans.timings, "rerank", self.rerank, query, hits[:n])
        pending.rest = hits[n:]
        if hits and (mode == "off" or (overlap and mode == "floor")):
            # The retrieval order stands: generate from the top candidates while the
            # verdicts come in, and start again only if the floor drops one of them.
            if self._answer(ans, hits[: self.s.sources], history, hooks, pending):
                return ans
            ans.timings.pop("chat_first_token", None)
        if pending.settle(ans):
            self._answer(ans, self._good(ans.hits), history, hooks, None)
        return ans

    def _good(self, hits: Sequence[Hit]) -> list[Hit]:
        """The candidates above the relevance floor that may become sources (in mode `off`
        there is no floor: the top ones). A candidate the reranker did not score is not one:
        its retrieval score (RRF's ~0.016) means nothing against a floor of rerank scores."""
        if self.s.rerank_mode == "off":
            return list(hits[: self.s.sources])
        good = [h for h in hits if h.rerank is not None and h.rerank >= self.s.floor]
        return good[: self.s.sources]

    def _answer(
        self,
        ans: Answer,
        good: list[Hit],
        history: Sequence[dict[str, str]],
        hooks: _Hooks,
        pending: _Pending | None,
    ) -> bool:
        """Generate from `good` and release it sentence by sentence, guarded and attributed.

        With `pending` verdicts (the input guard, the reranker's scores), generation starts
        before they are in and waits for them before it shows anything; False, with
        nothing shown, when the scores change the sources (the caller starts again)."""

        def settled() -> bool | None:  # True: go on; False: start again; None: refused
            if pending is None or pending.done:
                return True
            if not pending.settle(ans):
                return None
            return [h.row for h in self._good(ans.hits)] == [h.row for h in good]

        on_text, on_sentences, on_early = hooks.text, hooks.sentences, hooks.early
        if not good:
            if pending is not None and settled() is None:
                return True
            ans.covered = False
            ans.text = NOT_COVERED
            on_text(ans.text)
            return True
        clock = _Clock(ans.timings)
        # The model reads each source focused on the question (rag/focus.py); a sentence is
        # checked against the whole chunk, which backs a claim whatever part of it was cut.
        whole = sources_from(good)
        sources = focus(whole, ans.question, self.bm25.idf, self.s.source_chars)
        attributor = Attributor(
            ans.question, whole, np.stack([self.index.vectors[h.row] for h in good]),
            self.client.embed, self.bm25.idf, threshold=self.s.support_threshold,
        )  # fmt: skip
        messages = build_messages(ans.question, sources, history, hooks.instructions)
        shown, early = 0, ""  # released up to `shown`; the first words shown ahead of it
        generated = ""
        start = time.monotonic()
        stream = self.client.chat_stream(messages, max_tokens=self.s.max_tokens, usage=ans.usage)
        try:
            for piece in stream:
                ans.timings.setdefault("chat_first_token", time.monotonic() - start)
                generated += piece
                end = release_point(generated, shown)
                first_words = 0 if end > shown or shown or early else early_point(generated, EARLY_WORDS)
                if end <= shown and not first_words:
                    continue
                if echoes_example(generated[shown : max(end, first_words)], sources):
                    ans.echoed = True  # what follows is the example's text: none of it is shown
                    break
                if (ok := settled()) is not True:
                    return ok is None
                ans.sources = sources
                if not self._release(ans, clock, generated[: max(end, first_words)]):
                    return True
                if first_words:
                    early = generated[:first_words].lstrip()
                    on_text(early)
                    on_early(early)
                    continue
                self._attribute(ans, clock, attributor, generated[shown:end], on_text, on_sentences, early)
                shown, early = end, ""
                if ans.looped:
                    break
        finally:
            getattr(stream, "close", lambda: None)()  # a stopped answer frees its place in the batch
        ans.timings["chat"] = (
            time.monotonic() - start - ans.timings.get("guard_out", 0.0) - ans.timings.get("attribute", 0.0)
        )
        if (ok := settled()) is not True:
            return ok is None
        ans.sources = sources
        if not ans.echoed and echoes_example(generated[shown:], sources):
            ans.echoed = True
        if shown < len(generated.rstrip()) and not (ans.echoed or ans.looped):
            if not self._release(ans, clock, generated):
                return True
            self._attribute(ans, clock, attributor, generated[shown:], on_text, on_sentences, early)
        ans.text = "".join(render(x) for x in ans.sentences).strip()
        by_n = {x.n: x for x in ans.sources}
        ans.cited = [by_n[n] for n in dict.fromkeys(n for x in ans.sentences for n in x.sources)]
        ans.covered = NOT_COVERED.rstrip(".") not in generated
        # An answer that names what no source holds sends the reader to the documents too.
        invents = any(x.unsourced for x in ans.sentences)
        if ans.covered and (ans.echoed or invents or needs_fallback(ans.sentences)):
            ans.fallback = attributor.best_passage()
        return True

    def _attribute(
        self,
        ans: Answer,
        clock: _Clock,
        attributor: Attributor,
        released: str,
        on_text: Callable[[str], None],
        on_sentences: Callable[[Answer, list[Sentence]], None],
        early: str = "",
    ) -> None:
        """Attribute the sentences just released and hand them on, rendered (less the
        `early` words of the first one, already shown); none from the first that repeats
        one written before (`ans.looped`)."""
        units = split_sentences(released)
        seen = {_said(x.text) for x in ans.sentences}
        for i, x in enumerate(units):
            if len(x.text) >= LOOP_CHARS and _said(x.text) in seen:
                units, ans.looped = units[:i], True
                break
            seen.add(_said(x.text))
        if not units:
            return
        with clock("attribute"):
            sentences = attributor.attribute(units)
        ans.sentences += sentences
        text = "".join(render(x) for x in sentences)
        on_text(text[len(early) :] if early and text.startswith(early) else text)
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
