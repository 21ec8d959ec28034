"""Admission: each engine takes a fixed number of requests at a time, counted at the edge.

Serve's own bound (`max_queued_requests`) counts a request as queued only while its
router looks for a replica; once a replica has taken it, it counts there, and the
router's view of the replicas lags. Measured on the CPU stack (batch 64, queue 64):
a burst of 192 chats was sometimes refused past 136, sometimes not at all, and a
request arriving a second after the first refusals was let in. So the edge counts
itself: a `Count` lets at most `capacity[model]` requests per engine be in flight,
from the body read to the last byte of the response (streams included), and answers
the next with 429 and Retry-After in the OpenAI shape.

It counts in two places, the same way:
- in Ray's HTTP proxy, the front door (rag/stack/front_door.py), before the request
  crosses a handle: what `rag serve` runs;
- in the ingress (`Admission`, inside the Boundary, which has parsed the body and
  left its `model` in the scope under MODEL_KEY), for a stack started without the
  front door (`serve run scripts/serve_module:app`). Behind the front door it never
  refuses: a request leaves the ingress before it leaves the proxy.
Serve's bound stays behind both, for a replica restarting.

Light on purpose: Ray's proxy imports it (no Ray Serve LLM, no vLLM).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from rag.stack.error_shape import openai_error

__all__ = ["MODEL_KEY", "Admission", "Capacity", "Count"]

# The scope key under which the Boundary leaves the body's `model` for the routes inside.
MODEL_KEY = "rag.model"


@dataclass(frozen=True)
class Capacity:
    """How many requests an engine holds (a batch running plus a batch queued) and how
    long a refused client is told to wait."""

    requests: int
    retry_after_s: float


class Count:
    """Requests in flight per model, each model held to its capacity; `on_refuse(model)`
    is told of each refusal (the front door counts them in a metric)."""

    def __init__(
        self, capacity: Mapping[str, Capacity], on_refuse: Callable[[str], None] | None = None
    ) -> None:
        self.capacity = dict(capacity)
        self.in_flight = dict.fromkeys(self.capacity, 0)
        self.on_refuse = on_refuse

    def counts(self, model: object) -> bool:
        return isinstance(model, str) and model in self.capacity

    async def admit(self, model: str, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Run `app` for this request if `model` has room (until it returns), else a 429."""
        cap = self.capacity[model]
        if self.in_flight[model] >= cap.requests:
            wait = math.ceil(cap.retry_after_s)
            refusal = openai_error(
                429,
                f"the engine is busy: `{model}` holds {cap.requests} requests (a batch running "
                f"and one waiting) and all are taken; retry after {wait} s",
                headers={"Retry-After": str(wait)},
            )
            if self.on_refuse:
                self.on_refuse(model)
            await refusal(scope, receive, send)
            return
        self.in_flight[model] += 1
        try:
            await app(scope, receive, send)
        finally:
            self.in_flight[model] -= 1


class Admission:
    """ASGI middleware (the ingress's): the `Count`, by the model the Boundary found."""

    def __init__(self, app: ASGIApp, capacity: Mapping[str, Capacity]) -> None:
        self.app = app
        self.count = Count(capacity)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model = scope.get(MODEL_KEY) if scope["type"] == "http" else None
        if not self.count.counts(model):  # no body, or a model Ray's own lookup refuses
            await self.app(scope, receive, send)
            return
        await self.count.admit(str(model), self.app, scope, receive, send)
