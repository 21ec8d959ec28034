"""Asking commands: index, search, ask, chat and eval over the running stack."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click

from rag.answer import format_sources
from rag.attribute import UNSUPPORTED
from rag.chunk import Chunker
from rag.cli._common import CONTEXT, err, friendly, main
from rag.client import StackClient
from rag.errors import ConfigError
from rag.guard import GUARD_FORMATS
from rag.ingest import require_paths
from rag.pipeline import MODES, RERANK_MODES, Answer, Pipeline
from rag.retrieve import Hit
from rag.served import FactsClient
from rag.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])


def stack_options(fn: F) -> F:
    """--base-url, --api-key and --index, each with its env var."""
    fn = click.option(
        "--index", "index_dir", type=click.Path(file_okay=False, path_type=Path), envvar="RAG_INDEX_DIR",
        default=None, show_envvar=True, help="Index folder [default: .rag/index].",
    )(fn)  # fmt: skip
    fn = click.option(
        "--api-key",
        default=None,
        help="The key `rag serve` was given [default: the first of RAG_API_KEY, else of the "
        "file RAG_API_KEY_FILE names]. `ps` shows this option: prefer the env vars.",
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
    # Empty: the server says (rag/served.py).
    if s.rerank_mode and s.rerank_mode not in RERANK_MODES:
        raise ConfigError(
            f"rerank mode {s.rerank_mode!r}: choose one of {', '.join(RERANK_MODES)} (RAG_RERANK_MODE)"
        )
    if s.guard_format and s.guard_format not in GUARD_FORMATS:
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
    client = StackClient(s, on_wait=err)
    return client, Pipeline(s, client, index)


def _given_tokenizer(path: Path) -> str:
    """The tokenizer.json that --tokenizer names (a file or its model's folder)."""
    from rag.chunk import Tokens

    found = Tokens.find([path.expanduser()])
    if found is None:
        raise ConfigError(
            f"no tokenizer.json at {path}; pass the embedding model's folder or its tokenizer.json "
            "(or leave --tokenizer out to use the served embedding model's)"
        )
    return str(found)


def _served_tokenizer(client: FactsClient, embed_model: str) -> str | None:
    """The tokenizer.json of the model the server embeds with, found on this machine.

    The server lists each model's source in /v1/models (metadata.rag.source): a folder
    (the CPU profile's prepared model) or a hub name, looked up in the Hugging Face
    cache. None, said on stderr, when neither is here: sizes are then estimated."""
    import os

    from rag.chunk import Tokens

    source = client.facts().get(embed_model, {}).get("source")
    found = None
    if isinstance(source, str) and source:
        folder = Path(source).expanduser()
        hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
        cached = f"models--{source.replace('/', '--')}/snapshots/*"
        found = Tokens.find([folder] if folder.is_dir() else sorted(hub.glob(cached)))
    if found is None:
        err(
            f"no tokenizer.json here for the served `{embed_model}` model ({source or 'no source listed'}): "
            "chunk sizes are estimated (pass --tokenizer)"
        )
        return None
    return str(found)


@main.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@stack_options
@click.option(
    "--max-tokens",
    type=click.IntRange(32, 8192),
    default=Chunker.max_tokens,
    show_default=True,
    envvar="RAG_CHUNK_TOKENS",
    show_envvar=True,
    help="Chunk size in the embedding model's tokens, context line included; keep it within the "
    "model's window (256 for the CPU profile's all-MiniLM-L6-v2, 512 for bge-small).",
)
@click.option(
    "--overlap",
    type=click.IntRange(0, 1024),
    default=Chunker.overlap,
    show_default=True,
    envvar="RAG_CHUNK_OVERLAP",
    show_envvar=True,
    help="Tokens of a section's previous chunk repeated at the start of the next.",
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    envvar="RAG_TOKENIZER",
    show_envvar=True,
    default=None,
    help="The embedding model's tokenizer.json (or its folder), to count chunk sizes "
    "[default: that of the model the server embeds with, by the source /v1/models lists; "
    "an estimate if it is not on this machine].",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(1),
    default=None,
    envvar="RAG_INDEX_JOBS",
    show_envvar=True,
    help="Processes that parse and chunk files [default: one per core].",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="local",
    default=None,
    envvar="RAG_RAY_ADDRESS",
    show_envvar=True,
    metavar="[ADDRESS]",
    help="Run parsing and embedding as a Ray Data pipeline: `--ray` alone on a private local Ray, "
    "`--ray ray://HEAD:10001` (or `auto`) on a cluster whose nodes all see PATHS and the stack's URL.",
)
@click.option(
    "--embed-actors",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="With --ray: embedding requests in flight (more where the stack runs more `embed` replicas).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the build summary as JSON.")
@friendly
def index(
    paths: tuple[Path, ...], base_url: str | None, api_key: str | None, index_dir: Path | None,
    max_tokens: int, overlap: int, tokenizer: Path | None, jobs: int | None, ray_address: str | None,
    embed_actors: int, as_json: bool,
) -> None:  # fmt: skip
    """Index folders (recursively) or files: .md .txt .rst .html .pdf.

    HTML keeps only the page's main content (no navigation, sidebars, footers or
    permalink signs) and each chunk keeps its heading path; a source file
    published beside its HTML page (Sphinx's _sources/, x.txt next to x.html) is
    indexed once. A second run embeds only new or changed chunks and drops
    deleted files; an interrupted run leaves the previous index usable. The
    lexical (BM25) index is built here too and stored beside the vectors, so
    queries open both in milliseconds. Without PATHS, indexes ./corpus (the
    stack's own documentation).

    \b
    Examples:
      rag index corpus/
      rag index ~/notes handbook.pdf --index ~/.rag/notes
      rag index /usr/share/doc/git-doc --index .rag/git-doc
      rag index big-docs/ --ray                   # Ray Data on a local Ray
      rag index /shared/docs --ray ray://head:10001  # ... on a Ray cluster
    """
    from contextlib import nullcontext

    from rag.index import LocalRunner, Runner, build

    if overlap >= max_tokens:
        raise click.BadParameter("must be smaller than --max-tokens", param_hint="--overlap")
    if not paths:
        if not Path("corpus").is_dir():
            raise ConfigError("say what to index: `rag index PATH` (no ./corpus here to default to)")
        paths = (Path("corpus"),)
    s = _settings(base_url, api_key, index_dir)
    require_paths(paths)  # a wrong path is told before any server is asked
    given = _given_tokenizer(tokenizer) if tokenizer else None
    with StackClient(s, on_wait=err) as client:
        runner: Runner = LocalRunner(client, parse_workers=jobs)
        context: Any = nullcontext()
        if ray_address:
            from rag.index_ray import RayRunner

            runner = context = RayRunner(s, ray_address, embed_actors=embed_actors)
        with context:
            if ray_address:
                err(f"indexing on Ray ({'a local instance' if ray_address == 'local' else ray_address})")
            chunker = Chunker(max_tokens, overlap, given or _served_tokenizer(client, s.embed_model))
            stats = build(
                list(paths), s.index_dir, client, s.embed_model, chunker=chunker, runner=runner,
                progress=_progress("embedding chunks"), parse_progress=_progress("reading files"),
            )  # fmt: skip
    if as_json:
        click.echo(json.dumps({"index": str(s.index_dir), **stats.as_dict()}, indent=2))
        return
    if stats.rebuilt_because:
        err(f"rebuilt from scratch: {stats.rebuilt_because}")
    reasons = [f"{n} {why}" for why, n in sorted(stats.skipped.items())]
    if stats.files_duplicate:
        reasons.append(f"{stats.files_duplicate} identical copies of another file")
    skipped = ", ".join(reasons) or "none"
    rate = stats.chunks_embedded / (stats.seconds - stats.parse_seconds or 1.0)
    click.echo(
        f"indexed {stats.files} files ({stats.files_changed} new or changed, {stats.files_removed} removed) "
        f"into {stats.chunks} chunks in {s.index_dir}; read in {stats.parse_seconds:.1f} s, embedded "
        f"{stats.chunks_embedded} in {stats.seconds - stats.parse_seconds:.1f} s ({rate:.0f} chunks/s); "
        f"skipped: {skipped}"
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
        "sentences": [x.as_dict() for x in a.sentences],
        "fallback": None
        if a.fallback is None
        else {
            "n": a.fallback[0].n,
            "path": a.fallback[0].path,
            "heading": a.fallback[0].heading,
            "passage": a.fallback[1],
        },
        "hits": [_hit_json(h) for h in a.hits],
        "guard": [
            {
                "stage": v.stage,
                "safe": v.safe,
                "label": v.label,
                "score": v.score,
                "threshold": v.threshold,
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
    verdict = next((v for v in a.verdicts if v.stage == a.blocked), None)
    why = verdict.why() if verdict else f"{a.blocked} stage"
    return f"refused: the guard blocked the {what} ({why})"


def _print_answer_tail(a: Answer) -> None:
    if a.blocked:
        click.echo(_refusal(a))
        return
    click.echo()
    if a.fallback is not None:
        src, passage = a.fallback
        where = src.path + (f" — {src.heading}" if src.heading else "")
        click.echo(
            f"\nMost of this answer has no support in the sources. What the documents say, "
            f"[{src.n}] {where}:\n" + "\n".join(f"  > {line}" for line in passage.splitlines())
        )
    if any(x.support in ("unsupported", "restates") for x in a.sentences):
        click.echo(f"\n{UNSUPPORTED}: no shown source supports that sentence")
    if a.cited:
        click.echo("\nSources:\n" + format_sources(a.cited))
    elif a.covered:
        click.echo("\n(no source supports this answer) Retrieved:\n" + format_sources(a.sources))


@main.command(context_settings=CONTEXT)
@click.argument("question")
@stack_options
@mode_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Answer, its sentences with their sources, scores, guard verdicts and per-stage timings as JSON.",
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
    """Answer QUESTION from the index, each sentence with the sources that back it.

    The guard checks the question first and the answer before it is shown;
    a refusal names the stage and exits with code 3. Every sentence then
    carries the sources whose text supports it ([1], [2, 3]) or `[no source]`;
    when most of an answer has no support, the passage of the sources that best
    covers the question is quoted under it. --json lists each sentence with
    its sources and support scores (RAG_SUPPORT_THRESHOLD sets the bar).

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
@click.argument("qa_file", type=click.Path(path_type=Path))
@stack_options
@click.option("-k", "k", type=click.IntRange(1), default=5, show_default=True, help="Cut-off for recall@k.")
@click.option(
    "--answers/--no-answers", default=True, show_default=True, help="Also generate answers (slow on CPU)."
)
@click.option(
    "--attribution",
    is_flag=True,
    help="QA_FILE holds hand-labeled answer sentences (eval/attribution-*.jsonl): report how the "
    "attribution rule agrees with the labels, over --index's corpus.",
)
@click.option(
    "--guard",
    is_flag=True,
    help="QA_FILE (or a folder of them, e.g. eval/guard) holds requests and answers labeled harmless or "
    "harmful: report the guard's false- and true-positive rates per stage, ROC AUC and the threshold curve.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Where each question's result goes, as it comes [default: .rag/eval/QA_FILE_STEM.jsonl].",
)  # fmt: skip
@friendly
def evaluate(
    qa_file: Path,
    base_url: str | None,
    api_key: str | None,
    index_dir: Path | None,
    k: int,
    answers: bool,
    attribution: bool,
    guard: bool,
    as_json: bool,
    out: Path | None,
) -> None:
    """Measure retrieval (recall@k, MRR) and answers (keywords, sources, guard blocks), or the guard.

    QA_FILE is JSON lines: {"question": ..., "files": [gold paths], "keywords": [...]}.
    Works on any index and QA file.

    Each question's result is appended to OUT.partial as soon as it is known;
    a finished run renames it to OUT (the last finished run's OUT stays until
    then). A question whose request fails (a timed-out engine, an error
    answer) is recorded with its error and the run goes on.

    \b
    Examples:
      rag eval eval/dev.jsonl
      rag eval my_qa.jsonl --no-answers --json
      rag eval my_qa.jsonl -o results/run1.jsonl
      rag eval eval/attribution-git.jsonl --attribution --index .rag/git-doc
      rag eval eval/guard-heldout --guard     # the guard on requests it was not trained on
    """
    from rag.evaluate import load_qa, run_eval

    s = _settings(base_url, api_key, index_dir)
    out = out or s.index_dir.parent / "eval" / f"{qa_file.stem}{'-guard' if guard else ''}.jsonl"
    if attribution:
        _judge(s, qa_file, as_json)
        return
    if guard:
        _guard_eval(s, qa_file, as_json, out)
        return
    qas = load_qa(qa_file)
    with _Results(out) as record:
        client, pipe = _open(s)
        with client:
            report = run_eval(pipe, qas, k=k, answers=answers, progress=_progress("questions"), record=record)
            record({"summary": {key: v for key, v in report.as_dict().items() if key != "per_question"}})
    if report.failed:
        err(
            f"{len(report.failed)} of {report.questions} questions failed (their errors are in {out}); "
            f"retrieval measures cover the other {report.completed}"
        )
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
        d = report.as_dict()["answers"]

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{100 * v:.0f}%"

        click.echo(
            f"answers: expected keywords {pct(report.keyword_hit_rate)}; of {report.answered} answered, "
            f"{pct(d['answers_with_source_rate'])} carry a source, {pct(d['fallback_rate'])} fell back to a "
            f"quoted passage; sentences with a supporting source {pct(d['citation_recall'])} "
            f"({report.supported}/{report.claims}); attached sources on a gold page "
            f"{pct(report.citation_accuracy)}; not covered {report.not_covered}; "
            f"guard blocks: input {report.guard_blocks['input']}, output {report.guard_blocks['output']}"
        )


class _Results:
    """Each result appended to OUT.partial as it comes; OUT.partial renamed to OUT when the
    run finishes, so an interrupted run keeps what it measured and the last finished OUT."""

    def __init__(self, out: Path) -> None:
        self.out, self.partial = out, out.with_name(out.name + ".partial")
        self.sink: TextIO | None = (
            None  # opened with the first result: a run that fails at once writes nothing
        )

    def __enter__(self) -> Callable[[dict[str, Any]], None]:
        return self.record

    def record(self, row: dict[str, Any]) -> None:
        if self.sink is None:
            try:
                self.partial.parent.mkdir(parents=True, exist_ok=True)
                self.sink = self.partial.open("w", encoding="utf-8")
            except OSError as exc:
                raise ConfigError(
                    f"cannot write results to {self.partial} ({exc.strerror}); pass --out PATH"
                ) from exc
            err(f"writing each result to {self.partial} as it comes")
        self.sink.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.sink.flush()

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self.sink is None:
            return
        self.sink.close()
        if exc_type is None:
            self.partial.replace(self.out)
            err(f"results: {self.out}")


def _judge(s: Settings, labeled_file: Path, as_json: bool) -> None:
    """`rag eval --attribution`: the attribution rule against a person's labels."""
    from rag.evaluate import judge_attribution, load_labeled

    labeled = load_labeled(labeled_file)
    client, pipe = _open(s)
    with client:
        report = judge_attribution(pipe, labeled).as_dict()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(
        f"{report['sentences']} labeled sentences ({report['labeled_supported']} supported by a source), "
        f"support threshold {s.support_threshold}: accuracy {report['accuracy']}, "
        f"sensitivity {report['sensitivity']}, specificity {report['specificity']}, "
        f"attached sources right {report['attached_precision']}, pair ROC AUC {report['pair_auc']:.3f}"
    )


def _guard_eval(s: Settings, cases_path: Path, as_json: bool, out: Path) -> None:
    """`rag eval --guard`: the guard's error rates per stage on labeled cases."""
    from rag.guard_eval import CURVE, load_guard_cases, run_guard_eval
    from rag.served import resolve

    cases = load_guard_cases(cases_path)
    client = StackClient(s, on_wait=err)
    with client, _Results(out) as record:
        s = resolve(s, client)
        pipe = Pipeline(s, client, index=None)  # type: ignore[arg-type]  # the guard needs no index
        report = run_guard_eval(
            pipe.guard, cases, guard_format=s.guard_format,
            thresholds={"input": s.guard_threshold("input"), "output": s.guard_threshold("output")},
            progress=_progress("cases"), record=record,
        )  # fmt: skip
        record({"summary": report.as_dict()})
    d = report.as_dict()
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return

    def pct(v: float | None) -> str:
        return "  n/a" if v is None else f"{100 * v:5.1f}%"

    click.echo(f"guard `{s.guard_model}` ({d['guard_format']} format):")
    click.echo(f"  {'stage':7} {'threshold':>9} {'harmless blocked (FPR)':>23} {'harmful blocked (TPR)':>22} "
               f"{'ROC AUC':>8} {'s/check':>8}")  # fmt: skip
    for stage, r in d["stages"].items():
        st = report.stages[stage]
        fp = f"{st.false_positives}/{r['harmless']} {pct(r['false_positive_rate'])}"
        tp = f"{st.true_positives}/{r['harmful']} {pct(r['true_positive_rate'])}"
        auc = "n/a" if r["roc_auc"] is None else f"{r['roc_auc']:.3f}"
        seconds = r["seconds_p50"] or 0.0
        click.echo(f"  {stage:7} {d['thresholds'][stage]:9.2f} {fp:>23} {tp:>22} {auc:>8} {seconds:8.2f}")
    if d["guard_format"] == "score":
        click.echo("threshold curve: FPR / TPR if the stage blocked at P(unsafe) >= threshold")
        for i, t in enumerate(CURVE):
            points = {stage: r["curve"][i] for stage, r in d["stages"].items()}
            cells = [
                f"{stage} {pct(c['false_positive_rate'])} / {pct(c['true_positive_rate'])}"
                for stage, c in points.items()
            ]
            click.echo(f"  {t:4.2f}  " + "   ".join(cells))
    errs = [
        f"{stage} {kind} {c['blocked']}/{c['cases']}"
        for stage, r in d["stages"].items()
        for kind, c in r["blocked_by_kind"].items()
        if (c["blocked"] > 0 if kind.startswith("harmless/") else c["blocked"] < c["cases"])
    ]
    if errs:
        click.echo("where it errs (blocked/cases): " + "; ".join(errs))
