"""Shared fixtures. `stack` boots the real four-engine CPU stack once per session."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOT_TIMEOUT_S = float(os.environ.get("RAG_TEST_BOOT_TIMEOUT_S", "900"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    """A running `rag serve` (or one named by RAG_TEST_BASE_URL)."""

    def __init__(self, base_url: str, proc: subprocess.Popen[str] | None, log: Path | None) -> None:
        self.base_url = base_url
        self.proc = proc
        self.log = log


def _session_pids(sid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return out


def _kill_session(sid: int) -> list[psutil.Process]:
    """SIGKILL whatever is still alive in the session `rag serve` led; returns those."""
    leftover = _session_pids(sid)
    for p in leftover:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return leftover


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Boot `rag serve` on a free port, yield its URL, stop it and prove nothing is left."""
    if url := os.environ.get("RAG_TEST_BASE_URL"):  # reuse a running stack while developing
        yield Stack(url.rstrip("/"), None, None)
        return
    log = tmp_path_factory.mktemp("stack") / "serve.log"
    port = free_port()
    cmd = [sys.executable, "-m", "rag.cli", "serve", "--port", str(port)]
    err = log.open("w")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    url_box: list[str] = []

    def read_url() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # stdout carries the URL and nothing else
            url_box.append(line.strip())
            return

    reader = threading.Thread(target=read_url, daemon=True)
    reader.start()
    reader.join(BOOT_TIMEOUT_S)
    if not url_box or not url_box[0].startswith("http"):
        _kill_session(proc.pid)
        pytest.fail(
            f"rag serve gave no URL in {BOOT_TIMEOUT_S:.0f} s ({url_box}):\n{log.read_text()[-4000:]}"
        )
    print(f"\nstack up at {url_box[0]} (log {log})", file=sys.stderr)
    try:
        yield Stack(url_box[0], proc, log)
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=180)
        time.sleep(2)
        leftover = _kill_session(proc.pid)
        err.close()
        assert proc.returncode == 0, f"rag serve exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert not leftover, f"rag serve left processes behind: {[p.pid for p in leftover]}"
