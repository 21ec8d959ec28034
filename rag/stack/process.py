"""Processes this project starts, and ending them with nothing left behind.

`rag serve` ends the process tree Ray leaves when it shuts down (`end_tree`); the
bench and the tests start servers as `Managed` subprocesses, each in a session of
its own, and stopping one kills whatever of that session outlived Ctrl-C. Both
kill through the same helper, so a zombie or a process that exits meanwhile is
never an error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from rag.errors import ServeError

__all__ = ["Log", "Managed", "end_tree"]

Log = Callable[[str], None]
END_GRACE_S = 10  # how long end_tree waits after SIGTERM before it kills


def _live(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """The processes of `procs` still running (a zombie has already exited)."""
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


def _kill(procs: Iterable[psutil.Process]) -> list[int]:
    """SIGKILL each live process of `procs`; the pids that were."""
    killed = []
    for p in _live(procs):
        with contextlib.suppress(psutil.Error):
            p.kill()
            killed.append(p.pid)
    return killed


def _session(sid: int) -> list[psutil.Process]:
    """Every process in session `sid` (a child started with start_new_session: its pid)."""
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # OSError: gone before getsid
            if os.getsid(p.pid) == sid:
                members.append(p)
    return members


def end_tree(procs: Iterable[psutil.Process]) -> int:
    """Terminate (then kill) the processes of `procs` still running; how many were."""
    alive = _live(procs)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=END_GRACE_S)
    _kill(still)
    return len(alive)


def _hear_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # in the child, before it runs: Python then handles it


class Managed:
    """A server subprocess, started, waited for until ready and stopped with everything
    it spawned. Ready means it printed its URL on stdout, or, given `ready_url`, that
    URL's /health answers 200 (a server that logs to stdout: its stdout goes to the log)."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        log_path: Path,
        ready_timeout_s: float,
        log: Log,
        *,
        ready_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name, self.log = name, log
        self.log_file = log_path.open("w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log_file if ready_url else subprocess.PIPE,
            stderr=self.log_file,
            text=True,
            start_new_session=True,
            env=env,
            # `stop` asks with Ctrl-C first; a shell's background job (`make bench &`) would
            # hand the server SIGINT ignored, and Python then never sees it.
            preexec_fn=_hear_ctrl_c,
        )
        url = self._health(ready_url, ready_timeout_s) if ready_url else self._printed(ready_timeout_s)
        if url is None:
            self.stop()
            raise ServeError(f"{name} did not start in {ready_timeout_s:.0f} s; see {log_path}")
        self.url = url

    def _printed(self, timeout_s: float) -> str | None:
        box: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                box.append(line.strip())
                return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout_s)
        return box[0] if box and box[0].startswith("http") else None

    def _health(self, url: str, timeout_s: float) -> str | None:
        import httpx

        root = url.rstrip("/").removesuffix("/v1")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{root}/health", timeout=5).status_code == 200:
                    return url
            time.sleep(1)
        return None

    def processes(self) -> list[psutil.Process]:
        """Every process the server started and it itself (its session)."""
        return _session(self.proc.pid)

    def stop(self, timeout_s: float = 180) -> list[int]:
        """Ctrl-C the server, wait for it, then kill whatever of its session outlived it.

        Returns the pids that had to be killed (empty when it cleaned up after itself)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
        time.sleep(1)  # let the last of its children exit on their own
        killed = _kill(_session(self.proc.pid))
        self.log_file.close()
        return killed
