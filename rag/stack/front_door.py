"""The front door: admission and the key decided in Ray's HTTP proxy, before a handle.

Counted in the ingress, a refused request still crossed from the proxy to the
ingress replica and back (a gRPC call each way, the body parsed in both): 640 chats
at once on 2 cores (10x the chat batch) had their 512 refusals in 1.1 s at the
median, the slowest in 1.7 s. Here the proxy answers them itself.

How it gets there: `rag serve` names `proxy_middlewares` in
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH before Ray starts (rag/stack/serve.py);
Ray's proxy calls it once and wraps its ASGI app in what it returns. The proxy
starts before the serve module is loaded, so what to count comes later: the ingress
replica publishes its `Plan` (each model's capacity, the API keys' digests) in Ray's
internal KV as it starts (`publish`), and the front door reads it on the first
request and every REFRESH_S after, without holding a request up. Until it has a
plan it passes every request on, and the ingress counts them the same way
(rag/stack/admission.py).

Per POST, once there is a plan:
- the key first: no valid key, a 401 from here (rag/stack/auth.py's KeyGate; the
  ingress checks again);
- a JSON body with a Content-Length up to READ_LIMIT is read and its `model` looked
  up; a model with a capacity is counted (rag/stack/admission.py's `Count`: a 429
  with Retry-After when full), and the body goes on to Serve as it came;
- anything else (chunked, larger, not JSON, no such model) goes on as it came, for
  the ingress's Boundary to answer.

What it refuses never reaches Serve's own request metrics (its middleware wraps
Ray's proxy app), so it counts them itself: `ray_rag_front_door_refusals_total`
(labels `model`, `code`: 429 or 401) on the metrics port beside Serve's.

Light on purpose: this runs in the proxy, which must not import Ray Serve LLM or vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.middleware import Middleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.stack.admission import Capacity, Count
from rag.stack.auth import KeyGate
from rag.stack.error_shape import openai_error

__all__ = ["READ_LIMIT", "FrontDoor", "Plan", "proxy_middlewares", "publish", "ray_metric", "read_plan"]

NAMESPACE, KEY = b"rag", b"front_door"  # where the plan lives in Ray's internal KV
REFRESH_S = 5.0  # how often the plan is read again (a redeploy may change it)
# Bodies counted here: a chat request is a few KB. A larger one (up to the Boundary's
# MAX_BODY_BYTES) goes on uncounted and the ingress's Admission counts it.
READ_LIMIT = 1 << 20
_JSON_TYPES = (b"application/json", b"text/json")
log = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class Plan:
    """What the front door enforces: each model's capacity, and the API keys' SHA-256
    digests (none: the edge is open)."""

    capacity: Mapping[str, Capacity]
    digests: tuple[str, ...] = ()

    def dumps(self) -> bytes:
        capacity = {m: [c.requests, c.retry_after_s] for m, c in self.capacity.items()}
        return json.dumps({"capacity": capacity, "digests": list(self.digests)}).encode()

    @classmethod
    def loads(cls, raw: bytes) -> Plan:
        data = json.loads(raw)
        capacity = {m: Capacity(int(n), float(s)) for m, (n, s) in data["capacity"].items()}
        return cls(capacity, tuple(data.get("digests", ())))


def publish(plan: Plan) -> bool:
    """Put the plan where the proxy reads it (the ingress replica calls this); False
    when there is no Ray here (a unit test) and nothing to publish to."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():  # type: ignore[no-untyped-call]
        return False
    internal_kv._internal_kv_put(KEY, plan.dumps(), overwrite=True, namespace=NAMESPACE)
    return True


async def read_plan() -> Plan | None:
    """The published plan, or None (not published yet, or no Ray here)."""
    from ray.experimental import internal_kv

    client = internal_kv.internal_kv_get_gcs_client()  # type: ignore[no-untyped-call]
    if client is None:
        return None
    raw = await client.async_internal_kv_get(KEY, namespace=NAMESPACE, timeout=5)
    return Plan.loads(raw) if raw else None


def _model_of(body: bytes) -> object:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # the Boundary says what is wrong with it
        return None
    return data.get("model") if isinstance(data, dict) else None


Refused = Callable[[str, int], None]  # (model or "", status): one refusal, for the metric


def ray_metric() -> Refused:
    """A refusal counter in Ray's metrics (`ray_rag_front_door_refusals_total`); a no-op
    where Ray's metrics cannot be reached (a unit test)."""
    try:
        from ray.util.metrics import Counter

        counter = Counter(
            "rag_front_door_refusals",
            description="Requests the front door in Ray's proxy refused (429: engine full, 401: no key).",
            tag_keys=("model", "code"),
        )
    except Exception as exc:  # the metric is a convenience: never fail the proxy for it
        log.warning("front door: no refusal metric (%s)", exc)
        return lambda model, code: None

    def refused(model: str, code: int) -> None:
        with contextlib.suppress(Exception):  # a metric that fails must not fail the refusal
            counter.inc(tags={"model": model, "code": str(code)})

    return refused


class FrontDoor:
    """ASGI middleware around Ray's proxy: the key and the admission count, per `Plan`."""

    def __init__(
        self,
        app: ASGIApp,
        read: Callable[[], Awaitable[Plan | None]] = read_plan,
        refresh_s: float = REFRESH_S,
        refused: Refused | None = None,
    ) -> None:
        self.app = app
        self._read = read
        self._refresh_s = refresh_s
        self._next_read = 0.0
        self._reading: asyncio.Task[None] | None = None
        self.plan: Plan | None = None
        self._gate: KeyGate | None = None
        self._refused = refused or ray_metric()
        self._count = Count({})

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._reading is None and now >= self._next_read:
            self._next_read = now + self._refresh_s
            self._reading = asyncio.ensure_future(self._load())

    async def _load(self) -> None:
        try:
            plan = await self._read()
        except Exception as exc:  # the ingress still counts; say why, try again later
            log.warning("front door: cannot read the admission plan from Ray's KV: %s", exc)
            plan = None
        finally:
            self._reading = None
        if plan is not None and plan != self.plan:
            self.plan = plan
            self._count = Count(plan.capacity, on_refuse=lambda model: self._refused(model, 429))
            self._gate = KeyGate(self._counted, plan.digests, refuse=self._unauthorized)
            counts = ", ".join(f"{m} {c.requests}" for m, c in plan.capacity.items())
            log.info(
                "front door: admitting at most %s requests at a time; %d API keys", counts, len(plan.digests)
            )

    def _unauthorized(self, status: int, message: str) -> Response:
        self._refused("", status)
        return openai_error(status, message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        self._refresh()
        if self._gate is None:  # no plan yet: the ingress checks and counts
            await self.app(scope, receive, send)
            return
        await self._gate(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        count = self._count
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length", b"")
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if not length.isdigit() or int(length) > READ_LIMIT or ctype not in _JSON_TYPES:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        complete = False
        while len(body) <= READ_LIMIT:  # a Content-Length that lies stops here too
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":  # the client went away: pass that on
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                complete = True
                break
        replay = iter(messages)

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        model: Any = _model_of(body) if complete else None
        if count.counts(model):
            await count.admit(model, self.app, scope, replayed, send)
        else:
            await self.app(scope, replayed, send)


def proxy_middlewares() -> list[Middleware]:
    """Ray's proxy callback: rag/stack/serve.py names it in RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH."""
    return [Middleware(FrontDoor)]
