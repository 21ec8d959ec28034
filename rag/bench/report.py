"""The report: what the numbers were measured on, and the three files `rag bench` writes.

bench.json holds everything; bench.md is the sweep as a table, ours beside the
baseline with their ratio; bench.png plots throughput and p95 latency against
concurrency.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["machine", "markdown", "plot", "write"]


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


def write(report: dict[str, Any], out: Path) -> None:
    """bench.json, bench.md and bench.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(markdown(report))
    plot(report, out / "bench.png")
