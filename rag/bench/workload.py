"""The load generator: seeded prompts, streamed chat requests, a sweep over concurrency.

Every request streams, so time to first token is measured at the first content
chunk; `ignore_eos` fixes every answer's length at `max_tokens` on every system, so
output tokens/s compare like with like. A level runs its requests from
`concurrency` workers over one connection pool; a failed request is counted, not
fatal.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rag.bench.stats import percentile
from rag.sse import event

__all__ = ["LevelResult", "auth_header", "knee", "run_sweep", "summarize", "workload"]

Log = Callable[[str], None]

_WORDS = (
    "engine memory batch token cache request model guard score embed index chunk query answer source "
    "latency throughput card share budget layer head vector document retrieval rerank prompt stream "
    "server client config deploy profile worker replica ingress schedule queue kernel tensor weight"
).split()


def auth_header() -> dict[str, str]:
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
        """The level as one row of bench.json."""
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "wall_s": round(self.wall_s, 3),
            "rps": round(self.rps, 4),
            "output_tokens_per_s": round(self.tokens_per_s, 2),
            **{f"ttft_p{q}_s": percentile(self.ttft_s, q, 4) for q in (50, 95, 99)},
            **{f"latency_p{q}_s": percentile(self.latency_s, q, 4) for q in (50, 95, 99)},
        }


async def _one(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int
) -> tuple[float, float, int]:
    """One streamed chat request: (time to first content, latency, output tokens)."""
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
            chunk = event(line)
            if chunk is None:
                continue
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
    async with httpx.AsyncClient(
        base_url=base_url, timeout=1800, limits=limits, headers=auth_header()
    ) as client:

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
    waves: int = 1,
) -> list[LevelResult]:
    """Every level with max(waves x level, min_requests) requests of the seeded workload,
    after one warm-up. One wave's throughput hangs on the order its prompts reach the
    engine's scheduler (seen: 16 prompts gave the stack 60 tok/s in every one-wave run
    and bare vLLM 70, 16 others 70 and 68); several waves average that out."""
    asyncio.run(_level(base_url, model, workload(2, seed + 999), 2, max_tokens))  # warm-up, not counted
    out = []
    for c in levels:
        prompts = workload(max(waves * c, min_requests), seed + c)
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


def summarize(levels: list[LevelResult]) -> dict[str, Any]:
    """One system's sweep as bench.json holds it: its rows and its knee."""
    rows = [lv.summary() for lv in levels]
    return {"levels": rows, "knee": knee(rows)}
