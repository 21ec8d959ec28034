"""The stack on a Ray cluster of two nodes on this machine (issue 37; `make test-cluster`).

A head node runs Serve, the ingress, guard, embed, score and one chat replica; a worker
node, added once those are placed, takes the second chat replica (inference.yaml:
`chat: {min: 2, max: 2, resources: {chat_node: 1}}`, and each node advertises one
`chat_node`, so one chat replica per node). The app goes on with `rag serve --address`,
the way a user deploys onto a running cluster. Then:

1. a burst is served by both chat replicas (each replica's request counter, read from
   each node's metrics endpoint);
2. every process of the worker node is killed mid-burst (once half of it streams),
   as when its machine dies: no request fails before its first token (the ingress sends
   those again, to the head's replica; a stream cut midway cannot be retried), requests
   sent after the kill are answered, and the second replica comes back on a node added
   in the dead one's place, as KubeRay or an autoscaler would add it.

Not in `make test`: the two nodes hold about 13 GiB, and the suite's own stack would not
fit beside them. The numbers go to pytest's output and the README ("Replicas per role").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from rag.stack import footprint
from rag.stack.loopback import LOOPBACK_ENV
from rag.stack.serve_config import node_env
from tests.conftest import free_port, listening_beyond_loopback, report

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
GiB = 1 << 30
BURST = 24  # chat requests at once; a batch is 64, so none is refused
TOKENS = 24


def _deploy_file(folder: Path) -> Path:
    """The repository's inference.yaml with two chat replicas, one per node, beside
    a scripts/ that is the repository's (the serve module reads the replicas from here)."""
    (folder / "scripts").symlink_to(REPO / "scripts")
    text = (REPO / "inference.yaml").read_text()
    text = text.replace("replicas: {}", "replicas:\n  chat: {min: 2, max: 2, resources: {chat_node: 1}}")
    assert "chat_node" in text
    path = folder / "inference.yaml"
    path.write_text(text)
    return path


def _raylet(node: Any) -> psutil.Process:
    from ray._private import ray_constants

    return psutil.Process(node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)


def _tree(node: Any) -> list[psutil.Process]:
    raylet = _raylet(node)
    return [raylet, *raylet.children(recursive=True)]


def _per_replica(ports: list[int]) -> dict[str, float]:
    """Requests each chat replica finished, from Serve's counter on each node's metrics port."""
    line = re.compile(r"^ray_serve_deployment_request_counter(?:_total)?\{([^}]*)\} ([0-9.e+]+)$")
    out: dict[str, float] = defaultdict(float)
    for port in ports:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        except httpx.HTTPError:
            continue
        for m in map(line.match, text.splitlines()):
            if m and 'deployment="LLMServer:chat"' in m.group(1):
                replica = re.search(r'replica="([^"]+)"', m.group(1))
                out[replica.group(1) if replica else "?"] += float(m.group(2))
    return dict(out)


def _settled(ports: list[int]) -> dict[str, float]:
    """The counters once the requests before now have reached them (each node's metrics
    agent exports every few seconds): the same twice, 8 s apart, or what they say at 60 s."""
    last, deadline = _per_replica(ports), time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(8)
        now = _per_replica(ports)
        if now == last:
            return now
        last = now
    return last


async def _chat(client: httpx.AsyncClient, i: int, streaming: set[int] | None = None) -> dict[str, Any]:
    """One streamed chat: whether it ended well, and how many tokens came before it ended
    (`i` joins `streaming` at its first token)."""
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": f"Request {i}: name three uses of a reranker."}],
        "max_tokens": TOKENS,
        "stream": True,
        "ignore_eos": True,
    }
    tokens, first = 0, 0.0
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return {
                    "ok": False,
                    "tokens": 0,
                    "status": r.status_code,
                    "first": first,
                    "end": time.monotonic(),
                }
            async for raw in r.aiter_lines():
                if not raw.startswith("data: ") or raw == "data: [DONE]":
                    continue
                event = json.loads(raw[6:])
                if "error" in event:
                    return {
                        "ok": False,
                        "tokens": tokens,
                        "status": 200,
                        "first": first,
                        "end": time.monotonic(),
                    }
                if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                    tokens += 1
                    first = first or time.monotonic()
                    if streaming is not None:
                        streaming.add(i)
    except httpx.HTTPError as exc:
        return {
            "ok": False,
            "tokens": tokens,
            "status": type(exc).__name__,
            "first": first,
            "end": time.monotonic(),
        }
    return {"ok": tokens > 0, "tokens": tokens, "status": 200, "first": first, "end": time.monotonic()}


