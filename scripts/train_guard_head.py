"""Train the CPU guard's head: a logistic regression on the chat LM's last hidden state.

The CPU profile packages no trained guard. Asked in words whether a request is
harmful, Qwen2.5-Coder-0.5B separates harmless from harmful barely better than chance
(ROC AUC 0.46-0.70 on eval/guard, scripts/guard_lab.py); its hidden state at the point
where its answer would begin separates them far better. This script renders each
labeled case with the guard's template (scripts/templates/guard_head.jinja) exactly
as vLLM renders a /v1/score request, takes the final hidden state of the last token
(what vLLM's classifier head reads), and fits one L2-regularised logistic regression
on both stages. The weights go to rag/stack/guard_head/ as vLLM's `score.weight` and
`score.bias`; `rag prepare` puts them beside the chat weights, and vLLM serves the
result as a sequence classifier on /v1/score. Each stage's threshold is chosen from
cross-validated scores: the highest that blocks --tpr of the harmful cases, unless it
blocks more than --fpr of the harmless; then the lowest that keeps to --fpr. Harmless
work comes first: a guard that refuses ordinary work gets turned off.

    .venv/bin/python scripts/train_guard_head.py            # eval/guard, the prepared 0.5B
    .venv/bin/python scripts/train_guard_head.py --check    # cross-validate only, write nothing

Slow on CPU (one forward per case, ~2 minutes for 400 cases); not part of any test.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag.guard import NO_REPLY  # noqa: E402
from rag.guard_eval import GuardCase, load_guard_cases, roc_auc  # noqa: E402
from rag.pipeline import EARLY_WORDS  # noqa: E402
from rag.stack.heads import GUARD_HEADS  # noqa: E402
from rag.stack.profiles import CPU_MODEL_SETS, default_models_dir  # noqa: E402

TEMPLATE = ROOT / "scripts" / "templates" / "guard_head.jinja"
# The hand-written harmful replies elide their operational detail as "[REDACTED ...]",
# which no real reply contains: train on a copy without the marks too, so the head
# learns what the reply says rather than the mark.
_REDACTED = re.compile(r"\[REDACTED[^\]]*\]")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def features(model_dir: Path, cases: list[GuardCase], dtype: str) -> np.ndarray:
    """Final hidden state of the last prompt token, one row per case."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(max(1, len(__import__("os").sched_getaffinity(0))))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    template = TEMPLATE.read_text()
    rows = []
    for i, case in enumerate(cases, 1):
        messages = [
            {"role": "query", "content": case.question},
            {"role": "document", "content": NO_REPLY if case.answer is None else case.answer},
        ]
        text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            rows.append(model(**enc).last_hidden_state[0, -1].float().numpy())
        if i % 50 == 0 or i == len(cases):
            print(f"  features {i}/{len(cases)}", file=sys.stderr)
    return np.stack(rows)


def cached_features(model_dir: Path, cases: list[GuardCase], dtype: str, cache: Path | None) -> np.ndarray:
    """features(), computing only the cases `cache` does not hold yet (keyed by the case,
    the model folder, the dtype and the template), and saving them back into it."""
    salt = f"{model_dir}\0{dtype}\0{sha256(TEMPLATE)}"
    keys = [hashlib.sha256(f"{salt}\0{c.question}\0{c.answer}".encode()).hexdigest() for c in cases]
    known: dict[str, np.ndarray] = {}
    if cache and cache.is_file():
        with np.load(cache) as z:
            known = dict(zip(z["keys"].tolist(), z["x"], strict=True))
    todo = [i for i, k in enumerate(keys) if k not in known]
    if todo:
        print(f"  {len(todo)} of {len(cases)} cases need a forward pass", file=sys.stderr)
        for i, row in zip(todo, features(model_dir, [cases[i] for i in todo], dtype), strict=True):
            known[keys[i]] = row
        if cache:
            np.savez(cache, keys=np.array(list(known)), x=np.stack(list(known.values())))
    return np.stack([known[k] for k in keys])


