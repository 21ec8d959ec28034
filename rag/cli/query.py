"""Query commands: `rag search` (passages), `rag ask` (one answer), `rag chat` (a conversation).

Each opens the index and talks to the running stack. Answers stream to stdout as
they are generated; their sources, and a refusal when the guard blocks, follow.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rag.cli.common import CONTEXT, build_settings, friendly, main, mode_option, open_pipeline, stack_options
from rag.pipeline import Answer
from rag.shapes import answer_json, hit_json

__all__ = ["REFUSED", "ask", "chat", "search"]


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
    s = build_settings(base_url, api_key, index_dir, retrieval=mode)
    client, pipe = open_pipeline(s)
    with client:
        hits = pipe.search(query, rerank=rerank)[:top]
    if as_json:
        click.echo(json.dumps([hit_json(h) for h in hits], indent=2))
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


class _Streamed:
    """Prints the answer as it is released, and remembers whether anything was printed."""

    def __init__(self) -> None:
        self.any = False

    def __call__(self, text: str) -> None:
        click.echo(text, nl=False)
        sys.stdout.flush()
        self.any = self.any or bool(text)


REFUSED = 3  # exit code of a guard refusal: neither success nor an error


def _print_answer_tail(a: Answer, out: _Streamed) -> None:
    if a.blocked:
        if out.any:  # the answer's first words were shown before the guard stopped it
            click.echo()
        click.echo(a.refusal())
        return
    if out.any:
        click.echo()
    if tail := a.tail():
        click.echo(("\n" if out.any else "") + tail)


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

    The guard checks the question first and the answer before it is shown
    (the first words as soon as there are four, then sentence by sentence);
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
    s = build_settings(base_url, api_key, index_dir, retrieval=mode)
    client, pipe = open_pipeline(s)
    with client:
        if as_json:
            a = pipe.ask(question)
            click.echo(json.dumps(answer_json(a), indent=2))
        else:
            out = _Streamed()
            a = pipe.ask(question, on_text=out)
            _print_answer_tail(a, out)
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
    s = build_settings(base_url, api_key, index_dir, retrieval=mode)
    client, pipe = open_pipeline(s)
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
            out = _Streamed()
            a = pipe.ask(question, history=history, on_text=out)
            _print_answer_tail(a, out)
            if not a.blocked and a.covered:
                history += [{"role": "user", "content": question}, {"role": "assistant", "content": a.text}]
