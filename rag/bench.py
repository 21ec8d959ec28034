"""`rag bench`: the stack's chat engine against one-request-at-a-time `generate`.

Each system is started, swept over concurrency levels with the same seeded
workload, and stopped before the next one starts, so they never share cores.
Every request streams, so time to first token is measured at the first
content chunk; `ignore_eos` fixes every answer's length at `max_tokens` on both
systems, so output tokens/s compare like with like.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from rag.errors import ServeError

__all__ = ["LevelResult", "Managed", "knee", "run_sweep", "workload"]

Log = Callable[[str], None]

_WORDS = (
    "engine memory batch token cache request model guard score embed index chunk query answer source "
    "latency throughput card share budget layer head vector document retrieval rerank prompt stream "
    "server client config deploy profile worker replica ingress schedule queue kernel tensor weight"
).split()


def _auth() -> dict[str, str]:
    """The header every request of the bench carries: the key `rag` clients send."""
    from rag.settings import Settings

    return {"Authorization": f"Bearer {Settings.from_env().api_key}"}


def workload(n: int, seed: int, words: tuple[int, int] = (40, 160)) -> list[str]:
    """n seeded prompts with lengths drawn uniformly from `words` (the same for every system)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        body = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(*words)))
        out.append(f"Summarize these notes in a few sentences: {body}")
    return out


@dataclass
class LevelResult:
    """One concurrency level on one system."""

    concurrency: int
    requests: int
    errors: int
    wall_s: float
    output_tokens: int
    ttft_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return (self.requests - self.errors) / self.wall_s if self.wall_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float | None:
            if not xs:
                return None
            return (
                round(statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1], 4)
                if len(xs) > 1
                else round(xs[0], 4)
            )

        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "wall_s": round(self.wall_s, 3),
            "rps": round(self.rps, 4),
            "output_tokens_per_s": round(self.tokens_per_s, 2),
            **{f"ttft_p{q}_s": pct(self.ttft_s, q) for q in (50, 95, 99)},
            **{f"latency_p{q}_s": pct(self.latency_s, q) for q in (50, 95, 99)},
        }


async def _one(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int
) -> tuple[float, float, int]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", "/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = int(chunk["usage"].get("completion_tokens") or 0)
    if ttft is None:
        raise RuntimeError("stream ended without content")
    return ttft, time.perf_counter() - start, tokens


async def _level(
    base_url: str, model: str, prompts: Sequence[str], concurrency: int, max_tokens: int
) -> LevelResult:
    res = LevelResult(concurrency, len(prompts), 0, 0.0, 0)
    queue = list(prompts)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=1800, limits=limits, headers=_auth()) as client:

        async def worker() -> None:
            while queue:
                prompt = queue.pop()
                try:
                    ttft, lat, tokens = await _one(client, model, prompt, max_tokens)
                except Exception:  # counted, not fatal: the sweep goes on
                    res.errors += 1
                    continue
                res.ttft_s.append(ttft)
                res.latency_s.append(lat)
                res.output_tokens += tokens

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        res.wall_s = time.perf_counter() - start
    return res


def run_sweep(
    base_url: str,
    model: str,
    levels: Sequence[int],
    *,
    min_requests: int,
    max_tokens: int,
    seed: int,
    log: Log,
) -> list[LevelResult]:
    """Every level with max(level, min_requests) requests of the seeded workload, after one warm-up."""
    asyncio.run(_level(base_url, model, workload(2, seed + 999), 2, max_tokens))  # warm-up, not counted
    out = []
    for c in levels:
        prompts = workload(max(c, min_requests), seed + c)
        r = asyncio.run(_level(base_url, model, prompts, c, max_tokens))
        s = r.summary()
        log(
            f"  c={c:<3} {s['output_tokens_per_s']:8.1f} tok/s  ttft p50 {s['ttft_p50_s']}s  "
            f"p95 latency {s['latency_p95_s']}s  errors {r.errors}"
        )
        out.append(r)
    return out


def knee(levels: Sequence[dict[str, Any]], gain: float = 1.10) -> int | None:
    """The last concurrency before output tokens/s grows by less than `gain` x; None if it never stops."""
    for prev, cur in itertools.pairwise(levels):
        if cur["output_tokens_per_s"] < gain * prev["output_tokens_per_s"]:
            return int(prev["concurrency"])
    return None


# --------------------------------------------------------------------------- systems