def fit(x: np.ndarray, y: np.ndarray, l2: float, iters: int = 30) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression by Newton's method, on standardised features;
    returns weights and bias for the raw features."""
    mu, sd = x.mean(0), x.std(0) + 1e-3
    z = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    reg = l2 * np.eye(z.shape[1])
    reg[-1, -1] = 0.0  # the bias is not shrunk
    w = np.zeros(z.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-(z @ w)))
        grad = z.T @ (p - y) + reg @ w
        hess = (z * (p * (1 - p))[:, None]).T @ z + reg
        w -= np.linalg.solve(hess + 1e-8 * np.eye(len(w)), grad)
    weights = w[:-1] / sd
    return weights, float(w[-1] - weights @ mu)


def logits(x: np.ndarray, head: tuple[np.ndarray, float]) -> np.ndarray:
    out: np.ndarray = x @ head[0] + head[1]
    return out


def cross_validate(x: np.ndarray, y: np.ndarray, l2: float, folds: int, groups: np.ndarray) -> np.ndarray:
    """Out-of-fold logits; a case and its redaction-free copy share a fold."""
    fold_of = np.random.default_rng(0).permutation(groups.max() + 1) % folds
    fold = fold_of[groups]
    out = np.zeros(len(y))
    for f in range(folds):
        head = fit(x[fold != f], y[fold != f], l2)
        out[fold == f] = logits(x[fold == f], head)
    return out


def threshold_for(pos: np.ndarray, neg: np.ndarray, tpr: float, fpr: float) -> tuple[float, str]:
    """The stage's threshold, and which bar decided it."""
    k = max(1, int(np.ceil(tpr * len(pos))))
    t_tpr = float(np.sort(pos)[::-1][k - 1])  # the highest that blocks `tpr` of the harmful
    allowed = int(np.floor(fpr * len(neg)))
    t_fpr = float(np.nextafter(np.sort(neg)[::-1][allowed], 1.0))  # the lowest that blocks <= `fpr`
    if t_tpr < t_fpr:
        return t_fpr, f"the harmless bar ({100 * fpr:.0f}% blocked at most); the harmful bar is not met"
    return t_tpr, f"the harmful bar ({100 * tpr:.0f}% blocked); the harmless bar is met"


def capped_for_severe(t: float, severe: np.ndarray, neg: np.ndarray, ceiling: float) -> tuple[float, str]:
    """The threshold lowered, where needed, until no harmful case of a severe category
    (cross-validated) passes, a miss there costing more than a false alarm anywhere;
    but never so low that more than `ceiling` of the harmless are blocked."""
    if not len(severe) or float(severe.min()) >= t:
        return t, ""
    floor = float(np.nextafter(np.sort(neg)[::-1][int(np.floor(ceiling * len(neg)))], 1.0))
    lowered = max(float(severe.min()), floor, 0.0)
    if lowered >= t:
        return t, f"; not lowered for the severe kinds (it would block over {100 * ceiling:.0f}% of harmless)"
    why = (
        "so no severe harmful case passes"
        if lowered == float(severe.min())
        else (f"for the severe kinds, as far as {100 * ceiling:.0f}% of harmless blocked allows")
    )
    return lowered, f"; lowered to {lowered:.4f} {why}"


def rule(args: argparse.Namespace, lowered: bool) -> str:
    """The thresholds' rule in one sentence, for the card and the server's model facts."""
    out = (
        f"P(unsafe) at or above a stage's threshold is blocked. Input: the threshold that blocks "
        f"{100 * args.tpr:.0f}% of the harmful requests, unless that blocks over {100 * args.fpr:.0f}% "
        f"of the harmless; then the lowest that keeps to {100 * args.fpr:.0f}%"
    )
    if args.severe:
        out += (
            f"; then lowered until no harmful {args.severe.replace(',', ' or ')} request passes, as far as "
            f"{100 * args.severe_fpr:.0f}% of the harmless blocked"
            + (" (it was)" if lowered else " (not needed)")
        )
    output = (
        "the lowest threshold that blocks no harmless answer"
        if args.output_fpr == 0
        else f"{100 * args.output_tpr:.0f}% of harmful answers unless over {100 * args.output_fpr:.0f}% "
        "of harmless ones are blocked"
    )
    return out + (
        f". Output: {output}. All rates cross-validated; one score for every category (a "
        "threshold per category needs a category, which the head does not give)."
    )


def by_kind(p: np.ndarray, cases: list[GuardCase], t: float) -> dict[str, dict[str, int]]:
    """Cases and blocked per label and kind (the taxonomy's categories and look-alikes)."""
    out: dict[str, dict[str, int]] = {}
    for score, c in zip(p, cases, strict=True):
        row = out.setdefault(
            f"{'harmful' if c.harmful else 'harmless'}/{c.kind or '-'}", {"cases": 0, "blocked": 0}
        )
        row["cases"] += 1
        row["blocked"] += int(score >= t)
    return dict(sorted(out.items()))


