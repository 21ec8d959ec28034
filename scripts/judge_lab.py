"""Measure candidate answer judges against hand labels: does the answer answer the question?

eval/answer-labels/*.jsonl hold answers the stack gave over two third-party manuals, each
labeled by hand `right`, `partly`, `wrong` or `not-answered` (the answer itself, not its
quoted passage). A judge is useful if it scores the right and partly ones above the wrong
and unanswered ones; this script prints each signal's ROC AUC for that split, from what a
running stack serves:

  chat-yes       the chat model asked "does this answer give what the question asks for?",
                 P(yes) from its next-token log probabilities (one 1-token completion)
  chat-yes-user  the same, asked in one user turn without a system message
  likelihood     how much more likely the chat model finds the question after the answer
                 than after nothing (query likelihood, as UPR reranks passages: mean log
                 probability per question token, the difference of two prompt_logprobs calls)
  reranker       the score engine's relevance of the answer to the question (/v1/score)
  cosine         the embed engine's cosine of question and answer (/v1/embeddings)

On the CPU profile (Qwen2.5-Coder 0.5B chat, the MiniLM reranker and embedder) none of
them separates (README, "Does the answer answer the question?"), so no judge is on the
answer path; run this against a stronger chat model (the GPU profile) before adding one.
Not part of any test.

    .venv/bin/python scripts/judge_lab.py eval/answer-labels/*.jsonl --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rag.evaluate import read_jsonl, roc_auc

GOOD = ("right", "partly")
LABELS = ("right", "partly", "wrong", "not-answered")
ASK = (
    "Question: {q}\n\nAnswer: {a}\n\nDoes this answer give what the question asks for, rather than "
    "something else? Reply yes or no."
)
PROMPTS = {
    "chat-yes": [
        {"role": "system", "content": "You check answers to questions about software documentation."},
        {"role": "user", "content": ASK},
    ],
    "chat-yes-user": [
        {
            "role": "user",
            "content": "A user asked: {q}\n\nThe reply was: {a}\n\nIs the reply a direct and correct answer "
            "to the user's question? Answer only yes or no.",
        }
    ],
}
LIKELIHOOD = "Text: {a}\n\nPlease write a question that this text answers.\nQuestion:"


def plain(answer: str) -> str:
    """The answer without its [n] and [no source] marks."""
    return re.sub(r"\s*\[(\d+(, )?)+\]", "", answer).replace("[no source]", "").strip()


class Signals:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        r = self.http.post(path, json=body)
        r.raise_for_status()
        return r.json()

    def chat_yes(self, template: list[dict[str, str]], q: str, a: str) -> float:
        messages = [{"role": m["role"], "content": m["content"].format(q=q, a=a)} for m in template]
        body = {"model": "chat", "messages": messages, "max_tokens": 1, "temperature": 0}
        data = self._post("/chat/completions", {**body, "logprobs": True, "top_logprobs": 20})
        top = data["choices"][0]["logprobs"]["content"][0]["top_logprobs"]

        def p(word: str) -> float:
            return sum(math.exp(t["logprob"]) for t in top if t["token"].strip().lower() == word)

        yes, no = p("yes"), p("no")
        return yes / (yes + no) if yes + no else 0.5

    def _question_logprob(self, prefix: str, q: str) -> float:
        body = {"model": "chat", "prompt": f"{prefix} {q}", "max_tokens": 1, "prompt_logprobs": 0}
        rows = self._post("/completions", {**body, "temperature": 0})["choices"][0]["prompt_logprobs"]
        tokens = [next(iter(d.values())) for d in rows[1:]]
        text, lps = "", []
        for t in reversed(tokens):  # the question's tokens, from the end
            text = t["decoded_token"] + text
            lps.append(t["logprob"])
            if len(text.strip()) >= len(q.strip()):
                break
        return float(sum(lps) / len(lps))

    def likelihood(self, q: str, a: str) -> float:
        with_answer = self._question_logprob(LIKELIHOOD.format(a=a[:1500]), q)
        return with_answer - self._question_logprob(LIKELIHOOD.format(a="(none)"), q)

    def reranker(self, q: str, a: str) -> float:
        data = self._post("/score", {"model": "score", "text_1": q, "text_2": [a]})["data"]
        return float(data[0]["score"])

    def cosine(self, q: str, a: str) -> float:
        body = {"model": "embed", "input": [q, a[:1500]], "truncate_prompt_tokens": -1}
        data = self._post("/embeddings", body)["data"]
        v = np.array([d["embedding"] for d in data])
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        return float(v[0] @ v[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labels", nargs="+", type=Path, help="eval/answer-labels/*.jsonl")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    rows = [row for f in args.labels for row in read_jsonl(f, dict, "a labeled answer")]
    bad = sorted({r["label"] for r in rows} - set(LABELS))
    if bad:
        sys.exit(f"unknown labels {bad}: each row's label is one of {', '.join(LABELS)}")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    sig = Signals(httpx.Client(base_url=args.base_url, timeout=300, headers=headers))
    judges: dict[str, Callable[[str, str], float]] = {
        **{name: partial(sig.chat_yes, t) for name, t in PROMPTS.items()},
        "likelihood": sig.likelihood,
        "reranker": sig.reranker,
        "cosine": sig.cosine,
    }
    scores: dict[str, list[float]] = {name: [] for name in judges}
    for i, r in enumerate(rows, 1):
        for name, judge in judges.items():
            scores[name].append(judge(r["question"], plain(r["answer"])))
        print(f"\r{i}/{len(rows)} answers judged", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    good = [r["label"] in GOOD for r in rows]
    print(f"{len(rows)} answers: {sum(good)} right or partly, {len(rows) - sum(good)} wrong or not answered")
    print(f"  {'judge':14} {'ROC AUC':>8}  {'mean good':>10} {'mean bad':>9}")
    for name, s in scores.items():
        pos = [x for x, g in zip(s, good, strict=True) if g]
        neg = [x for x, g in zip(s, good, strict=True) if not g]
        auc = roc_auc(pos, neg)
        shown = "n/a" if auc is None else f"{auc:.3f}"
        print(f"  {name:14} {shown:>8}  {np.mean(pos):10.3f} {np.mean(neg):9.3f}")


if __name__ == "__main__":
    main()
