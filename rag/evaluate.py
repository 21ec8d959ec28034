"""Evaluate: retrieval and answer quality on any corpus and QA file.

A QA file is JSON lines, one question each:

    {"question": "...", "files": ["gpu-memory.md"], "keywords": ["0.85"]}

`files` are paths as the index stores them (relative to the indexed root; a
suffix match is enough); `keywords` are words a correct answer contains.

A question whose request fails (an engine timed out, answered an error) is
recorded with its error and the run goes on; the measures cover the questions
that completed. Each question's result is handed to `record` as soon as it is
known, so a long run that is interrupted keeps what it measured.

Over 300 lines: retrieval measures, answer measures and the attribution report read
the same per-question records; one file keeps their definitions side by side.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rag.answer import Source
from rag.attribute import Attributor, Sentence
from rag.errors import ClientError, ConfigError, ServerUnreachable
from rag.pipeline import Answer, Pipeline
from rag.retrieve import MODES, Hit

__all__ = [
    "QA",
    "EvalReport",
    "JudgeReport",
    "LabeledSentence",
    "judge_attribution",
    "load_labeled",
    "load_qa",
    "run_eval",
]


@dataclass(frozen=True)
class QA:
    question: str
    files: tuple[str, ...]
    keywords: tuple[str, ...] = ()


T = TypeVar("T")


def read_jsonl(path: Path, build: Callable[[dict[str, Any]], T], expected: str) -> list[T]:
    """One `build(row)` per JSON line of `path` (blank and # lines skipped); a line that
    does not parse or build is a ConfigError naming file, line and `expected`."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append(build(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{n}: expected {expected} ({exc})") from exc
    return out


def roc_auc(pos: Sequence[float], neg: Sequence[float]) -> float | None:
    """P(a random positive scores above a random negative), ties count half."""
    if not pos or not neg:
        return None
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))


def load_qa(path: Path) -> list[QA]:
    """Read a QA file; ConfigError naming the line that is wrong."""
    if not path.is_file():
        raise ConfigError(
            f"{path} is a folder: pass one QA file (JSON lines)"
            if path.is_dir()
            else f"QA file {path} not found"
        )
    out = read_jsonl(
        path,
        lambda raw: QA(str(raw["question"]), tuple(raw.get("files", ())), tuple(raw.get("keywords", ()))),
        "a JSON object with `question`, `files` and `keywords`",
    )
    if not out:
        raise ConfigError(f"{path} holds no questions")
    return out


def _gold(path: str, files: Sequence[str]) -> bool:
    return any(path == f or path.endswith("/" + f) or f.endswith("/" + path) for f in files)


def first_gold_rank(hits: Sequence[Hit], files: Sequence[str]) -> int | None:
    """1-based rank of the first chunk from a gold file, or None."""
    for rank, h in enumerate(hits, 1):
        if _gold(h.chunk.path, files):
            return rank
    return None


@dataclass
class RankStats:
    """recall@k and MRR of one retrieval mode."""

    ranks: list[int | None] = field(default_factory=list)

    def recall(self, k: int) -> float:
        return sum(1 for r in self.ranks if r is not None and r <= k) / max(len(self.ranks), 1)

    @property
    def mrr(self) -> float:
        return sum(1.0 / r for r in self.ranks if r is not None) / max(len(self.ranks), 1)


@dataclass
class EvalReport:
    """Everything `rag eval` measured."""

    questions: int
    k: int
    retrieval: dict[str, RankStats]
    keyword_hit_rate: float | None = None
    citation_accuracy: float | None = None  # share of attached sources that are gold pages
    answers_citing: int = 0  # answers (not "not covered") with a supported sentence or a quoted passage
    answered: int = 0  # answers neither blocked nor "not covered"
    claims: int = 0  # answer sentences that state something
    supported: int = 0  # of those, with a supporting source
    fallbacks: int = 0  # answers followed by the best passage, most of them resting on nothing
    echoed: int = 0  # answers cut where the model wrote the prompt's worked example
    unsourced: int = 0  # answers naming an option, setting or variable no shown source holds
    looped: int = 0  # answers stopped where the model began writing the same sentences again
    attached: int = 0  # sources attached to sentences
    attached_gold: int = 0  # of those, on a gold page
    not_covered: int = 0
    guard_blocks: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)  # per answer, the whole of it
    first_shown: list[float] = field(default_factory=list)  # per answer, to its first shown word
    per_question: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)  # question, stage, error

    @property
    def completed(self) -> int:
        """Questions whose retrieval was measured."""
        return self.questions - sum(1 for f in self.failed if f["stage"] == "retrieval")

    def as_dict(self) -> dict[str, Any]:
        return {
            "questions": self.questions,
            "k": self.k,
            "retrieval": {
                mode: {
                    f"recall@{self.k}": round(s.recall(self.k), 4),
                    "recall@1": round(s.recall(1), 4),
                    "mrr": round(s.mrr, 4),
                }
                for mode, s in self.retrieval.items()
            },
            "answers": None
            if self.keyword_hit_rate is None
            else {
                "keyword_hit_rate": round(self.keyword_hit_rate, 4),
                "citation_accuracy": None
                if self.citation_accuracy is None
                else round(self.citation_accuracy, 4),
                "answers_citing": self.answers_citing,
                "answered": self.answered,
                "answers_with_source_rate": round(self.answers_citing / self.answered, 4)
                if self.answered
                else None,
                "citation_recall": round(self.supported / self.claims, 4) if self.claims else None,
                "unsupported_sentence_rate": round(1 - self.supported / self.claims, 4)
                if self.claims
                else None,
                "fallback_rate": round(self.fallbacks / self.answered, 4) if self.answered else None,
                "echoed_example": self.echoed,
                "unsourced_names": self.unsourced,
                "looped": self.looped,
                "not_covered": self.not_covered,
                "guard_blocks": dict(self.guard_blocks),
                "seconds_p50": _quantile(self.seconds, 0.5),
                "seconds_p95": _quantile(self.seconds, 0.95),
                "first_shown_p50": _quantile(self.first_shown, 0.5),
                "first_shown_p95": _quantile(self.first_shown, 0.95),
            },
            "failed": self.failed,
            "per_question": self.per_question,
        }


