"""Shared fixtures. `stack` boots the real four-engine CPU stack once per session."""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from rag.errors import ServeError
from rag.stack.auth import KEY_ENV, KEY_FILE_ENV, keys_from_env
from rag.stack.process import Managed

ROOT = Path(__file__).resolve().parents[1]
BOOT_TIMEOUT_S = float(os.environ.get("RAG_TEST_BOOT_TIMEOUT_S", "900"))


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now, chosen where nothing else draws ports from meanwhile: below the
    kernel's ephemeral range (bind(0) and outgoing connections, Ray's own during its boot,
    take theirs there) and above Ray's worker ports (10002-19999). Never the same one twice."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    if low < 21000:  # a kernel with a wide ephemeral range: let it choose
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(200):
        port = random.randrange(20000, low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port in 20000-{low - 1}")


def listening_beyond_loopback(pids: set[int]) -> tuple[int, list[tuple[str, int, str]]]:
    """How many sockets the processes `pids` listen on, and those not on loopback
    (address, port, process name)."""
    import ipaddress

    import psutil

    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback

    listening = [
        (c.laddr.ip, c.laddr.port, c.pid)
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]
    exposed = [(ip, port, psutil.Process(pid).name()) for ip, port, pid in listening if not loopback(ip)]
    return len(listening), exposed


def report(request: pytest.FixtureRequest, line: str) -> None:
    """A line in pytest's own output (not captured): measurements a reader of CI wants."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(line, file=sys.stderr)
        return
    with capture.global_and_fixture_disabled():  # the reporter writes to fd 1, captured here
        reporter.write_line(line)


class Stack:
    """A running `rag serve` (or one named by RAG_TEST_BASE_URL)."""

    def __init__(
        self,
        base_url: str,
        log: Path | None,
        keys: tuple[str, ...],
        pid: int | None = None,
        metrics_url: str | None = None,
        index_dir: Path | None = None,
    ) -> None:
        self.base_url = base_url
        self.log = log
        self.keys = keys  # the API keys it accepts (a reused stack: the one RAG_API_KEY names)
        self.api_key = keys[0] if keys else "EMPTY"
        self.pid = pid  # of `rag serve`, when this session started it
        self.metrics_url = metrics_url  # Ray's Prometheus endpoint (RAG_TEST_METRICS_URL when reused)
        # what `rag serve --index` names: empty at boot (RAG_TEST_INDEX_DIR when reused)
        self.index_dir = index_dir

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def _key_file(folder: Path) -> tuple[Path, tuple[str, str]]:
    """Two API keys in a file only its owner reads, as a user would keep them."""
    keys = (f"test-{secrets.token_hex(16)}", f"test-{secrets.token_hex(16)}")
    path = folder / "api-keys"
    path.write_text(f"# keys of this test session\n{keys[0]}\n\n{keys[1]}\n")
    path.chmod(0o600)
    return path, keys


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """Boot `rag serve` on a free port, yield its URL, stop it and prove nothing is left."""
    if url := os.environ.get("RAG_TEST_BASE_URL"):  # reuse a running stack while developing
        keys = keys_from_env()
        index = os.environ.get("RAG_TEST_INDEX_DIR")
        yield Stack(
            url.rstrip("/"), None, keys, metrics_url=os.environ.get("RAG_TEST_METRICS_URL"),
            index_dir=Path(index) if index else None,
        )  # fmt: skip
        return
    folder = tmp_path_factory.mktemp("stack")
    log = folder / "serve.log"
    # Keys reach `rag serve` and every `rag` client of the suite through the file alone.
    key_file, keys = _key_file(folder)
    os.environ.pop(KEY_ENV, None)
    os.environ[KEY_FILE_ENV] = str(key_file)
    metrics_port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "rag.cli",
        "serve",
        "--port",
        str(free_port()),
        "--metrics-port",
        str(metrics_port),
        "--index",
        str(folder / "served-index"),
    ]
    try:
        server = Managed("rag serve", cmd, log, BOOT_TIMEOUT_S, lambda m: None)
    except ServeError:
        pytest.fail(f"rag serve gave no URL in {BOOT_TIMEOUT_S:.0f} s:\n{log.read_text()[-4000:]}")
    report(request, f"stack up at {server.url} (log {log})")
    for line in log.read_text().splitlines():  # boot time, dtype and memory, for the CI log
        if line.startswith(("cpu:", "all four engines", "memory:", "  per engine:")):
            report(request, line.strip())
    try:
        yield Stack(
            server.url, log, keys, server.proc.pid, f"http://127.0.0.1:{metrics_port}/metrics",
            folder / "served-index",
        )  # fmt: skip
    finally:
        killed = server.stop()
        assert server.proc.returncode == 0, (
            f"rag serve exited {server.proc.returncode}:\n{log.read_text()[-3000:]}"
        )
        assert not killed, f"rag serve left processes behind: {killed}"


def index_served(stack: Stack, corpus: Path) -> dict[str, Any]:
    """`rag index CORPUS` into the folder the stack's `rag model` answers from."""
    from click.testing import CliRunner

    from rag.cli import main

    env = {"RAG_BASE_URL": stack.base_url, "RAG_INDEX_DIR": str(stack.index_dir)}
    result = CliRunner().invoke(main, ["index", str(corpus), "--json"], env=env)
    assert result.exit_code == 0, result.output
    stats: dict[str, Any] = json.loads(result.stdout)
    return stats


@pytest.fixture(scope="session")
def served(stack: Stack) -> Stack:
    """The stack with corpus/ indexed where `rag serve --index` points (tests that need
    the served index empty, in tests/test_rag_model_e2e.py, run before any asks for this)."""
    if stack.index_dir is None:
        pytest.fail("a reused stack needs RAG_TEST_INDEX_DIR: the folder its `rag serve --index` names")
    index_served(stack, ROOT / "corpus")
    return stack


@pytest.fixture(scope="module")
def oai(stack: Stack) -> OpenAI:
    """The OpenAI client a user has, pointed at the stack (no client-side retries)."""
    return OpenAI(base_url=stack.base_url, api_key=stack.api_key, timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def http(stack: Stack) -> httpx.Client:
    """Plain HTTP against the stack's /v1."""
    return httpx.Client(base_url=stack.base_url, timeout=300, headers=stack.auth)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run every test that needs the shared stack last, after those that boot their own
    Ray cluster (two four-engine clusters at once would not fit in 24 GiB), and the
    tests that kill part of the stack after every other stack test."""
    items.sort(
        key=lambda item: (
            "stack" in getattr(item, "fixturenames", ()),
            item.get_closest_marker("disruptive") is not None,
        )
    )
