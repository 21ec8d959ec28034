"""`rag index`: parse, chunk and embed documents into the index the query commands read.

Chunk sizes count in the served embedding model's own tokens, from its tokenizer.json
on this machine (rag/tokenizer.py finds it), or are estimated when it is not here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from rag.chunk import Chunker, Tokens
from rag.cli.common import CONTEXT, build_settings, err, friendly, main, progress, stack_options
from rag.client import StackClient
from rag.errors import ConfigError
from rag.ingest import require_paths
from rag.served import FactsClient
from rag.tokenizer import local_tokenizer

__all__ = ["index", "served_tokenizer"]


def _given_tokenizer(path: Path) -> str:
    """The tokenizer.json that --tokenizer names (a file or its model's folder)."""
    found = Tokens.find([path.expanduser()])
    if found is None:
        raise ConfigError(
            f"no tokenizer.json at {path}; pass the embedding model's folder or its tokenizer.json "
            "(or leave --tokenizer out to use the served embedding model's)"
        )
    return str(found)


def served_tokenizer(client: FactsClient, embed_model: str) -> str | None:
    """The tokenizer.json of the model the server embeds with, found on this machine.

    None, said on stderr, when it is not here: sizes are then estimated."""
    source = client.facts().get(embed_model, {}).get("source")
    found = local_tokenizer(source) if isinstance(source, str) and source else None
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
    s = build_settings(base_url, api_key, index_dir)
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
            chunker = Chunker(max_tokens, overlap, given or served_tokenizer(client, s.embed_model))
            stats = build(
                list(paths), s.index_dir, client, s.embed_model, chunker=chunker, runner=runner,
                progress=progress("embedding chunks"), parse_progress=progress("reading files"),
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
