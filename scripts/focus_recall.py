"""How much of what answers a question survives when sources are focused (rag/focus.py).

For each question of a QA file (eval/*.jsonl: question, gold files, expected keywords),
retrieve as `rag ask` does (fused, the top RAG_SOURCES hits) and report, whole and
focused to each budget: the share of questions with an expected keyword in the shown
sources, the share with a keyword in a gold page's shown text, and the characters
(and an estimate of the tokens) the chat model reads.

    RAG_INDEX_DIR=.rag/git-doc .venv/bin/python scripts/focus_recall.py eval/git-doc.jsonl

Needs the stack's embed engine (RAG_BASE_URL), as retrieval does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rag.answer import sources_from
from rag.cli.common import build_settings, open_pipeline
from rag.evaluate import _gold, load_qa
from rag.focus import focus

BUDGETS = (0, 1200, 900, 700, 500, 350)


def main(qa_file: str) -> None:
    s = build_settings(None, None, None)
    client, pipe = open_pipeline(s)
    qas = [qa for qa in load_qa(Path(qa_file)) if qa.keywords]
    found = {b: 0 for b in BUDGETS}
    found_gold = {b: 0 for b in BUDGETS}
    chars = {b: 0 for b in BUDGETS}
    try:
        for qa in qas:
            hits = pipe.search(qa.question, rerank=False)[: s.sources]
            whole = sources_from(hits)
            for b in BUDGETS:
                shown = focus(whole, qa.question, pipe.bm25.idf, b)
                text = " ".join(x.text for x in shown).lower()
                gold = " ".join(x.text for x in shown if _gold(x.path, qa.files)).lower()
                found[b] += any(k.lower() in text for k in qa.keywords)
                found_gold[b] += any(k.lower() in gold for k in qa.keywords)
                chars[b] += sum(len(x.text) for x in shown)
    finally:
        client.close()
    n = len(qas)
    rows = [
        {
            "max_chars": b or "whole",
            "keyword_in_sources": round(found[b] / n, 3),
            "keyword_in_gold_source": round(found_gold[b] / n, 3),
            "source_chars_per_question": round(chars[b] / n),
            "source_tokens_per_question_est": round(chars[b] / n / 4),
        }
        for b in BUDGETS
    ]
    print(json.dumps({"questions": n, "sources": s.sources, "rows": rows}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
