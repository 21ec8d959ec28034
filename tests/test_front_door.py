"""The front door in Ray's proxy (rag/stack/front_door.py): the key and the admission
count before a request crosses a handle, the body passed on as it came.

The app behind it stands in for Serve's proxy routing (it cannot be made to hold a
stream open on demand); the real proxy runs it in tests/test_edge.py's burst.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from rag.stack.admission import Capacity
from rag.stack.auth import digest
from rag.stack.front_door import READ_LIMIT, FrontDoor, Plan

KEY = "k-front-door"


class Behind:
    """What the front door passes requests to: records each body whole, holds chats open
    until `release` is set."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        if scope["path"].endswith("/chat/completions"):
            await send({"type": "http.response.body", "body": b"data: a\n\n", "more_body": True})
            await self.release.wait()
        await send({"type": "http.response.body", "body": b"ok"})


def door(plan: Plan | None, behind: Behind, refused: list[tuple[str, int]] | None = None) -> FrontDoor:
    async def read() -> Plan | None:
        return plan

    seen = refused if refused is not None else []
    return FrontDoor(behind, read=read, refresh_s=3600, refused=lambda m, c: seen.append((m, c)))


def chat(i: int = 0) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": f"hi {i} " + "x" * 5000}]}


async def _ready(d: FrontDoor, client: httpx.AsyncClient) -> None:
    """The first request starts reading the plan; wait until it is in."""
    await client.get("/v1/models")
    await client.post("/v1/embeddings", json={"model": "embed", "input": "x"})
    for _ in range(100):
        if d.plan is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the front door never read its plan")


def test_past_capacity_the_front_door_answers_429_itself_and_passes_bodies_on_whole() -> None:
    behind = Behind()
    refused: list[tuple[str, int]] = []
    d = door(Plan({"chat": Capacity(2, 4.2)}, (digest(KEY),)), behind, refused)
    auth = {"Authorization": f"Bearer {KEY}"}

    async def run() -> None:
        transport = httpx.ASGITransport(app=d)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=auth) as client:
            await _ready(d, client)
            behind.bodies.clear()
            held = [asyncio.create_task(client.post("/v1/chat/completions", json=chat(i))) for i in range(2)]
            while len(behind.bodies) < 2:
                await asyncio.sleep(0.01)
            r = await asyncio.wait_for(client.post("/v1/chat/completions", json=chat(9)), 10)
            assert r.status_code == 429 and r.headers["retry-after"] == "5"
            assert r.json()["error"]["type"] == "rate_limit_error" and "holds 2 requests" in r.text
            assert len(behind.bodies) == 2  # refused here: nothing went on
            assert refused == [("chat", 429)]  # and counted in the metric Serve's own cannot see
            other = await client.post("/v1/embeddings", json={"model": "embed", "input": "y"})
            assert other.status_code == 200  # a model with no capacity is not counted
            behind.release.set()
            assert [(await t).status_code for t in held] == [200, 200]
            assert (await client.post("/v1/chat/completions", json=chat(3))).status_code == 200  # room again
            sent = sorted(json.loads(b)["messages"][0]["content"][:4] for b in behind.bodies if b"chat" in b)
            assert sent == ["hi 0", "hi 1", "hi 3"]  # each body reached the app byte for byte

    asyncio.run(run())


def test_no_key_is_a_401_from_the_front_door_in_the_openai_shape() -> None:
    behind = Behind()
    refused: list[tuple[str, int]] = []
    d = door(Plan({"chat": Capacity(2, 1)}, (digest(KEY),)), behind, refused)

    async def run() -> None:
        transport = httpx.ASGITransport(app=d)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await client.post("/v1/embeddings", json={})  # starts the plan's read
            await asyncio.sleep(0.05)
            behind.bodies.clear()
            r = await client.post("/v1/chat/completions", json=chat())
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            wrong = await client.post(
                "/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer nope"}
            )
            assert wrong.status_code == 401 and "not one this server accepts" in wrong.text
            assert behind.bodies == [] and refused == [("", 401), ("", 401)]

    asyncio.run(run())


def test_before_a_plan_and_for_what_it_does_not_read_the_front_door_passes_requests_on() -> None:
    behind = Behind()
    behind.release.set()
    d = door(None, behind)

    async def run() -> None:
        transport = httpx.ASGITransport(app=d)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for _ in range(3):  # no plan: the ingress behind counts and checks
                assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
        planned = door(Plan({"chat": Capacity(0, 1)}), behind)  # room for none: every counted one is refused
        transport = httpx.ASGITransport(app=planned)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await _ready(planned, client)
            assert (await client.post("/v1/chat/completions", json=chat())).status_code == 429
            big = json.dumps(chat() | {"pad": "x" * READ_LIMIT}).encode()
            r = await client.post(
                "/v1/chat/completions", content=big, headers={"content-type": "application/json"}
            )
            assert r.status_code == 200  # larger than it reads: the ingress's Boundary and Admission decide
            text = await client.post(
                "/v1/chat/completions", content=b"model=chat", headers={"content-type": "text/plain"}
            )
            assert text.status_code == 200  # not JSON: the Boundary's 415

    asyncio.run(run())


def test_a_plan_survives_its_trip_through_rays_kv() -> None:
    plan = Plan({"chat": Capacity(128, 5.0), "guard": Capacity(16, 1.5)}, ("ab" * 32,))
    assert Plan.loads(plan.dumps()) == plan


def test_without_rays_metrics_the_refusal_counter_is_a_quiet_no_op() -> None:
    from rag.stack.front_door import ray_metric

    ray_metric()("chat", 429)  # no Ray here: must not raise