class _FirstShown:
    """An answer's on_text: the seconds from its start to the first text shown."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.first: float | None = None

    def __call__(self, text: str) -> None:
        if text and self.first is None:
            self.first = time.monotonic() - self.start


def _quantile(values: Sequence[float], q: float) -> float | None:
    return round(float(np.quantile(values, q)), 2) if values else None


def _measure_answer(report: EvalReport, qa: QA, ans: Answer, keyword_rates: list[float]) -> dict[str, Any]:
    """Count one answer into the report; its row for the results file."""
    if ans.blocked:
        report.guard_blocks[ans.blocked] += 1
    if not ans.covered:
        report.not_covered += 1
    shown = ans.text + ("\n" + ans.fallback[1] if ans.fallback else "")  # what the user reads
    if qa.keywords:
        keyword_rates.append(sum(kw.lower() in shown.lower() for kw in qa.keywords) / len(qa.keywords))
    if not ans.blocked and ans.covered:
        claims = [x for x in ans.sentences if x.is_claim]
        report.answered += 1
        report.claims += len(claims)
        report.supported += sum(x.support == "supported" for x in claims)
        report.fallbacks += ans.fallback is not None
        report.echoed += ans.echoed
        report.unsourced += any(x.unsourced for x in ans.sentences)
        report.looped += ans.looped
        report.answers_citing += bool(ans.cited) or ans.fallback is not None
    by_n = {s.n: s for s in ans.sources}
    attached = [by_n[n] for x in ans.sentences for n in x.sources]
    report.attached += len(attached)
    report.attached_gold += sum(_gold(s.path, qa.files) for s in attached)
    return {
        "answer": ans.text,
        "cited": [s.path for s in ans.cited],
        "blocked": ans.blocked,
        "echoed_example": ans.echoed,
        "looped": ans.looped,
        "sentences": [x.as_dict() for x in ans.sentences],
        "fallback": None
        if ans.fallback is None
        else {"path": ans.fallback[0].path, "passage": ans.fallback[1]},
    }


def run_eval(
    pipeline: Pipeline,
    qas: Sequence[QA],
    *,
    k: int = 5,
    answers: bool = True,
    progress: Callable[[int, int], None] = lambda done, total: None,
    record: Callable[[dict[str, Any]], None] = lambda row: None,
) -> EvalReport:
    """Rank every question each way, rerank the default mode, and (optionally) answer.

    A failed request is recorded in the question's row (`error`, and in
    `report.failed`) and the run goes on; a server that stops answering altogether
    (ServerUnreachable) ends it, after every row so far went to `record`.
    """
    stats = {mode: RankStats() for mode in (*MODES, "reranked")}
    keyword_rates: list[float] = []
    report = EvalReport(questions=len(qas), k=k, retrieval=stats)
    for i, qa in enumerate(qas):
        row: dict[str, Any] = {"question": qa.question}
        stage = "retrieval"
        try:
            vec = pipeline.embed_query(qa.question)
            ranks: dict[str, int | None] = {}
            for mode in MODES:
                hits = pipeline.retrieve(qa.question, vec, mode, pipeline.s.top_k)
                ranks[mode] = first_gold_rank(hits, qa.files)
            candidates = pipeline.retrieve(qa.question, vec, pipeline.s.retrieval, pipeline.s.top_k)
            reranked = pipeline.rerank(qa.question, candidates[: pipeline.s.rerank_n])
            ranks["reranked"] = first_gold_rank(reranked, qa.files)
            for mode, rank in ranks.items():  # all modes or none, so every mode has the same questions
                stats[mode].ranks.append(rank)
            row.update(ranks)
            if answers:
                stage = "answer"
                clock = _FirstShown()
                ans: Answer = pipeline.ask(qa.question, on_text=clock)
                seconds = time.monotonic() - clock.start
                row.update(_measure_answer(report, qa, ans, keyword_rates))
                row["seconds"] = round(seconds, 2)
                row["first_shown_s"] = None if clock.first is None else round(clock.first, 2)
                report.seconds.append(seconds)
                report.first_shown += [] if clock.first is None else [clock.first]
        except ServerUnreachable:
            raise
        except ClientError as exc:
            row.update(error=str(exc), failed_stage=stage)
            report.failed.append({"question": qa.question, "stage": stage, "error": str(exc)})
        report.per_question.append(row)
        record(row)
        progress(i + 1, len(qas))
    if answers:
        report.keyword_hit_rate = sum(keyword_rates) / max(len(keyword_rates), 1)
        report.citation_accuracy = report.attached_gold / report.attached if report.attached else None
    return report


# ---------------------------------------------------------------- the attribution judge


@dataclass(frozen=True)
class LabeledSentence:
    """An answer sentence, the sources its answer was shown, and which of them a person
    judged to support it (`supported_by`, empty when none does)."""

    id: str
    question: str
    sentence: str
    sources: tuple[Source, ...]
    supported_by: frozenset[int]


def load_labeled(path: Path) -> list[LabeledSentence]:
    """Read hand-labeled sentences (eval/attribution-*.jsonl); ConfigError naming a bad line."""
    if not path.is_file():
        raise ConfigError(f"labeled sentences file {path} not found")

    def build(raw: dict[str, Any]) -> LabeledSentence:
        sources = tuple(Source(int(s["n"]), s["path"], s["heading"], s["text"], 0.0) for s in raw["sources"])
        return LabeledSentence(
            str(raw["id"]), raw["question"], raw["sentence"], sources, frozenset(raw["supported_by"])
        )

    out = read_jsonl(
        path, build, "id, question, sentence, sources [{n, path, heading, text}] and supported_by [n, ...]"
    )
    if not out:
        raise ConfigError(f"{path} holds no labeled sentences")
    return out


@dataclass
class JudgeReport:
    """How the attribution rule agrees with a person's labels."""

    sentences: int
    labeled_supported: int
    true_positive: int  # supported, and the rule attached a source
    true_negative: int  # unsupported, and the rule attached none
    attached: int  # sources the rule attached
    attached_right: int  # of those, labeled as supporting their sentence
    pair_auc: float  # support score of supporting vs other (sentence, source) pairs

    def as_dict(self) -> dict[str, Any]:
        unsupported = self.sentences - self.labeled_supported
        return {
            "sentences": self.sentences,
            "labeled_supported": self.labeled_supported,
            "accuracy": round((self.true_positive + self.true_negative) / self.sentences, 4)
            if self.sentences
            else None,
            "sensitivity": round(self.true_positive / self.labeled_supported, 4)
            if self.labeled_supported
            else None,
            "specificity": round(self.true_negative / unsupported, 4) if unsupported else None,
            "attached_precision": round(self.attached_right / self.attached, 4) if self.attached else None,
            "pair_auc": round(self.pair_auc, 4),
        }