async def _burst(
    url: str, n: int, offset: int = 0, streaming: set[int] | None = None
) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        return list(await asyncio.gather(*(_chat(client, offset + i, streaming) for i in range(n))))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    """A Ray head on loopback with Serve's settings in its environment; every process it
    or a node added later starts is ended by PID afterwards."""
    from ray.cluster_utils import Cluster

    env = {**node_env(), LOOPBACK_ENV: "1", "RAG_PROFILE": "cpu", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    head_metrics = free_port()
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 12,
            "resources": {"chat_node": 1},
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "metrics_export_port": head_metrics,
            "object_store_memory": 256 << 20,
        },
    )
    c.metrics_ports = [head_metrics]  # type: ignore[attr-defined]
    # Its GCS listens on 127.0.0.1 alone; Cluster names it by the machine's address.
    c.loopback_address = "127.0.0.1:" + c.address.rsplit(":", 1)[1]  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        import ray

        ray.shutdown()
        try:
            c.shutdown()
        finally:
            for p in psutil.Process().children(recursive=True):
                if p.pid not in before:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _add_worker(cluster: Any) -> Any:
    port = free_port()
    node = cluster.add_node(
        num_cpus=2, resources={"chat_node": 1}, node_ip_address="127.0.0.1", metrics_export_port=port
    )
    cluster.metrics_ports.append(port)
    return node


def _chat_replicas() -> dict[str, int]:
    from ray import serve

    app = serve.status().applications.get("default")
    chat = app.deployments.get("LLMServer:chat") if app else None
    return dict(chat.replica_states) if chat else {}


def _chat_replica_nodes() -> dict[str, str]:
    """Each live chat replica's actor name -> the node it runs on (from the GCS)."""
    from ray._private import state

    return {
        a["Name"]: a["Address"]["NodeID"]
        for a in state.actors().values()
        if "LLMServer:chat" in (a.get("Name") or "") and a.get("State") == "ALIVE"
    }


def _wait_log(log: Path, pattern: str, proc: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text()):
            return
        assert proc.poll() is None, f"rag serve exited: {log.read_text()[-3000:]}"
        time.sleep(2)
    raise AssertionError(f"no {pattern!r} in {timeout_s:.0f} s: {log.read_text()[-3000:]}")


