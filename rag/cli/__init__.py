"""The `rag` command line: results on stdout, progress on stderr, one-line errors.

Exit codes: 0 done, 1 an expected failure (one line on stderr saying what to do),
2 misuse, 3 a guard refusal.
"""

from __future__ import annotations

from rag.cli import ask, benchmark, stack  # noqa: F401 - registers the commands
from rag.cli._common import main

__all__ = ["main"]