def judge_attribution(pipeline: Pipeline, labeled: Sequence[LabeledSentence]) -> JudgeReport:
    """Attribute each labeled sentence as `rag ask` would (the index's IDF, the served
    embedding engine) and compare with the labels. Only sentences that state something
    count: those the rule lets pass as needing no source are left out."""
    report = JudgeReport(0, 0, 0, 0, 0, 0, 0.0)
    pos: list[float] = []
    neg: list[float] = []
    for row in labeled:
        vectors = pipeline.client.embed(
            [f"{s.heading}\n{s.text}" if s.heading else s.text for s in row.sources]
        )
        attributor = Attributor(
            row.question, row.sources, vectors, pipeline.client.embed, pipeline.bm25.idf,
            threshold=pipeline.s.support_threshold,
        )  # fmt: skip
        (got,) = attributor.attribute([Sentence(row.sentence)])
        if not got.is_claim:
            continue
        report.sentences += 1
        report.labeled_supported += bool(row.supported_by)
        report.true_positive += bool(row.supported_by) and bool(got.sources)
        report.true_negative += not row.supported_by and not got.sources
        report.attached += len(got.sources)
        report.attached_right += sum(n in row.supported_by for n in got.sources)
        for n, score in got.scores.items():
            (pos if n in row.supported_by else neg).append(score)
    report.pair_auc = roc_auc(pos, neg) or 0.0
    return report