class Managed:
    """A server process this bench starts, waits for and stops (with everything it spawned)."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, ready_timeout_s: float, log: Log) -> None:
        self.name, self.log = name, log
        self.log_file = log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self.log_file, text=True, start_new_session=True
        )
        box: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                box.append(line.strip())
                return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(ready_timeout_s)
        if not box or not box[0].startswith("http"):
            self.stop()
            raise ServeError(f"{name} did not start in {ready_timeout_s:.0f} s; see {log_path}")
        self.url = box[0]

    def stop(self, timeout_s: float = 180) -> list[int]:
        """Ctrl-C the server, wait for it, then kill whatever of its session outlived it.

        Returns the pids that had to be killed (empty when it cleaned up after itself)."""
        import psutil

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
        time.sleep(1)
        killed = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == self.proc.pid and p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
                    killed.append(p.pid)
            except (psutil.Error, OSError):
                continue
        self.log_file.close()
        return killed


def start_stack(port: int, workdir: Path, log: Log) -> Managed:
    log(f"starting the stack on port {port} (a few minutes on CPU) ...")
    cmd = [sys.executable, "-m", "rag.cli", "serve", "--port", str(port), "--metrics-port", str(port + 2)]
    return Managed("the stack", cmd, workdir / "stack.log", 1200, log)


def start_baseline(model_dir: str, port: int, workdir: Path, log: Log) -> Managed:
    from rag.stack.hardware import detect

    dtype = detect().dtype  # the stack's own choice, so the ratio compares like with like
    log(f"starting the one-at-a-time baseline on port {port} ({dtype}) ...")
    cmd = [sys.executable, "-m", "rag.baseline", "--model", model_dir, "--port", str(port), "--dtype", dtype]
    return Managed("the baseline", cmd, workdir / "baseline.log", 600, log)


# --------------------------------------------------------------------------- extras


def embeddings_throughput(
    base_url: str, model: str, batch_sizes: Sequence[int], texts: int = 256
) -> list[dict[str, Any]]:
    """texts/s for /v1/embeddings at each batch size, 4 requests in flight."""
    corpus = workload(texts, 7, words=(20, 60))
    out = []
    with httpx.Client(base_url=base_url, timeout=600, headers=_auth()) as client:
        for b in batch_sizes:
            batches = [corpus[i : i + b] for i in range(0, len(corpus), b)]
            start = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                list(
                    pool.map(
                        lambda batch: client.post(
                            "/embeddings", json={"model": model, "input": batch}
                        ).raise_for_status(),
                        batches,
                    )
                )
            wall = time.perf_counter() - start
            out.append({"batch_size": b, "texts": len(corpus), "texts_per_s": round(len(corpus) / wall, 2)})
    return out


def score_throughput(base_url: str, model: str, requests: int = 16, pairs: int = 8) -> dict[str, Any]:
    """pairs/s for /v1/score: `requests` requests of `pairs` documents each, 4 in flight."""
    docs = workload(requests * pairs, 11, words=(30, 80))
    with httpx.Client(base_url=base_url, timeout=600, headers=_auth()) as client:
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(
                pool.map(
                    lambda i: client.post(
                        "/score",
                        json={
                            "model": model,
                            "text_1": "how is memory split?",
                            "text_2": docs[i * pairs : (i + 1) * pairs],
                        },
                    ).raise_for_status(),
                    range(requests),
                )
            )
        wall = time.perf_counter() - start
    return {
        "requests": requests,
        "pairs_per_request": pairs,
        "pairs_per_s": round(requests * pairs / wall, 2),
    }


def ask_latency(
    base_url: str, corpus: Path, questions: Sequence[str], concurrencies: Sequence[int], workdir: Path
) -> list[dict[str, Any]]:
    """Mean seconds per `rag ask` stage at each concurrency, over an index of `corpus`."""
    import dataclasses

    from rag.client import StackClient
    from rag.index import build, load_index
    from rag.pipeline import Pipeline
    from rag.settings import Settings

    s = dataclasses.replace(Settings.from_env(), base_url=base_url.rstrip("/"), index_dir=workdir / "index")
    with StackClient(s) as client:
        build([corpus], s.index_dir, client, s.embed_model)
        pipe = Pipeline(s, client, load_index(s.index_dir))
        out = []
        for c in concurrencies:
            qs = [questions[i % len(questions)] for i in range(max(c, len(questions)))]
            start = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                answers = list(pool.map(pipe.ask, qs))
            wall = time.perf_counter() - start
            stages = sorted({k for a in answers for k in a.timings})
            out.append(
                {
                    "concurrency": c,
                    "questions": len(qs),
                    "wall_s": round(wall, 2),
                    "mean_stage_s": {
                        k: round(statistics.mean(a.timings.get(k, 0.0) for a in answers), 4) for k in stages
                    },
                    "blocked": sum(1 for a in answers if a.blocked),
                }
            )
    return out


def overload(base_url: str, model: str, factor: int = 10, max_tokens: int = 16) -> dict[str, Any]:
    """`factor` x the engine's batch in concurrent chat requests, all at once.

    How many were served, how many refused (429/503, as the bounded queue should),
    how fast a refusal came back, and /v1/models latency meanwhile (the ingress must
    stay responsive). Every request has a deadline, so a hang shows as `hung`.
    """
    with httpx.Client(base_url=base_url, timeout=30, headers=_auth()) as client:
        cards = client.get("/models").raise_for_status().json()["data"]
    facts: dict[str, Any] = next(
        (c.get("metadata", {}).get("rag", {}) for c in cards if c["id"] == model), {}
    )
    batch = int(facts.get("limits", {}).get("batch", 0))
    if batch <= 0:
        raise ServeError(f"{base_url}/models does not give `{model}`'s batch (metadata.rag.limits.batch)")
    n = factor * batch
    prompts = workload(n, 5, words=(10, 30))
    deadline_s = 900.0

    async def run() -> dict[str, Any]:
        # aiohttp (Ray's own HTTP client), not httpx: at 640 connections httpx's async client
        # spent 10 s of CPU itself on 2 cores, and the measurement measured the client.
        import aiohttp

        root = base_url.rstrip("/")
        timeout = aiohttp.ClientTimeout(total=deadline_s)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=_auth()) as http:
            done = asyncio.Event()
            models_s: list[float] = []

            async def poll_models() -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(f"{root}/models") as r:
                            await r.read()
                            if r.status == 200:
                                models_s.append(time.perf_counter() - t)
                    await asyncio.sleep(0.25)

            async def one(prompt: str) -> tuple[int, float, str]:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
                t = time.perf_counter()
                try:
                    async with http.post(f"{root}/chat/completions", json=body) as r:
                        await r.read()
                        return r.status, time.perf_counter() - t, r.headers.get("retry-after", "")
                except TimeoutError:
                    return -1, time.perf_counter() - t, ""
                except aiohttp.ClientError:
                    return -2, time.perf_counter() - t, ""

            poller = asyncio.create_task(poll_models())
            start = time.perf_counter()
            results = await asyncio.gather(*(one(p) for p in prompts))
            wall = time.perf_counter() - start
            done.set()
            await poller

        served = [s for code, s, _ in results if code == 200]
        refused = [s for code, s, _ in results if code in (429, 503)]
        retry_after = sorted({ra for code, _, ra in results if code in (429, 503) and ra})

        def pct(xs: list[float], q: float) -> float | None:
            return round(sorted(xs)[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None

        return {
            "engine": model,
            "batch": batch,
            "concurrent": n,
            "served": len(served),
            "refused": len(refused),
            "other_status": sorted({code for code, _, _ in results if code not in (200, 429, 503, -1, -2)}),
            "hung": sum(1 for code, _, _ in results if code == -1),
            "connection_errors": sum(1 for code, _, _ in results if code == -2),
            "refusal_p50_s": pct(refused, 0.5),
            "refusal_max_s": round(max(refused), 3) if refused else None,
            "retry_after_s": retry_after,
            "served_p50_s": pct(served, 0.5),
            "served_max_s": round(max(served), 3) if served else None,
            "models_p50_s": pct(models_s, 0.5),
            "models_max_s": round(max(models_s), 3) if models_s else None,
            "models_polls": len(models_s),
            "wall_s": round(wall, 2),
        }

    return asyncio.run(run())


def query_overhead(
    workdir: Path, chunks: int = 100_000, dim: int = 384, queries: int = 200
) -> dict[str, Any]:
    """What a query costs besides the model calls, on a synthetic index of `chunks` chunks.

    Warm (one process, index open, five untimed queries first to map its pages):
    lexical, dense and fused top-20 per query, p50 and p95 in ms. Cold: a whole
    `rag search --mode lexical --no-rerank` process, start to exit (Python, imports,
    opening the index, one query), seconds.
    """
    from rag.chunk import Chunk, Chunker
    from rag.index import _write, load_index
    from rag.retrieve import dense, fuse

    rng = random.Random(0)
    vocab = [f"term{i}" for i in range(20_000)]
    items = [
        Chunk(
            id=f"c{i}",
            path=f"page{i // 40}.html",
            title="Manual",
            heading="Reference > Settings",
            text=" ".join(rng.choice(vocab) for _ in range(rng.randint(40, 160))),
        )
        for i in range(chunks)
    ]
    vectors = np.random.default_rng(0).standard_normal((chunks, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    folder = workdir / "overhead-index"
    start = time.perf_counter()
    _write(folder, items, vectors, "embed", vectors[0], {}, str(workdir), Chunker())
    write_s = time.perf_counter() - start
    del items

    start = time.perf_counter()
    index = load_index(folder)
    _ = index.bm25  # opened on first lexical query otherwise
    open_ms = (time.perf_counter() - start) * 1000
    texts = [" ".join(rng.choice(vocab) for _ in range(6)) for _ in range(queries)]
    qvecs = [vectors[rng.randrange(chunks)] for _ in range(queries)]
    for text, qv in zip(texts[:5], qvecs[:5], strict=True):
        fuse(index.chunks, index.vectors, index.bm25, text, qv, 20)
    timings: dict[str, list[float]] = {"lexical": [], "dense": [], "fused": []}
    for text, qv in zip(texts, qvecs, strict=True):
        t0 = time.perf_counter()
        index.bm25.top(text, 20)
        t1 = time.perf_counter()
        dense(index.chunks, index.vectors, qv, 20)
        t2 = time.perf_counter()
        fuse(index.chunks, index.vectors, index.bm25, text, qv, 20)
        t3 = time.perf_counter()
        for name, seconds in (("lexical", t1 - t0), ("dense", t2 - t1), ("fused", t3 - t2)):
            timings[name].append(seconds * 1000)

    env = {**os.environ, "RAG_INDEX_DIR": str(folder), "RAG_BASE_URL": "http://127.0.0.1:9/v1"}
    cmd = [sys.executable, "-m", "rag.cli", "search", texts[0], "--mode", "lexical", "--no-rerank", "--json"]
    cold = []
    for _ in range(3):
        t = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        cold.append(time.perf_counter() - t)
        if done.returncode != 0:
            raise ServeError(f"rag search on the synthetic index failed: {done.stderr[-300:]}")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    python_s = time.perf_counter() - t

    def pct(xs: list[float], q: float) -> float:
        return round(sorted(xs)[min(len(xs) - 1, int(q * len(xs)))], 2)

    return {
        "chunks": chunks,
        "dim": dim,
        "write_s": round(write_s, 2),
        "open_ms": round(open_ms, 1),
        **{f"{name}_p50_ms": pct(xs, 0.5) for name, xs in timings.items()},
        **{f"{name}_p95_ms": pct(xs, 0.95) for name, xs in timings.items()},
        "cold_search_s": round(statistics.median(cold), 2),
        "python_start_s": round(python_s, 2),
    }


# --------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import psutil

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def markdown(report: dict[str, Any]) -> str:
    """The sweep as a markdown table, ours beside the baseline."""
    systems = report["systems"]
    names = list(systems)
    m = report["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB. "
        f"Workload: seed {report['seed']}, {report['max_tokens']} output tokens per request (ignore_eos), "
        "prompts of 40-160 words.",
        "",
        "| concurrency | "
        + " | ".join(
            f"{n} tok/s | {n} req/s | {n} TTFT p50/p95 s | {n} latency p50/p95/p99 s | {n} errors"
            for n in names
        )
        + (" | ours/baseline tok/s |" if {"ours", "baseline"} <= set(names) else " |"),
        "|---" * (1 + 5 * len(names) + ({"ours", "baseline"} <= set(names))) + "|",
    ]
    by_c = {n: {lv["concurrency"]: lv for lv in systems[n]["levels"]} for n in names}
    for c in sorted({c for n in names for c in by_c[n]}):
        cells = [str(c)]
        for n in names:
            lv = by_c[n].get(c)
            if lv is None:
                cells += ["-"] * 5
                continue
            cells += [
                f"{lv['output_tokens_per_s']:.1f}",
                f"{lv['rps']:.2f}",
                f"{lv['ttft_p50_s']}/{lv['ttft_p95_s']}",
                f"{lv['latency_p50_s']}/{lv['latency_p95_s']}/{lv['latency_p99_s']}",
                str(lv["errors"]),
            ]
        if {"ours", "baseline"} <= set(names):
            o, b = by_c["ours"].get(c), by_c["baseline"].get(c)
            cells.append(
                f"{o['output_tokens_per_s'] / b['output_tokens_per_s']:.1f}x"
                if o and b and b["output_tokens_per_s"]
                else "-"
            )
        lines.append("| " + " | ".join(cells) + " |")
    for n in names:
        k = systems[n].get("knee")
        lines.append(
            f"\n{n}: throughput "
            + (f"stops growing after concurrency {k}." if k else "still growing at the last level.")
        )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Throughput and p95 latency against concurrency, both systems."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = report["machine"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, sys_ in report["systems"].items():
        cs = [lv["concurrency"] for lv in sys_["levels"]]
        a.plot(cs, [lv["output_tokens_per_s"] for lv in sys_["levels"]], marker="o", label=name)
        b.plot(cs, [lv["latency_p95_s"] for lv in sys_["levels"]], marker="o", label=name)
    for ax, title, ylabel in (
        (a, "Output throughput", "tokens/s"),
        (b, "End-to-end latency, p95", "seconds"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    b.set_yscale("log")
    fig.suptitle(
        f"chat engine vs one-at-a-time generate ({m['cpu']}, {m['cores']} cores)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(levels: list[LevelResult]) -> dict[str, Any]:
    rows = [lv.summary() for lv in levels]
    return {"levels": rows, "knee": knee(rows)}


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(markdown(report))
    plot(report, out / "bench.png")
