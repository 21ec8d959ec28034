"""Who gets in, on the real stack: API keys on every route, nothing listening beyond
loopback, and the keys nowhere a process listing or another process would show them."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from openai import AuthenticationError, OpenAI

from tests.conftest import Stack, listening_beyond_loopback, report

pytestmark = pytest.mark.stack

WRONG = "wrong-0123456789abcdef0123456789"
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/chat", None),
    ("POST", "/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/completions", {"model": "chat", "prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/embeddings", {"model": "embed", "input": ["hi"]}),
    ("POST", "/v1/score", {"model": "score", "text_1": "q", "text_2": ["d"]}),
    ("POST", "/v1/rerank", {"model": "score", "query": "q", "documents": ["d"]}),
    ("POST", "/v2/rerank", {"model": "score", "query": "q", "documents": ["d"]}),
    ("POST", "/tokenize", {"model": "chat", "prompt": "hi"}),
    ("POST", "/detokenize", {"model": "chat", "tokens": [1]}),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/docs", None),
]


@pytest.fixture(scope="module")
def root(stack: Stack) -> str:
    if not stack.keys:
        pytest.skip("the reused stack has no API key (set RAG_API_KEY to the one it takes)")
    return stack.base_url.removesuffix("/v1")


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_needs_a_key_and_refuses_a_wrong_one_with_a_401(
    root: str, method: str, path: str, body: dict[str, Any] | None
) -> None:
    for headers in ({}, {"Authorization": f"Bearer {WRONG}"}, {"Authorization": WRONG}):
        r = httpx.request(method, f"{root}{path}", json=body, headers=headers, timeout=60)
        assert r.status_code == 401, (headers, r.status_code, r.text[:200])
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == 401
        assert r.headers["www-authenticate"] == "Bearer"


def test_each_accepted_key_gets_in_and_health_needs_none(root: str, stack: Stack) -> None:
    for key in stack.keys:
        r = httpx.get(f"{root}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert r.status_code == 200 and {m["id"] for m in r.json()["data"]} >= {
            "chat",
            "guard",
            "embed",
            "score",
        }
    assert httpx.get(f"{root}/health", timeout=60).json() == {"status": "ok"}


def test_the_key_is_checked_before_the_body_is_read(root: str) -> None:
    """A 6 MiB body without a key is a 401, not the 413 the boundary would give it."""
    r = httpx.post(f"{root}/v1/chat/completions", content=b"x" * (6 << 20), timeout=60)
    assert r.status_code == 401


def test_the_openai_client_reports_a_wrong_key_as_an_authentication_error(stack: Stack) -> None:
    if not stack.keys:
        pytest.skip("the reused stack has no API key")
    wrong = OpenAI(base_url=stack.base_url, api_key=WRONG, max_retries=0, timeout=60)
    with pytest.raises(AuthenticationError, match="not one this server accepts"):
        wrong.models.list()
    right = OpenAI(base_url=stack.base_url, api_key=stack.keys[-1], max_retries=0, timeout=60)
    assert "chat" in {m.id for m in right.models.list()}


def test_metrics_are_relayed_behind_the_key(root: str, stack: Stack) -> None:
    r = httpx.get(f"{root}/metrics", headers=stack.auth, timeout=60)
    assert r.status_code == 200 and "ray_" in r.text, r.text[:300]


def test_nothing_of_the_stack_listens_beyond_loopback(stack: Stack, request: pytest.FixtureRequest) -> None:
    """Every listening socket of `rag serve` and all it started: Ray's GCS, raylet,
    agents, each worker's gRPC port, the metrics agent, vLLM's engine cores, Serve's
    proxy (on --host, here the default 127.0.0.1)."""
    if stack.pid is None:
        pytest.skip("this session did not start the stack, so it does not know its processes")
    tree = [psutil.Process(stack.pid), *psutil.Process(stack.pid).children(recursive=True)]
    pids = {p.pid for p in tree}
    listening, exposed = listening_beyond_loopback(pids)
    report(
        request,
        f"listening sockets of the stack: {listening} over {len(pids)} processes, "
        f"{len(exposed)} beyond loopback",
    )
    assert listening >= 10  # the tree was really seen (Ray alone listens on several)
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_no_process_of_the_stack_shows_a_key(stack: Stack) -> None:
    """Keys came from a file: none is in any command line or environment of the tree."""
    if stack.pid is None or not stack.keys:
        pytest.skip("this session did not start the stack")
    tree = [psutil.Process(stack.pid), *psutil.Process(stack.pid).children(recursive=True)]
    seen = 0
    for p in tree:
        try:
            shown = " ".join(p.cmdline()) + "\0".join(f"{k}={v}" for k, v in p.environ().items())
        except psutil.Error:
            continue
        seen += 1
        assert not any(key in shown for key in stack.keys), f"pid {p.pid} ({p.name()}) shows a key"
    assert seen >= 10


def _compute_nices(p: psutil.Process) -> set[int]:
    """The nice values of the threads of `p` that carry its name: its main thread and
    the OpenMP workers it started (Linux keeps a nice value per thread; the I/O threads
    vLLM starts before the model, named otherwise, keep the process's own)."""
    name, out = Path(f"/proc/{p.pid}/comm").read_text(), set()
    for task in Path(f"/proc/{p.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            if (task / "comm").read_text() != name:
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out.add(int(fields[16]))  # field 19 of stat, counted after "pid (comm)"
    return out


def test_the_engines_compute_below_the_front_door(stack: Stack) -> None:
    """A burst is refused by the proxy and the ingress while the engines compute
    (rag/stack/engine_hooks.py CpuExecutor): each vLLM engine core's compute
    threads at nice 10, Serve's proxy and replicas at Ray's 0."""
    if stack.pid is None:
        pytest.skip("this session did not start the stack, so it does not know its processes")
    tree = psutil.Process(stack.pid).children(recursive=True)
    engines = [p for p in tree if p.name().startswith("VLLM::EngineCor")]
    front = [p for p in tree if p.name().startswith(("ray::ProxyActor", "ray::ServeRepli"))]
    assert len(engines) == 4 and len(front) >= 6, [p.name() for p in tree]
    assert all(_compute_nices(p) == {10} for p in engines), [_compute_nices(p) for p in engines]
    assert all(p.nice() == 0 for p in front)