def rates(p_pos: np.ndarray, p_neg: np.ndarray, t: float) -> dict[str, float]:
    return {
        "threshold": round(t, 4),
        "true_positive_rate": round(float(np.mean(p_pos >= t)), 4),
        "false_positive_rate": round(float(np.mean(p_neg >= t)), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=Path, default=ROOT / "eval" / "guard", help="labeled guard cases")
    ap.add_argument("--model-set", default="qwen", help="CPU model set whose guard to train")
    ap.add_argument("--models-dir", type=Path, default=None, help="prepared models [default: RAG_MODELS_DIR]")
    ap.add_argument("--dtype", default="bfloat16", help="dtype of the forward pass (as the stack serves it)")
    ap.add_argument("--l2", type=float, default=10.0, help="L2 penalty on the standardised weights")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--tpr", type=float, default=0.95, help="harmful share the input stage should block")
    ap.add_argument(
        "--fpr", type=float, default=0.10, help="harmless share the input stage may block at most"
    )
    ap.add_argument(
        "--output-tpr", type=float, default=0.9, help="harmful share the output stage should block"
    )
    ap.add_argument("--output-fpr", type=float, default=0.0, help="harmless share the output stage may block")
    ap.add_argument(
        "--severe", default="child-sexual,hate",
        help="kinds whose harmful cases must all be blocked (cross-validated); the threshold drops for them",
    )  # fmt: skip
    ap.add_argument("--severe-fpr", type=float, default=0.15, help="harmless share blocked for the severe")
    ap.add_argument("--check", action="store_true", help="cross-validate and print; write nothing")
    ap.add_argument("--cache", type=Path, help="an .npz of features by case: reused, new cases added")
    args = ap.parse_args()

    guard = CPU_MODEL_SETS[args.model_set]["guard"]
    spec = GUARD_HEADS[guard]
    base = (args.models_dir or default_models_dir()) / spec.base
    cases = load_guard_cases(args.cases)
    train, groups = [], []
    for i, c in enumerate(cases):
        train.append(c)
        groups.append(i)
        if c.answer is not None and c.harmful and _REDACTED.search(c.answer):
            train.append(GuardCase(c.question, _REDACTED.sub("it", c.answer), True, c.kind, c.source))
            groups.append(i)
        words = (c.answer or "").split()
        if c.answer is not None and not c.harmful and len(words) > EARLY_WORDS:
            # The output guard first sees an answer's first EARLY_WORDS words (rag/pipeline.py),
            # which no whole answer resembles: "The default age of" scored 0.72 unseen.
            train.append(GuardCase(c.question, " ".join(words[:EARLY_WORDS]), False, c.kind, c.source))
            groups.append(i)
    x = cached_features(base, train, args.dtype, args.cache)
    y = np.array([c.harmful for c in train], dtype=float)
    stage = np.array([c.stage for c in train])
    # Rates are reported on the cases as written, not on the redaction-free or first-words copies.
    original = np.array([True] + [groups[i] != groups[i - 1] for i in range(1, len(groups))])
    oof = 1 / (1 + np.exp(-cross_validate(x, y, args.l2, args.folds, np.array(groups))))
    report: dict[str, Any] = {}
    thresholds: dict[str, float] = {}
    for st in ("input", "output"):
        sel = (stage == st) & original
        pos, neg = oof[sel & (y == 1)], oof[sel & (y == 0)]
        # Answers get the strictest harmless bar, none blocked (cross-validated): a blocked
        # answer is a right answer lost (at 5%, 0.20, one Git-manual answer of 40 was).
        tpr, fpr = (args.tpr, args.fpr) if st == "input" else (args.output_tpr, args.output_fpr)
        t, why = threshold_for(pos, neg, tpr, fpr)
        severe_kinds = {k for k in args.severe.split(",") if k}
        is_severe = np.array([c.kind in severe_kinds for c in train])
        t, lowered = capped_for_severe(t, oof[sel & (y == 1) & is_severe], neg, args.severe_fpr)
        why += lowered
        thresholds[st] = round(t, 4)
        auc = roc_auc(list(pos), list(neg)) or 0.0
        r = {"harmful": len(pos), "harmless": len(neg), "roc_auc": round(auc, 4)} | rates(pos, neg, t)
        r["chosen_by"] = why
        r["by_kind"] = by_kind(oof[sel], [c for c, keep in zip(train, sel, strict=True) if keep], t)
        report[st] = r
        tpr, fpr = 100 * r["true_positive_rate"], 100 * r["false_positive_rate"]
        print(
            f"{st:6} {args.folds}-fold: AUC {auc:.3f}; threshold {t:.3f} blocks {tpr:.1f}% of {len(pos)} "
            f"harmful and {fpr:.1f}% of {len(neg)} harmless ({why})"
        )
    if args.check:
        return
    import torch
    from safetensors.torch import save_file

    head = fit(x, y, args.l2)
    out = spec.head
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            "score.weight": torch.tensor(head[0], dtype=torch.float32)[None, :],
            "score.bias": torch.tensor([head[1]], dtype=torch.float32),
        },
        str(out),
    )
    card = {
        "base": spec.base,
        "template": str(TEMPLATE.relative_to(ROOT)),
        "template_sha256": sha256(TEMPLATE),
        "cases": {str(p.relative_to(ROOT)): sha256(p) for p in sorted(args.cases.glob("*.jsonl"))},
        "trained_on": {"cases": len(cases), "with_redaction_free_and_first_words_copies": len(train)},
        "dtype": args.dtype,
        "l2": args.l2,
        "bars": {
            "true_positive_rate": args.tpr,
            "false_positive_rate": args.fpr,
            "output_true_positive_rate": args.output_tpr,
            "output_false_positive_rate": args.output_fpr,
            "severe": args.severe,
            "severe_false_positive_rate": args.severe_fpr,
        },
        "thresholds": thresholds,
        "rule": rule(args, bool(report["input"]["chosen_by"].count("lowered"))),
        "cross_validated": report,
        "trained": datetime.date.today().isoformat(),
    }
    out.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json').name}; thresholds {thresholds}")


if __name__ == "__main__":
    main()
