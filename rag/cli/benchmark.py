"""`rag bench`: the stack's chat engine against bare vLLM and one-request-at-a-time generate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from rag.cli.common import CONTEXT, deploy_file_option, err, friendly, main
from rag.errors import ConfigError
from rag.settings import Settings
from rag.stack.profiles import CPU_MODEL_SETS, cpu_model_set, default_models_dir

SYSTEMS = ("ours", "bare", "baseline")


@main.command(context_settings=CONTEXT)
@click.option("--levels", default="1,2,4,8,16,32,64", show_default=True, help="Concurrency levels to sweep.")
@click.option(
    "--min-requests",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Requests per level: at least this many.",
)
@click.option(
    "--waves",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Requests per level: at least this many times the level (the baseline, one at a time: 1).",
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
    "--systems",
    default="ours,bare,baseline",
    show_default=True,
    help="Which to run, in order: any of ours (the stack), bare (vLLM's own server) and baseline.",
)
@click.option(
    "--ours-url",
    envvar="RAG_BENCH_OURS_URL",
    default=None,
    show_envvar=True,
    help="Use this running stack instead of starting one.",
)
@click.option(
    "--bare-url", default=None, help="Use this running bare vLLM (model `chat`) instead of starting one."
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
@deploy_file_option(
    "Deploy descriptor naming the serve module whose chat engine bare vLLM copies.", dest="deploy_file"
)
@friendly
def bench(
    levels: str, min_requests: int, waves: int, max_tokens: int, seed: int, systems: str,
    ours_url: str | None, bare_url: str | None, baseline_url: str | None, baseline_model: str | None,
    extras: bool, out: Path, port: int, deploy_file: Path,
) -> None:  # fmt: skip
    """Sweep concurrency against the stack's chat engine, bare vLLM and a one-at-a-time baseline.

    Starts each system itself, one after the other so they never share cores,
    runs the same seeded workload on each, and writes bench.json, bench.md and
    bench.png to --out with ours / bare and ours / baseline per level. Bare vLLM
    is vLLM's own OpenAI server with the chat engine's settings from the serve
    module (what you would run without the stack); the baseline is
    transformers' generate behind a lock, on the same weights and dtype.

    \b
    Examples:
      rag bench                                   # full CPU sweep (~30 minutes)
      rag bench --systems ours,bare --no-extras   # just the cost of the stack
      rag bench --levels 1,2 --min-requests 2 --max-tokens 4 --no-extras
    """
    from rag.bench.compute import Watch
    from rag.bench.probes import (
        ask_latency,
        ask_pipeline,
        embeddings_throughput,
        first_shown,
        overload,
        query_overhead,
        rerank_stage,
        score_throughput,
    )
    from rag.bench.report import machine, markdown, targets, write
    from rag.bench.systems import chat_config, declared, start_bare, start_baseline, start_stack
    from rag.bench.workload import run_sweep, summarize
    from rag.stack.preflight import load_deploy

    try:
        level_list = sorted({int(x) for x in levels.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(
            "a comma-separated list of whole numbers, e.g. 1,2,4", param_hint="--levels"
        ) from None
    chosen = list(dict.fromkeys(x.strip() for x in systems.split(",") if x.strip()))
    if not chosen or set(chosen) - set(SYSTEMS):
        raise click.BadParameter(
            f"a comma-separated list of {', '.join(SYSTEMS)} (got {systems!r})", param_hint="--systems"
        )
    s = Settings.from_env()
    model_dir = baseline_model or default_models_dir() / CPU_MODEL_SETS[cpu_model_set()]["chat"]
    if "baseline" in chosen and not baseline_url and not (Path(model_dir) / "config.json").is_file():
        raise ConfigError(
            f"no model weights in {model_dir} for the baseline; run `rag prepare` or pass --baseline-model"
        )
    module_path = load_deploy(deploy_file).module_path
    told = declared(chat_config(module_path))
    work = out / "logs"
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": machine(), "seed": seed, "max_tokens": max_tokens, "levels": level_list,
        "min_requests": min_requests, "waves": waves, "systems": {}, "extras": {},
    }  # fmt: skip
    for name in chosen:
        given = {"ours": ours_url, "bare": bare_url, "baseline": baseline_url}[name]
        managed = None
        if not given:
            if name == "ours":
                managed = start_stack(port, work, err)
            elif name == "bare":
                managed = start_bare(module_path, port + 3, work, err)
            else:
                managed = start_baseline(str(model_dir), port + 1, work, err, module_path)
        url = (given or (managed.url if managed else "")).rstrip("/")
        try:
            err(f"{name}: sweeping {level_list} at {url}")
            model = s.chat_model
            watch = Watch(managed.processes if managed else list)
            watch.start()
            sweep = run_sweep(
                url, model, level_list, min_requests=min_requests, max_tokens=max_tokens, seed=seed, log=err,
                waves=1 if name == "baseline" else waves,  # one at a time: the order changes nothing
            )  # fmt: skip
            report["systems"][name] = summarize(sweep) | {"compute": watch.report(told[name])}
            if name == "ours" and extras:
                err("ours: embeddings, score and rag ask latency")
                report["extras"]["embeddings"] = embeddings_throughput(url, s.embed_model, [1, 8, 32, 128])
                report["extras"]["score"] = score_throughput(url, s.score_model)
                qs = [
                    json.loads(line)["question"] for line in Path("eval/dev.jsonl").read_text().splitlines()
                ]
                with ask_pipeline(url, Path("corpus"), work) as pipe:
                    # First, while no question has been asked: a repeated one would find its
                    # prompts in the engines' prefix caches and come back sooner.
                    err(f"ours: rag ask's first shown word over {len(qs)} dev questions")
                    report["extras"]["first_shown"] = first_shown(pipe, qs)
                    report["extras"]["ask"] = ask_latency(pipe, qs[:8], [1, 8])
                    report["extras"]["rerank"] = rerank_stage(pipe, qs)
                err("ours: overload, 10x the chat engine's batch at once")
                report["extras"]["overload"] = overload(url, s.chat_model)
                err("query overhead on a synthetic index of 100k chunks")
                report["extras"]["query_overhead"] = query_overhead(work)
        finally:
            if managed:
                managed.stop()
    report["targets"] = targets(report)
    write(report, out)
    click.echo(markdown(report))
    err(f"wrote {out}/bench.json, bench.md and bench.png")
