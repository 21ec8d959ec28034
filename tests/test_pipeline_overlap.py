"""The query path's overlapped stages hold back what they must (rag/pipeline.py).

The input guard runs beside retrieval and generation; in floor mode the reranker runs
beside the chat where the server allows it (overlap: its chat and reranker fit the
cores together), before it otherwise; in mode `off` it is not called. Either way the
first words of an answer are shown before its first sentence ends.
Whether a verdict arrives before or after the chat's first sentence is a matter of
timing a real stack cannot be made to produce on demand, so these engines are fakes
whose delays decide it; tests/test_rag_e2e.py runs the same path on the real stack.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag.answer import EXAMPLE, Source, echoes_example
from rag.chunk import Chunk, Chunker
from rag.engines import Usage
from rag.guard import NO_REPLY
from rag.pipeline import EARLY_WORDS, Pipeline
from rag.settings import Settings
from rag.store import PROBE, load_index, write_index

ANSWER = "The exit code is 3 when the guard refuses [1]. It is documented in the guard page [2]."
QUESTION = "what exit code does a refusal use"


class Engines:
    """Fake engines: the guard's input verdict after `guard_s`, the reranker's scores after
    `score_s`; the chat streams ANSWER a word at a time, each step logged."""

    def __init__(self, *, unsafe_input: bool = False, guard_s: float = 0.0, score_s: float = 0.0,
                 scores: Sequence[float] = (0.9, 0.9, 0.9), answer: str = ANSWER) -> None:  # fmt: skip
        self.unsafe_input, self.guard_s, self.score_s, self.scores = unsafe_input, guard_s, score_s, scores
        self.answer = answer
        self.events: list[str] = []
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def log(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def embed(self, texts: Sequence[str], batch_size: int = 32, workers: int = 4) -> np.ndarray:
        return np.array([[0, 1, 0, 0] if t == PROBE else [1, 0, 0, 0] for t in texts], dtype=np.float32)

    def score(self, query: str, documents: Sequence[str], model: str | None = None) -> list[float]:
        if model == "guard":
            if documents == [NO_REPLY]:
                time.sleep(self.guard_s)
                self.log("guard_in")
                return [0.99 if self.unsafe_input else 0.01]
            self.log(f"guard_out:{len(documents[0].split())}")
            return [0.01]
        time.sleep(self.score_s)
        self.log("scored")
        return list(self.scores[: len(documents)])

    def chat(
        self, messages: Sequence[dict[str, str]], *, model: str | None = None, max_tokens: int = 512
    ) -> str:
        raise AssertionError("a score-format guard never chats")

    def chat_stream(
        self, messages: Sequence[dict[str, str]], *, max_tokens: int = 512, usage: Usage | None = None
    ) -> Iterator[str]:
        self.prompts.append(messages[-1]["content"])
        self.log("chat")
        for i, word in enumerate(self.answer.split(" ")):
            time.sleep(0.01)
            yield word if i == 0 else " " + word
        if usage is not None:  # as the engine's last chunk reports it
            usage.add({"prompt_tokens": len(str(messages).split()), "completion_tokens": i + 1})

    def facts(self) -> Mapping[str, Mapping[str, Any]]:
        return {}


@pytest.fixture
def index_dir(tmp_path: Path) -> Path:
    texts = ["Refusals exit with code 3.", "The guard page documents it.", "Ports and hosts."]
    chunks = [Chunk(f"c{i}", f"doc{i}.md", "t", "", t) for i, t in enumerate(texts)]
    vectors = np.array([[1, 0, 0, 0], [0.9, 0.1, 0, 0], [0.8, 0.2, 0, 0]], dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    write_index(
        tmp_path, chunks, vectors, "embed", np.array([0, 1, 0, 0], dtype=np.float32), {}, ".", Chunker()
    )
    return tmp_path


def _pipeline(index_dir: Path, engines: Engines, overlap: bool = True, mode: str = "floor") -> Pipeline:
    s = dataclasses.replace(
        Settings.from_env(), index_dir=index_dir, guard_format="score", rerank_mode=mode,
        guard_input_threshold=0.5, guard_output_threshold=0.5, retrieval="dense", min_score=0.5,
        overlap=overlap,
    )  # fmt: skip
    return Pipeline(s, engines, load_index(index_dir))


def _ask(pipe: Pipeline, engines: Engines) -> tuple[Any, list[str]]:
    shown: list[str] = []

    def on_text(text: str) -> None:
        engines.log(f"shown:{text}")
        shown.append(text)

    return pipe.ask(QUESTION, on_text=on_text), shown


def test_a_question_the_guard_refuses_late_shows_nothing_though_generation_had_begun(index_dir: Path) -> None:
    engines = Engines(unsafe_input=True, guard_s=0.4)
    a, shown = _ask(_pipeline(index_dir, engines), engines)
    assert a.blocked == "input" and shown == [] and a.text == ""
    assert engines.events.index("chat") < engines.events.index("guard_in")  # it did overlap
    assert not any(e.startswith("guard_out") for e in engines.events)


def test_nothing_is_shown_before_the_input_verdict_and_the_scores_are_in(index_dir: Path) -> None:
    engines = Engines(guard_s=0.3, score_s=0.3)
    a, shown = _ask(_pipeline(index_dir, engines), engines)
    assert a.blocked is None and [s.n for s in a.sources] == [1, 2, 3]
    first = next(i for i, e in enumerate(engines.events) if e.startswith("shown:"))
    assert {"guard_in", "scored"} <= set(engines.events[:first])
    assert engines.events[first - 1] == f"guard_out:{EARLY_WORDS}"  # the early words were guarded
    assert shown[0] == "The exit code is " and "".join(shown).strip() == a.text
    assert a.text.startswith("The exit code is 3 when the guard refuses [1].")


def test_when_the_floor_drops_a_source_the_answer_starts_again_from_those_that_pass(index_dir: Path) -> None:
    engines = Engines(score_s=0.2, scores=(0.9, 0.1, 0.9))
    a, shown = _ask(_pipeline(index_dir, engines), engines)
    assert engines.events.count("chat") == 2  # the guess from all three, then the two that pass
    assert "[2] doc1.md" in engines.prompts[0] and "doc1.md" not in engines.prompts[1]
    assert [s.path for s in a.sources] == ["doc0.md", "doc2.md"]
    assert "".join(shown).strip() == a.text  # nothing of the first attempt was shown
    assert not any(e.startswith("shown:") for e in engines.events[: engines.events.index("chat", 2)])


def test_when_no_source_passes_the_floor_it_says_so_and_generates_nothing_shown(index_dir: Path) -> None:
    engines = Engines(scores=(0.1, 0.1, 0.1))
    a, shown = _ask(_pipeline(index_dir, engines), engines)
    assert not a.covered and shown == ["The indexed documents do not cover this question."]
    assert engines.events.count("chat") == 1  # only the guess, never shown


def test_without_overlap_the_chat_waits_for_the_scores_and_the_first_words_still_come_early(
    index_dir: Path,
) -> None:
    engines = Engines(guard_s=0.1, score_s=0.1, scores=(0.9, 0.1, 0.9))
    a, shown = _ask(_pipeline(index_dir, engines, overlap=False), engines)
    assert engines.events[:3] == ["guard_in", "scored", "chat"]  # one chat: from the two that pass
    assert [s.path for s in a.sources] == ["doc0.md", "doc2.md"]
    assert shown[0] == "The exit code is " and engines.events[3] == f"guard_out:{EARLY_WORDS}"
    assert "".join(shown).strip() == a.text


@pytest.mark.parametrize("overlap", [True, False])
def test_in_mode_off_the_reranker_is_never_called_and_no_floor_drops_a_source(
    index_dir: Path, overlap: bool
) -> None:
    engines = Engines(guard_s=0.3, scores=(0.1, 0.1, 0.1))  # would all fall below the floor
    a, shown = _ask(_pipeline(index_dir, engines, overlap=overlap, mode="off"), engines)
    assert "scored" not in engines.events and "rerank" not in a.timings
    assert a.covered and [s.path for s in a.sources] == ["doc0.md", "doc1.md", "doc2.md"]
    assert engines.events.count("chat") == 1
    # With or without the reranker's overlap, the chat starts before the input verdict
    # (nothing else would run beside it); nothing is shown before that verdict.
    chat, verdict = engines.events.index("chat"), engines.events.index("guard_in")
    assert chat < verdict
    first = next(i for i, e in enumerate(engines.events) if e.startswith("shown:"))
    assert verdict < first and engines.events[first - 1] == f"guard_out:{EARLY_WORDS}"
    assert "".join(shown).strip() == a.text


def test_in_mode_off_a_question_refused_late_shows_nothing(index_dir: Path) -> None:
    engines = Engines(unsafe_input=True, guard_s=0.4)
    a, shown = _ask(_pipeline(index_dir, engines, mode="off"), engines)
    assert a.blocked == "input" and shown == [] and a.text == ""
    assert engines.events.index("chat") < engines.events.index("guard_in")


EXAMPLE_ANSWER = EXAMPLE[-1]["content"]


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        (EXAMPLE_ANSWER, ""),  # the whole answer is the worked example, word for word
        # The example's option, named early: nothing of it goes out, not even early words.
        ("The --keep-logs option keeps them [1]. Refusals exit with code 3 [1].", ""),
        # A right first sentence, then the example: the first stands, the echo is cut.
        (f"Refusals exit with code 3 [1]. {EXAMPLE_ANSWER}", "Refusals exit with code 3 [1]."),
        # The echo ends the answer, after the last release point.
        (f"Refusals exit with code 3 [1]. It is {EXAMPLE_ANSWER[4:]}", "Refusals exit with code 3 [1]."),
    ],
)
def test_the_worked_example_never_reaches_the_user(index_dir: Path, answer: str, kept: str) -> None:
    engines = Engines(answer=answer)
    a, shown = _ask(_pipeline(index_dir, engines, mode="off"), engines)
    assert a.echoed and a.text == kept and "".join(shown).strip() == kept
    for text in (*shown, a.text, a.tail()):
        assert not echoes_example(text, []), text
    assert a.fallback is not None  # instead: the passage that best covers the question, quoted
    note = a.fallback_note()
    assert note.startswith("No answer" if not kept else "Most of this answer")
    assert f"[{a.fallback[0].n}] {a.fallback[0].path}" in note


def test_an_answer_that_shares_words_with_its_sources_is_no_echo() -> None:
    # The example's words are an echo only where no shown source holds them.
    source = Source(1, "app.html", "", "Keep the log files after a successful run with --keep-logs.", 1.0)
    assert echoes_example("The --keep-logs option keeps the log files after a successful run.", [source])
    assert not echoes_example("Use --keep-logs: it will keep the log files after a successful run.", [source])
    assert not echoes_example("Refusals exit with code 3 [1].", [])


def test_an_option_no_source_holds_is_unbacked_and_said_under_the_answer(index_dir: Path) -> None:
    engines = Engines(answer="The --exit-on-failure option stops the run at the first refusal [1].")
    a, _ = _ask(_pipeline(index_dir, engines, mode="off"), engines)
    (s,) = a.sentences
    assert s.support == "unsupported" and s.unsourced == ("--exit-on-failure",)
    assert a.fallback is not None  # its one claim rests on nothing: the best passage follows
    assert "--exit-on-failure: in none of the sources" in a.tail()
    engines = Engines(answer="Refusals exit with code 3 [1]. Pass --exit-on-failure to stop at once [1].")
    a, _ = _ask(_pipeline(index_dir, engines, mode="off"), engines)
    assert [x.support for x in a.sentences] == ["supported", "unsupported"]
    assert a.fallback is not None and a.fallback_note().startswith("Part of this answer")


def test_an_answer_in_a_loop_stops_at_its_first_repeat(index_dir: Path) -> None:
    again = "The trap command is run once for each child that exits. "
    engines = Engines(answer=f"Refusals exit with code 3 [1]. {again}{again}{again}Short. Short. Done.")
    a, shown = _ask(_pipeline(index_dir, engines, mode="off"), engines)
    assert a.looped and a.text.count("The trap command") == 1 and "Done" not in a.text
    assert "".join(shown).strip() == a.text  # what was shown is what the answer holds
