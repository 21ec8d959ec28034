"""`rag eval` keeps its work: a failed question is recorded and the run goes on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rag.answer import Source
from rag.chunk import Chunk
from rag.errors import EngineTimeout, HTTPStatusError, ServerUnreachable
from rag.evaluate import QA, run_eval
from rag.pipeline import Answer
from rag.retrieve import Hit


@dataclass
class _Settings:
    top_k: int = 5
    retrieval: str = "fused"
    rerank_n: int = 3


class FakePipeline:
    """Gold file first for every question; chosen questions fail at a chosen stage."""

    def __init__(self, fail: dict[str, Exception], fail_at: str = "answer") -> None:
        self.s = _Settings()
        self.fail, self.fail_at = fail, fail_at

    def _maybe_fail(self, question: str, stage: str) -> None:
        if stage == self.fail_at and question in self.fail:
            raise self.fail[question]

    def embed_query(self, question: str) -> np.ndarray:
        self._maybe_fail(question, "retrieval")
        return np.zeros(3, dtype=np.float32)

    def retrieve(self, question: str, vec: Any, mode: str, k: int) -> list[Hit]:
        return [Hit(Chunk(id="1", path="gold.md", title="", heading="", text="t"), 1.0)]

    def rerank(self, question: str, hits: list[Hit]) -> list[Hit]:
        return hits

    def ask(self, question: str, on_text: Callable[[str], None] = lambda text: None) -> Answer:
        self._maybe_fail(question, "answer")
        source = Source(1, "gold.md", "", "t", 1.0)
        on_text("the answer is 42")
        return Answer(question, text="the answer is 42", sources=[source], cited=[source])


QAS = [QA(f"q{i}", ("gold.md",), ("42",)) for i in range(4)]


def test_a_timed_out_answer_is_recorded_and_the_rest_still_run() -> None:
    rows: list[dict[str, Any]] = []
    timeout = EngineTimeout("http://x/v1", "chat", 300)
    report = run_eval(FakePipeline({"q1": timeout}), QAS, record=rows.append)  # type: ignore[arg-type]
    assert [r["question"] for r in rows] == ["q0", "q1", "q2", "q3"]  # each handed over as it came
    assert rows[1]["failed_stage"] == "answer" and "sent nothing for 300 s" in rows[1]["error"]
    assert report.failed == [{"question": "q1", "stage": "answer", "error": str(timeout)}]
    assert report.retrieval["fused"].recall(1) == 1.0 and len(report.retrieval["fused"].ranks) == 4
    assert report.keyword_hit_rate == 1.0 and report.answers_citing == 3
    # each answer timed whole and to its first shown word; the failed one not at all
    assert all(
        r["first_shown_s"] is not None and r["first_shown_s"] <= r["seconds"] for r in rows if "seconds" in r
    )
    answers = report.as_dict()["answers"]
    assert len(report.first_shown) == 3 and answers["first_shown_p50"] is not None
    assert answers["echoed_example"] == 0


def test_a_failed_retrieval_leaves_every_mode_with_the_same_questions() -> None:
    error = HTTPStatusError("http://x/v1/embeddings", 400, "bad")
    report = run_eval(FakePipeline({"q2": error}, fail_at="retrieval"), QAS, answers=False)  # type: ignore[arg-type]
    assert {len(s.ranks) for s in report.retrieval.values()} == {3}
    assert report.completed == 3 and report.as_dict()["failed"][0]["stage"] == "retrieval"


def test_a_server_that_went_away_ends_the_run_after_recording_what_it_had() -> None:
    rows: list[dict[str, Any]] = []
    gone = ServerUnreachable("http://x/v1", "ConnectError")
    with pytest.raises(ServerUnreachable):
        run_eval(FakePipeline({"q2": gone}), QAS, record=rows.append)  # type: ignore[arg-type]
    assert [r["question"] for r in rows] == ["q0", "q1"]
