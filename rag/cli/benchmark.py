"""`rag bench`: the chat engine against one-request-at-a-time generate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from rag.cli.common import CONTEXT, err, friendly, main
from rag.errors import ConfigError
from rag.settings import Settings
from rag.stack.profiles import CPU_MODEL_SETS, cpu_model_set, default_models_dir


@main.command(context_settings=CONTEXT)
@click.option("--levels", default="1,2,4,8,16,32,64", show_default=True, help="Concurrency levels to sweep.")
@click.option(
    "--min-requests",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Requests per level: max(level, this).",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1),
    default=32,
    show_default=True,
    help="Output tokens per request (ignore_eos).",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Workload seed (same prompts on every system)."
)
@click.option(
    "--systems", default="ours,baseline", show_default=True, help="Which to run: ours, baseline or both."
)
@click.option(
    "--ours-url",
    envvar="RAG_BENCH_OURS_URL",
    default=None,
    show_envvar=True,
    help="Use this running stack instead of starting one.",
)
@click.option("--baseline-url", default=None, help="Use this running baseline instead of starting one.")
@click.option(
    "--baseline-model",
    default=None,
    help="Weights (folder or hub id) for the baseline [default: CPU chat folder].",
)
@click.option(
    "--extras/--no-extras",
    default=True,
    show_default=True,
    help="Also embeddings, score and `rag ask` stage latency.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench/results/latest"),
    show_default=True,
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8300,
    show_default=True,
    help="Port for the systems the bench starts.",
)
@friendly
def bench(
    levels: str, min_requests: int, max_tokens: int, seed: int, systems: str, ours_url: str | None,
    baseline_url: str | None, baseline_model: str | None, extras: bool, out: Path, port: int,
) -> None:  # fmt: skip
    """Sweep concurrency against the stack's chat engine and a one-at-a-time baseline.

    Starts each system itself, one after the other so they never share cores,
    runs the same seeded workload on both, and writes bench.json, bench.md and
    bench.png to --out. The baseline is transformers' generate behind a lock,
    on the same weights and dtype.

    \b
    Examples:
      rag bench                                   # full CPU sweep (~20 minutes)
      rag bench --levels 1,2 --min-requests 2 --max-tokens 4 --no-extras
    """
    from rag.bench.probes import (
        ask_latency,
        embeddings_throughput,
        overload,
        query_overhead,
        score_throughput,
    )
    from rag.bench.report import machine, markdown, write
    from rag.bench.systems import start_baseline, start_stack
    from rag.bench.workload import run_sweep, summarize

    try:
        level_list = sorted({int(x) for x in levels.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(
            "a comma-separated list of whole numbers, e.g. 1,2,4", param_hint="--levels"
        ) from None
    chosen = [x.strip() for x in systems.split(",") if x.strip()]
    if not chosen or set(chosen) - {"ours", "baseline"}:
        raise click.BadParameter("ours, baseline or ours,baseline", param_hint="--systems")
    s = Settings.from_env()
    model_dir = baseline_model or default_models_dir() / CPU_MODEL_SETS[cpu_model_set()]["chat"]
    if "baseline" in chosen and not baseline_url and not (Path(model_dir) / "config.json").is_file():
        raise ConfigError(
            f"no model weights in {model_dir} for the baseline; run `rag prepare` or pass --baseline-model"
        )
    work = out / "logs"
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": machine(), "seed": seed, "max_tokens": max_tokens, "levels": level_list,
        "min_requests": min_requests, "systems": {}, "extras": {},
    }  # fmt: skip
    for name in chosen:
        given = ours_url if name == "ours" else baseline_url
        managed = None
        if not given:
            managed = (
                start_stack(port, work, err)
                if name == "ours"
                else start_baseline(str(model_dir), port + 1, work, err)
            )
        url = (given or (managed.url if managed else "")).rstrip("/")
        try:
            err(f"{name}: sweeping {level_list} at {url}")
            model = s.chat_model
            sweep = run_sweep(
                url, model, level_list, min_requests=min_requests, max_tokens=max_tokens, seed=seed, log=err
            )
            report["systems"][name] = summarize(sweep)
            if name == "ours" and extras:
                err("ours: embeddings, score and rag ask latency")
                report["extras"]["embeddings"] = embeddings_throughput(url, s.embed_model, [1, 8, 32, 128])
                report["extras"]["score"] = score_throughput(url, s.score_model)
                qs = [
                    json.loads(line)["question"]
                    for line in Path("eval/dev.jsonl").read_text().splitlines()[:8]
                ]
                report["extras"]["ask"] = ask_latency(url, Path("corpus"), qs, [1, 8], work)
                err("ours: overload, 10x the chat engine's batch at once")
                report["extras"]["overload"] = overload(url, s.chat_model)
                err("query overhead on a synthetic index of 100k chunks")
                report["extras"]["query_overhead"] = query_overhead(work)
        finally:
            if managed:
                managed.stop()
    if {"ours", "baseline"} <= set(report["systems"]):
        o = {lv["concurrency"]: lv for lv in report["systems"]["ours"]["levels"]}
        base = {lv["concurrency"]: lv for lv in report["systems"]["baseline"]["levels"]}
        ratio_16 = ttft_1 = None
        if 16 in o and 16 in base:
            ratio_16 = round(o[16]["output_tokens_per_s"] / base[16]["output_tokens_per_s"], 2)
        if 1 in o and 1 in base:
            ttft_1 = round(o[1]["ttft_p50_s"] / base[1]["ttft_p50_s"], 2)
        report["targets"] = {
            "tokens_per_s_ratio_at_16": ratio_16,
            "ttft_ratio_at_1": ttft_1,
            "want": {"tokens_per_s_ratio_at_16": ">= 10", "ttft_ratio_at_1": "<= 1.2"},
        }
    write(report, out)
    click.echo(markdown(report))
    err(f"wrote {out}/bench.json, bench.md and bench.png")
