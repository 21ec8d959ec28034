"""The `rag` command line: results on stdout, progress on stderr, one-line errors.

One module per command group: stack.py (prepare, check, serve), index.py (index),
query.py (search, ask, chat), eval.py (eval), benchmark.py (bench), cluster.py
(serve-config); common.py holds
the `rag` group and what they share.

Exit codes: 0 done, 1 an expected failure (one line on stderr saying what to do),
2 misuse, 3 a guard refusal.
"""

from __future__ import annotations

# Importing a command module registers its commands on `main`; `rag --help` lists
# them alphabetically, whatever this order.
from rag.cli import benchmark, cluster, eval, index, query, stack  # noqa: F401
from rag.cli.common import main

__all__ = ["main"]