def test_two_chat_replicas_on_two_nodes_share_a_burst_and_outlive_losing_one(
    cluster: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import ray

    port = free_port()
    log = tmp_path / "serve.log"
    started = time.monotonic()
    cmd = [
        sys.executable, "-m", "rag.cli", "serve", "--address", cluster.loopback_address, "--proxies", "head",
        "--port", str(port), "--file", str(_deploy_file(tmp_path)), "--index", str(tmp_path / "index"),
    ]  # fmt: skip
    serve = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True, start_new_session=True
    )
    try:
        # Everything but the second chat replica is placed on the head before a worker exists.
        _wait_log(log, r"guard: healthy.*score: healthy", serve, 600)
        worker = _add_worker(cluster)
        _wait_log(log, r"serving; press Ctrl-C", serve, 600)
        booted = time.monotonic() - started
        url = f"http://127.0.0.1:{port}"
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False  # as rag serve does: keep 127.0.0.1 as given
        ray.init(address=cluster.loopback_address, log_to_driver=False)
        assert _chat_replicas() == {"RUNNING": 2}
        replicas = _chat_replica_nodes()
        assert len(set(replicas.values())) == 2, replicas  # one on each node
        # Both nodes, their workers and engines, and rag serve: nothing on another address.
        ours = {p.pid for p in psutil.Process().children(recursive=True)}
        listening, exposed = listening_beyond_loopback(ours)
        assert listening >= 20 and not exposed, (listening, exposed)
        memory = {
            "head": footprint.measure(_raylet(cluster.head_node).pid).pss / GiB,
            "worker": footprint.measure(_raylet(worker).pid).pss / GiB,
        }

        # 1. One burst, both replicas: each one's share of the requests it finished.
        before = _settled(cluster.metrics_ports)  # the boot's probe and first answer counted
        results = asyncio.run(_burst(url, BURST))
        assert all(r["ok"] for r in results), results
        split: dict[str, float] = {}
        deadline = time.monotonic() + 60  # the metrics agents export every few seconds
        while time.monotonic() < deadline:
            after = _per_replica(cluster.metrics_ports)
            split = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
            if sum(split.values()) >= BURST:
                break
            time.sleep(3)
        assert sum(split.values()) == BURST and len(split) == 2, split
        shares = sorted(v / BURST for v in split.values())
        assert shares[0] >= 0.30, split

        # 2. The worker node dies mid-burst: every one of its processes killed at once.
        async def burst_with_a_node_lost() -> tuple[list[dict[str, Any]], float, list[dict[str, Any]]]:
            streaming: set[int] = set()
            task = asyncio.ensure_future(_burst(url, BURST, offset=100, streaming=streaming))
            waited = time.monotonic()  # until half stream (on 2 shared cores prefills take seconds)
            while len(streaming) < BURST // 2 and time.monotonic() - waited < 60:
                await asyncio.sleep(0.2)
            victims = _tree(worker)
            for p in victims:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            after_kill = await _burst(url, 4, offset=200)  # sent once the node is gone
            return await task, killed, after_kill

        during, killed_at, after_kill = asyncio.run(burst_with_a_node_lost())
        served_again = min((r["end"] for r in after_kill if r["ok"]), default=float("nan")) - killed_at
        cut = [r for r in during if not r["ok"] and r["tokens"] > 0]
        # In flight when the node died: streaming (a first token, no end yet) or waiting for one.
        streaming_then = sum(0 < r["first"] < killed_at < r["end"] for r in during)
        waiting_then = sum(not 0 < r["first"] < killed_at and killed_at < r["end"] for r in during)
        refused = [r for r in during + after_kill if not r["ok"] and r["tokens"] == 0]
        cluster.remove_node(worker, allow_graceful=False)

        # 3. A node in the dead one's place: the second replica comes back there.
        _add_worker(cluster)

        def replaced() -> bool:
            now = _chat_replica_nodes()
            return len(now) == 2 and set(now) != set(replicas) and _chat_replicas() == {"RUNNING": 2}

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not replaced():
            time.sleep(2)
        back = time.monotonic() - killed_at
        finished = sum(r["ok"] for r in during)
        report(
            request,
            f"cluster: 2 nodes on one machine, booted in {booted:.0f} s, {listening} listening sockets, "
            f"none beyond loopback; PSS head {memory['head']:.1f} GiB, "
            f"worker {memory['worker']:.1f} GiB; burst of {BURST} split "
            + " / ".join(f"{s:.0%}" for s in shares)
            + f"; worker killed mid-burst ({streaming_then} streaming, {waiting_then} waiting, "
            f"{BURST - streaming_then - waiting_then} done): {finished} of {BURST} finished, "
            f"{len(cut)} cut mid-stream, "
            f"{len(refused)} failed before a token; of 4 sent after the kill "
            f"{sum(r['ok'] for r in after_kill)} answered, the first {served_again:.1f} s after it; "
            f"second replica back {back:.0f} s after the kill",
        )
        assert not refused, refused
        assert all(r["ok"] for r in after_kill), after_kill
        assert replaced(), (_chat_replicas(), _chat_replica_nodes())
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    finally:
        serve.send_signal(signal.SIGINT)  # deletes the app, leaves the cluster to the fixture
        try:
            serve.wait(timeout=120)
        except subprocess.TimeoutExpired:
            serve.kill()
