"""The systems the bench starts: the stack (`rag serve`) and the one-at-a-time baseline.

Each is a `Managed` subprocess that prints its URL when ready; the CLI stops one
before it starts the next, so the two never share cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rag.stack.process import Log, Managed

__all__ = ["start_baseline", "start_stack"]


def start_stack(port: int, workdir: Path, log: Log) -> Managed:
    """`rag serve` on `port` (metrics on port + 2), logging to workdir/stack.log."""
    log(f"starting the stack on port {port} (a few minutes on CPU) ...")
    cmd = [sys.executable, "-m", "rag.cli", "serve", "--port", str(port), "--metrics-port", str(port + 2)]
    return Managed("the stack", cmd, workdir / "stack.log", 1200, log)


def start_baseline(model_dir: str, port: int, workdir: Path, log: Log) -> Managed:
    """rag.baseline on `port` over `model_dir`, in the dtype the stack would choose here."""
    from rag.stack.hardware import detect

    dtype = detect().dtype  # the stack's own choice, so the ratio compares like with like
    log(f"starting the one-at-a-time baseline on port {port} ({dtype}) ...")
    cmd = [sys.executable, "-m", "rag.baseline", "--model", model_dir, "--port", str(port), "--dtype", dtype]
    return Managed("the baseline", cmd, workdir / "baseline.log", 600, log)
