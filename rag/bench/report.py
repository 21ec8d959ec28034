"""The report: what the numbers were measured on, and the three files `rag bench` writes.

bench.json holds everything; bench.md is the sweep as a table, a column per
system (ours, bare vLLM, the one-at-a-time baseline) with ours / bare and ours /
baseline per level; bench.png plots throughput and p95 latency against concurrency.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from rag.bench.compute import describe

__all__ = ["machine", "markdown", "plot", "ratio", "targets", "write"]

_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")  # what decides the CPU's dtype and speed


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import psutil

    cpu = platform.processor()
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_flags": [f for f in _FLAGS if f in flags],
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def ratio(report: dict[str, Any], a: str, b: str, key: str, c: int) -> float | None:
    """System a's `key` over system b's at concurrency c (None when either is missing)."""
    by = {n: {lv["concurrency"]: lv for lv in sys_["levels"]} for n, sys_ in report["systems"].items()}
    x, y = by.get(a, {}).get(c, {}).get(key), by.get(b, {}).get(c, {}).get(key)
    return round(x / y, 3) if x is not None and y else None


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 18's targets, from this run: ours / bare throughput at every level and TTFT at 1."""
    levels = report["levels"]
    tok = {c: ratio(report, "ours", "bare", "output_tokens_per_s", c) for c in levels}
    known = [r for r in tok.values() if r is not None]
    return {
        "ours_over_bare_tokens_per_s": tok,
        "ours_over_bare_ttft_p50_at_1": ratio(report, "ours", "bare", "ttft_p50_s", 1),
        "ours_over_baseline_tokens_per_s": {
            c: ratio(report, "ours", "baseline", "output_tokens_per_s", c) for c in levels
        },
        "worst_ours_over_bare_tokens_per_s": min(known) if known else None,
        "want": {
            "ours_over_bare_tokens_per_s": ">= 0.95 at every level",
            "ours_over_bare_ttft_p50_at_1": "<= 1.15",
        },
    }


def markdown(report: dict[str, Any]) -> str:
    """The sweep as markdown: throughput, ratios, TTFT and latency per level, a column per system."""
    systems = report["systems"]
    names = list(systems)
    m = report["machine"]
    flags = ", ".join(m.get("cpu_flags", [])) or "none of amx_bf16/avx512_bf16/avx512f/avx2"
    by_c = {n: {lv["concurrency"]: lv for lv in systems[n]["levels"]} for n in names}
    pairs = [(a, b) for a, b in (("ours", "bare"), ("ours", "baseline")) if {a, b} <= set(names)]
    lines = [
        f"Machine: {m['cpu']} ({flags}), {m['cores']} cores, {m['memory_gib']} GiB. "
        f"Workload: seed {report['seed']}, {report['max_tokens']} output tokens per request (ignore_eos), "
        f"prompts of 40-160 words, max({report.get('waves', 1)} x concurrency, "
        f"{report.get('min_requests', '?')}) requests per level (the baseline: 1 x).",
        "",
        "| concurrency | "
        + " | ".join(f"{n} tok/s" for n in names)
        + "".join(f" | {a}/{b} tok/s" for a, b in pairs)
        + " | "
        + " | ".join(f"{n} TTFT p50/p95 s" for n in names)
        + " | "
        + " | ".join(f"{n} latency p50/p95 s" for n in names)
        + " | errors |",
        "|---" * (2 + 3 * len(names) + len(pairs)) + "|",
    ]

    def cell(n: str, c: int, fmt: Any) -> str:
        lv = by_c[n].get(c)
        return fmt(lv) if lv else "-"

    for c in sorted({c for n in names for c in by_c[n]}):
        cells = [str(c)]
        cells += [cell(n, c, lambda lv: f"{lv['output_tokens_per_s']:.1f}") for n in names]
        for a, b in pairs:
            r = ratio(report, a, b, "output_tokens_per_s", c)
            cells.append(f"{r:.2f}x" if r is not None else "-")
        cells += [cell(n, c, lambda lv: f"{lv['ttft_p50_s']}/{lv['ttft_p95_s']}") for n in names]
        cells += [cell(n, c, lambda lv: f"{lv['latency_p50_s']}/{lv['latency_p95_s']}") for n in names]
        cells.append("/".join(cell(n, c, lambda lv: str(lv["errors"])) for n in names))
        lines.append("| " + " | ".join(cells) + " |")
    t = report.get("targets") or {}
    if t.get("ours_over_bare_ttft_p50_at_1") is not None:
        lines.append(
            f"\nours / bare: worst throughput ratio {t['worst_ours_over_bare_tokens_per_s']}x "
            f"(want >= 0.95), TTFT p50 at concurrency 1 {t['ours_over_bare_ttft_p50_at_1']}x (want <= 1.15)."
        )
    lines.append("\nThreads and cores, as told and as run (the busiest process's busy threads):\n")
    lines += [f"- {n}: {describe(systems[n]['compute'])}" for n in names if systems[n].get("compute")]
    for n in names:
        k = systems[n].get("knee")
        lines.append(
            f"\n{n}: throughput "
            + (f"stops growing after concurrency {k}." if k else "still growing at the last level.")
        )
    rr = (report.get("extras") or {}).get("rerank")
    if rr:
        lines.append(
            f"\nRerank stage, the fused top {rr['candidates']} of {rr['questions']} dev questions through "
            f"/v1/score, one at a time: p50 {rr['p50_s']} s, p95 {rr['p95_s']} s."
        )
    ask = (report.get("extras") or {}).get("first_shown")
    if ask:
        lines.append(
            f"\n`rag ask`, time to the first shown word over {ask['questions']} dev questions, one at a "
            f"time: p50 {ask['p50_s']} s, p95 {ask['p95_s']} s."
        )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Throughput and p95 latency against concurrency, every system."""
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
        f"the stack's chat engine, bare vLLM and one-at-a-time generate ({m['cpu']}, {m['cores']} cores)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(report: dict[str, Any], out: Path) -> None:
    """bench.json, bench.md and bench.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(markdown(report))
    plot(report, out / "bench.png")
