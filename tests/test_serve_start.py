"""Starting Ray for `rag serve`: a node that does not come up is named, cleaned and retried."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import ray

from rag.errors import ServeError
from rag.stack import serve
from tests.conftest import ROOT, free_port

RAY_TIMEOUT = "The current node timed out during startup. This could happen because ..."
RAYLET_ERROR = (
    "[2026-12-03 09:42:38,221 E 28783 28813] (raylet) agent_manager.cc:87: The raylet exited "
    "immediately because one Ray agent failed, agent_name = dashboard_agent."
)


def sleeper() -> psutil.Process:
    """A child process standing in for the gcs_server and raylet a failed ray.init leaves."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    return psutil.Process(proc.pid)


@pytest.fixture
def ray_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(serve, "RAY_LOGS", tmp_path)
    (tmp_path / "raylet.out").write_text(
        f"[2026-12-03 09:42:37,000 I 1 1] (raylet) main.cc: ok\n{RAYLET_ERROR}\n"
    )
    return tmp_path


def test_a_node_that_does_not_come_up_is_ended_and_tried_once_more(
    ray_logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    left: list[psutil.Process] = []
    calls: list[dict[str, object]] = []

    def init(**kwargs: object) -> None:
        calls.append(kwargs)
        if len(calls) == 1:
            left.append(sleeper())
            raise Exception(RAY_TIMEOUT)

    monkeypatch.setattr(ray, "init", init)
    lines: list[str] = []
    serve._start_ray(2, "127.0.0.1", None, lines.append)
    assert len(calls) == 2 and calls[1]["num_cpus"] == 2
    assert not left[0].is_running() or left[0].status() == psutil.STATUS_ZOMBIE
    assert lines == [
        "Ray did not start (raylet: The raylet exited immediately because one Ray agent failed, "
        "agent_name = dashboard_agent.); trying once more"
    ]


def test_a_second_failure_ends_the_boot_with_the_cause_and_where_the_logs_are(
    ray_logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def init(**kwargs: object) -> None:
        raise Exception(RAY_TIMEOUT)

    monkeypatch.setattr(ray, "init", init)
    (ray_logs / "raylet.out").write_text("")  # nothing in the logs: Ray's own words, first sentence
    with pytest.raises(ServeError) as err:
        serve._start_ray(2, "127.0.0.1", None, lambda _: None)
    assert str(err.value) == (
        f"Ray did not start, 2 tries: The current node timed out during startup (logs: {ray_logs})"
    )


def test_a_bad_argument_is_not_tried_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def init(**kwargs: object) -> None:
        calls.append(kwargs)
        raise ValueError("num_cpus must be a non-negative integer")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ValueError):
        serve._start_ray(-1, "127.0.0.1", None, lambda _: None)
    assert len(calls) == 1


@pytest.mark.ray
def test_a_metrics_port_taken_during_a_real_ray_start_names_the_port_and_its_holder() -> None:
    """What CI met once: the metrics port free at our check, taken when Ray's agent binds it.

    Real Ray; about 30 s, as Ray gives up only when its node misses the 30 s registration."""
    port = free_port()
    script = textwrap.dedent(
        f"""
        import socket
        import psutil
        from rag.errors import ServeError
        from rag.stack.serve import _start_ray
        holder = socket.socket()
        holder.bind(("0.0.0.0", {port}))
        holder.listen()
        try:
            _start_ray(2, "127.0.0.1", {port}, lambda line: print(line, flush=True))
        except ServeError as exc:
            print("ServeError:", exc)
        alive = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        print("children alive:", len(alive))
        """
    )
    env = {**os.environ, **serve.OFFLINE_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out, _ = proc.communicate(timeout=240)
    assert (
        f"ServeError: Ray did not start (Ray's metrics agent could not bind port {port} (--metrics-port)); "
        f"port {port} is taken (pid {proc.pid} " in out
    ), out[-3000:]
    assert "pick another port with --metrics-port (or RAG_METRICS_PORT; 0 turns metrics off)" in out
    assert "trying once more" not in out  # the holder is still there: a second try cannot help
    assert "children alive: 0" in out
    left = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == proc.pid:
                left.append(p)
        except OSError:
            pass
    assert not left, [p.cmdline() for p in left]
