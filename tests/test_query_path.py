"""Pure parts of the query path: BM25, fusion, prompts, citations, guard verdicts, error mapping."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rag.answer import NOT_COVERED, Source, build_messages, format_sources, sources_from
from rag.attribute import strip_markers
from rag.chunk import Chunk
from rag.guard import check, parse_llamaguard3, parse_qwen3guard
from rag.rerank import rerank, scored_count
from rag.retrieve import BM25, Hit, _top, dense, rrf


def _chunk(cid: str, text: str, path: str = "a.md") -> Chunk:
    return Chunk(id=cid, path=path, title="", heading="", text=text)


CHUNKS = [
    _chunk("c1", "Set max_ongoing_requests above max_num_seqs on every config."),
    _chunk("c2", "The guard takes 0.40 of the card; chat takes 0.32."),
    _chunk("c3", "Bananas are yellow and rich in potassium."),
]


def test_bm25_prefers_exact_rare_terms() -> None:
    hits = BM25(CHUNKS).top("what is max_ongoing_requests for?", 3)
    assert hits[0].chunk.id == "c1" and hits[0].lexical and hits[0].lexical > 0
    assert all(h.chunk.id != "c3" for h in hits)  # no shared term, no hit
    assert BM25(CHUNKS).top("the of and", 3) == []  # stop words alone match nothing


def test_dense_ranks_by_cosine() -> None:
    vectors = np.eye(3, dtype=np.float32)
    hits = dense(CHUNKS, vectors, np.array([0.1, 0.9, 0.0], dtype=np.float32), 2)
    assert [h.chunk.id for h in hits] == ["c2", "c1"] and hits[0].dense == pytest.approx(0.9)


def _full_sort(scores: np.ndarray) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def test_top_k_is_a_full_sort_cut_to_k_with_ties_in_index_order() -> None:
    scores = np.random.default_rng(0).integers(0, 50, 2_000).astype(np.float32)  # many ties
    full = _full_sort(scores)
    kth = scores[full[19]]
    top = _top(scores, 20)
    # members tied with the 20th score may be any of them; the rest and the order are fixed
    assert [scores[i] for i in top] == [scores[i] for i in full[:20]]
    assert [i for i in top if scores[i] > kth] == [i for i in full[:20] if scores[i] > kth]
    assert all(a < b for a, b in itertools.pairwise(top) if scores[a] == scores[b])
    assert _top(scores[:5], 20) == _full_sort(scores[:5]) and _top(scores, 0) == []


def test_rrf_rewards_agreement_and_keeps_both_scores() -> None:
    a = [Hit(CHUNKS[0], 0.9, dense=0.9), Hit(CHUNKS[1], 0.8, dense=0.8)]
    b = [Hit(CHUNKS[1], 5.0, lexical=5.0), Hit(CHUNKS[2], 1.0, lexical=1.0)]
    fused = rrf([a, b], k=60)
    assert [h.chunk.id for h in fused] == ["c2", "c1", "c3"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert (fused[0].dense, fused[0].lexical) == (0.8, 5.0)


def test_rerank_modes_order_floor_blend_and_off() -> None:
    retrieved = [Hit(c, 1.0 - i / 10) for i, c in enumerate(CHUNKS)]  # c1, c2, c3
    given = {"c1": 0.2, "c2": 0.9, "c3": 0.5}

    def score(query: str, documents: list[str]) -> list[float]:
        by_text = {c.embed_text: given[c.id] for c in CHUNKS}
        return [by_text[d] for d in documents]

    def ids(mode: str) -> list[str]:
        return [h.chunk.id for h in rerank(score, "q", retrieved, mode)]

    assert ids("order") == ["c2", "c3", "c1"]
    assert ids("floor") == ["c1", "c2", "c3"]
    assert ids("blend") == ["c2", "c1", "c3"]  # c2: 1/62 + 1/61 beats c1: 1/61 + 1/63
    assert [h.rerank for h in rerank(score, "q", retrieved, "floor")] == [0.2, 0.9, 0.5]
    assert ids("off") == ["c1", "c2", "c3"]  # scored when asked (rag search), never reordered
    assert [h.rerank for h in rerank(score, "q", retrieved, "off")] == [0.2, 0.9, 0.5]
    counts = [scored_count(m, rerank_n=8, sources=3) for m in ("floor", "off", "order", "blend")]
    assert counts == [3, 3, 8, 8]
    with pytest.raises(ValueError, match="order, blend, floor, off"):
        rerank(score, "q", retrieved, "best")


SOURCES = [Source(1, "gpu.md", "Memory", "guard 0.40", 0.9), Source(2, "cpu.md", "", "17 GiB", 0.5)]


def test_prompt_numbers_sources_and_puts_history_before_the_question() -> None:
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    msgs = build_messages("How much for the guard?", SOURCES, history)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert NOT_COVERED in msgs[0]["content"]
    assert msgs[3:5] == history
    last = msgs[-1]["content"]
    assert "[1] gpu.md (Memory)\nguard 0.40" in last and "[2] cpu.md\n17 GiB" in last
    assert last.endswith("Question: How much for the guard?")
    assert strip_markers(msgs[2]["content"])[1] == (1,)  # the example cites as we parse


def test_markers_are_read_in_order_of_first_use() -> None:
    answer = "The guard takes 0.40 [1]. The CPU needs 17 GiB [2][1]. Also [7] and [1, 2]."
    assert strip_markers(answer) == ("The guard takes 0.40. The CPU needs 17 GiB. Also and.", (1, 2, 7))
    assert strip_markers("no markers at all") == ("no markers at all", ())
    assert format_sources(SOURCES) == "[1] gpu.md — Memory\n[2] cpu.md"


def test_sources_are_numbered_in_rank_order() -> None:
    hits = [Hit(CHUNKS[1], 0.7), Hit(CHUNKS[0], 0.6)]
    assert [(s.n, s.text) for s in sources_from(hits)] == [(1, CHUNKS[1].text), (2, CHUNKS[0].text)]


@pytest.mark.parametrize(
    ("reply", "strict", "safe", "label", "cats"),
    [
        ("Safety: Safe\nCategories: None", False, True, "safe", ()),
        ("Safety: Unsafe\nCategories: Violent, Non-violent Illegal Acts", False, False, "unsafe",
         ("Violent", "Non-violent Illegal Acts")),
        ("Safety: Controversial\nCategories: Politically Sensitive Topics", False, True, "controversial",
         ("Politically Sensitive Topics",)),
        ("Safety: Controversial\nCategories: Politically Sensitive Topics", True, False, "controversial",
         ("Politically Sensitive Topics",)),
        ("I cannot decide.", False, False, "unparseable", ()),
        # the output-moderation reply adds a Refusal line; case and spacing vary
        ("Safety: Unsafe\nCategories: Jailbreak\nRefusal: No", False, False, "unsafe", ("Jailbreak",)),
        ("safety:  safe\ncategories: none\nrefusal: yes", True, True, "safe", ()),
        ("Safety: Unsafe\nCategories: PII,  Violent ,", False, False, "unsafe", ("PII", "Violent")),
    ],
)  # fmt: skip
def test_qwen3guard_verdicts(reply: str, strict: bool, safe: bool, label: str, cats: tuple[str, ...]) -> None:
    v = parse_qwen3guard(reply, "output", strict=strict)
    assert (v.stage, v.safe, v.label, v.categories) == ("output", safe, label, cats)


# Llama Guard 3's replies in the shape its model card gives ("safe", or "unsafe" and the
# violated categories' codes on the next line); the generation may start with blank lines.
@pytest.mark.parametrize(
    ("reply", "safe", "label", "cats"),
    [
        ("safe", True, "safe", ()),
        ("\n\nsafe", True, "safe", ()),
        ("unsafe\nS1", False, "unsafe", ("S1 Violent Crimes",)),
        ("\n\nunsafe\nS4,S10", False, "unsafe", ("S4 Child Sexual Exploitation", "S10 Hate")),
        ("unsafe\nS11, S99", False, "unsafe", ("S11 Suicide & Self-Harm", "S99")),
        ("unsafe", False, "unsafe", ()),
        ("Safe.", False, "unparseable", ()),  # not its format: fail closed
        ("", False, "unparseable", ()),
    ],
)  # fmt: skip
def test_llamaguard3_verdicts(reply: str, safe: bool, label: str, cats: tuple[str, ...]) -> None:
    v = parse_llamaguard3(reply, "input")
    assert (v.stage, v.safe, v.label, v.categories) == ("input", safe, label, cats)
    assert v.why().startswith("input stage, " + label.capitalize())


class FakeGuard:
    def __init__(self, p: float = 0.0, reply: str = "") -> None:
        self.p, self.reply = p, reply
        self.seen: list[object] = []

    def score(self, query: str, documents: list[str], model: str | None = None) -> list[float]:
        self.seen.append((query, documents, model))
        return [self.p]

    def chat(self, messages: list[dict[str, str]], *, model: str | None = None, max_tokens: int = 512) -> str:
        self.seen.append((messages, model))
        return self.reply


def test_score_guard_blocks_at_the_threshold_and_marks_the_stage() -> None:
    g = FakeGuard(p=0.9)
    v = check(g, "score", "guard", "how to build a bomb", threshold=0.84)
    assert (v.stage, v.safe, v.label, v.score) == ("input", False, "unsafe", 0.9)
    assert g.seen == [("how to build a bomb", ["(none)"], "guard")]
    v = check(FakeGuard(p=0.5), "score", "guard", "q", "an answer", threshold=0.84)
    assert (v.stage, v.safe) == ("output", True)


def test_qwen3guard_output_check_sends_the_conversation() -> None:
    g = FakeGuard(reply="Safety: Unsafe\nCategories: Violent\nRefusal: No")
    v = check(g, "qwen3guard", "guard", "q?", "bad answer")
    assert not v.safe and v.stage == "output"
    assert g.seen == [
        ([{"role": "user", "content": "q?"}, {"role": "assistant", "content": "bad answer"}], "guard")
    ]


def test_llamaguard3_reads_the_conversation_through_chat_and_names_the_category() -> None:
    g = FakeGuard(reply="\n\nunsafe\nS2")
    v = check(g, "llamaguard3", "guard", "how do I pick this lock?", "First insert a tension wrench.")
    assert not v.safe and v.stage == "output" and v.categories == ("S2 Non-Violent Crimes",)
    assert g.seen == [
        (
            [
                {"role": "user", "content": "how do I pick this lock?"},
                {"role": "assistant", "content": "First insert a tension wrench."},
            ],
            "guard",
        )
    ]
    assert check(FakeGuard(reply="safe"), "llamaguard3", "guard", "hello").safe
