"""Attribution's pure parts: sentence units, the release point, rendering, the support rule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from rag.answer import Source
from rag.attribute import (
    THRESHOLD,
    UNSUPPORTED,
    Attributor,
    Sentence,
    early_point,
    names,
    needs_fallback,
    release_point,
    render,
    split_sentences,
)

ANSWER = (
    'Run `git commit -m msg` [1]. It records e.g. the staged tree. [2] Subjects start "fixup! " or '
    '"squash! " there. A wrapped line\n'
    "goes on here.\n- first item\n- second item\n\n```sh\ngit push. Now\n```\nDone [3]."
)


def test_sentences_keep_code_blocks_whole_and_move_markers_out() -> None:
    got = [(s.text, s.model_cited) for s in split_sentences(ANSWER)]
    assert got == [
        ("Run `git commit -m msg`.", (1,)),
        ("It records e.g. the staged tree.", (2,)),  # "e.g. the" does not end it; "[2]" after the stop is its
        ('Subjects start "fixup! " or "squash! " there.', ()),  # nor does a quoted "!"
        ("A wrapped line\ngoes on here.", ()),  # a single line break is wrapping, not an end
        ("- first item", ()),
        ("- second item", ()),
        ("```sh\ngit push. Now\n```", ()),  # ". N" inside the block does not split it
        ("Done.", (3,)),
    ]
    # nothing is lost: the units and their separators give back the text without markers
    assert "".join(s.text + s.sep for s in split_sentences(ANSWER)).replace("  ", " ") == (
        ANSWER.replace(" [1]", "").replace(" [2]", "").replace(" [3]", "")
    )


@pytest.mark.parametrize(
    ("text", "released"),
    [
        ("One sentence. Two", "One sentence. "),
        ("One sentence.", ""),  # the next sentence has not begun: a marker may still follow
        ("One sentence. [1", ""),  # ... and here it does
        ("One [1]. Two [2]. Thr", "One [1]. Two [2]. "),
        ("Use this:\n\n```sh\ngit add .\n", "Use this:\n\n"),  # an open block is held whole
        ("Use this:\n\n```sh\ngit add .\n```\nThen", "Use this:\n\n```sh\ngit add .\n```\n"),
    ],
)
def test_release_point_holds_what_may_still_change(text: str, released: str) -> None:
    assert text[: release_point(text, 0)] == released


@pytest.mark.parametrize(
    ("text", "early"),
    [
        ("The guard engine gets 0.40 of", "The guard engine gets "),
        ("The guard engine", ""),  # not yet four words
        ("Set `max_ongoing_requests` in every config", "Set `max_ongoing_requests` in every "),
        ("Set `max_ongoing_requests in every config", ""),  # an open code span may still change
        ("```sh\ngit add .\n", ""),  # a code block is shown whole
        ("See [1] for the guard", ""),  # a marker moves when the sentence is rendered
        ("It is 3. The guard said", ""),  # the first sentence has ended: released whole
        ("Use this:\nthe guard says no", ""),  # a line break may start a list or a block
    ],
)
def test_early_words_are_a_prefix_of_the_rendered_sentence(text: str, early: str) -> None:
    point = early_point(text, 4)
    assert text[:point] == early
    if point:  # however the sentence ends and whatever source it gets
        whole = split_sentences(text + " memory [2].")[0]
        assert render(replace(whole, sources=(1,), support="supported")).startswith(early.rstrip())


def test_render_puts_sources_before_the_stop_and_marks_the_unsupported() -> None:
    assert render(Sentence("It is 0.32.", " ", sources=(2, 1), support="supported")) == "It is 0.32 [2, 1]. "
    assert render(Sentence("It is 0.32.", support="unsupported")) == f"It is 0.32 {UNSUPPORTED}."
    assert render(Sentence("Here is how:", support="none-needed")) == "Here is how:"
    assert (
        render(Sentence("```sh\nls\n```", "\n", sources=(1,), support="supported")) == "```sh\nls\n```\n[1]\n"
    )


SOURCES = [
    Source(1, "a.md", "Memory", "The guard engine takes 0.40 of the card and the chat engine 0.32.", 1.0),
    Source(2, "b.md", "Ports", "Serve listens on port 8000 unless --port says otherwise.", 0.9),
]


def _attributor(question: str, dense: float = 0.0) -> Attributor:
    """An attributor whose dense score is a constant: the lexical half decides."""

    def embed(texts: Sequence[str]) -> np.ndarray:
        return np.tile(np.array([dense, np.sqrt(1 - dense**2)], dtype=np.float32), (len(texts), 1))

    vectors = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)  # cosine with each: `dense`
    return Attributor(question, SOURCES, vectors, embed, lambda term: 1.0)


def test_a_sentence_gets_the_source_that_holds_its_terms() -> None:
    out = _attributor("How much of the card does the guard get?", dense=0.6).attribute(
        split_sentences("The guard engine takes 0.40 of the card [2]. Serve listens on port 8000.")
    )
    assert out[0].sources == (1,) and out[0].support == "supported"  # the model's [2] was wrong
    assert out[0].model_cited == (2,) and out[0].scores[1] > THRESHOLD > out[0].scores[2]
    assert out[1].sources[0] == 2


def test_the_models_own_marker_stays_where_the_check_agrees() -> None:
    three = [*SOURCES, Source(3, "c.md", "", "The guard engine takes 0.40 of the card.", 0.8)]
    att = Attributor("What is configured?", three, np.eye(2, dtype=np.float32)[[0, 0, 0]],
                     lambda texts: np.tile(np.array([0.9, np.sqrt(0.19)], dtype=np.float32), (len(texts), 1)),
                     lambda term: 1.0)  # fmt: skip
    (s,) = att.attribute(split_sentences("The guard engine takes 0.40 of the card [3]."))
    # [1] and [3] hold the same words; the best two go first, and the model's [3] is one of them
    assert s.model_cited == (3,) and set(s.sources) == {1, 3}
    (s,) = att.attribute(split_sentences("The guard engine takes 0.40 of the card [2]."))
    assert 2 not in s.sources  # [2] says nothing of the kind: the model's marker goes


def test_no_supporting_source_is_said_and_a_restated_question_is_no_answer() -> None:
    att = _attributor("Which chat model runs on the GPU?")
    invented, echo, filler = att.attribute(
        split_sentences(
            "Bananas ripen quickly in warm kitchens. The chat model runs on the GPU. Here is how:"
        )
    )
    assert invented.support == "unsupported" and invented.sources == ()
    assert echo.support == "restates"
    assert filler.support == "none-needed" and not filler.is_claim  # nothing to back up
    assert needs_fallback([invented, echo, filler])  # 2 of 2 claims rest on nothing
    ok = Sentence("x", support="supported")
    assert not needs_fallback([ok, ok, invented]) and needs_fallback([ok, invented, echo])
    assert not needs_fallback([filler])  # no claims at all: nothing to replace


def test_best_passage_is_the_one_holding_the_question_terms() -> None:
    found = _attributor("Which port does Serve listen on?").best_passage()
    assert found is not None and found[0].n == 2 and "port 8000" in found[1]


def test_a_source_backs_no_sentence_that_names_what_it_lacks() -> None:
    """The 0.5B writes "The --exit-on-failure option ..." in the shape of its example and
    copies the rest from a source, which then scores as support: the name decides."""
    three = [*SOURCES, Source(3, "c.md", "", "Set tag.gpgsign and $RAG_PORT; see --keep-going.", 0.8)]
    vectors = np.eye(2, dtype=np.float32)[[0, 0, 0]]
    att = Attributor("What does the guard get?", three, vectors,
                     lambda texts: np.tile(np.array([0.9, np.sqrt(0.19)], dtype=np.float32), (len(texts), 1)),
                     lambda term: 1.0)  # fmt: skip
    made_up, held, case = att.attribute(
        split_sentences(
            "With --guard-share the guard engine takes 0.40 of the card and the chat engine 0.32 [1]. "
            "Set tag.gpgSign and see --keep-going [3]. The $RAG_PORT variable and $PATH are read [3]."
        )
    )
    assert made_up.support == "unsupported" and made_up.sources == ()
    assert made_up.unsourced == ("--guard-share",)
    assert made_up.scores[1] > THRESHOLD  # as alike as ever: only the missing name withholds [1]
    assert held.sources == (3,) and held.unsourced == ()  # a setting's key in any case, as git reads it
    assert case.sources == () and case.unsourced == ("$PATH",)  # a variable as written: PATH is nowhere
    assert names("Use --no-ff, not -n, e.g. in foo.txt or color.blame.repeatedLines and ${HOME}.") == {
        "--no-ff", "color.blame.repeatedLines", "$HOME",
    }  # fmt: skip
