"""Admission: each engine takes a fixed number of requests at a time, counted at the edge.

Serve's own bound (`max_queued_requests`) counts a request as queued only while its
router looks for a replica; once a replica has taken it, it counts there, and the
router's view of the replicas lags. Measured on the CPU stack (batch 64, queue 64):
a burst of 192 chats was sometimes refused past 136, sometimes not at all, and a
request arriving a second after the first refusals was let in. So the ingress counts
itself: `Admission` is ASGI middleware inside the Boundary (which has parsed the body
and left its `model` in the scope) that lets at most `capacity[model]` requests per
engine be in flight, from the body parsed to the last byte of the response
(streams included), and answers the next with 429 and Retry-After before the request
crosses a handle. Serve's bound stays behind it, for a replica restarting.

The count is per ingress replica; the deployment runs one (`rag.stack.ingress.app`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from rag.stack.ingress.boundary import MODEL_KEY
from rag.stack.ingress.errors import openai_error

__all__ = ["Admission", "Capacity"]


@dataclass(frozen=True)
class Capacity:
    """How many requests an engine holds (a batch running plus a batch queued) and how
    long a refused client is told to wait."""

    requests: int
    retry_after_s: float


class Admission:
    """ASGI middleware: at most `capacity[model].requests` requests per model in flight."""

    def __init__(self, app: ASGIApp, capacity: Mapping[str, Capacity]) -> None:
        self.app = app
        self.capacity = dict(capacity)
        self.in_flight = dict.fromkeys(self.capacity, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model = scope.get(MODEL_KEY) if scope["type"] == "http" else None
        cap = self.capacity.get(model) if isinstance(model, str) else None
        if cap is None or model is None:  # no body, or a model Ray's own lookup refuses
            await self.app(scope, receive, send)
            return
        if self.in_flight[model] >= cap.requests:
            wait = math.ceil(cap.retry_after_s)
            refusal = openai_error(
                429,
                f"the engine is busy: `{model}` holds {cap.requests} requests (a batch running "
                f"and one waiting) and all are taken; retry after {wait} s",
                headers={"Retry-After": str(wait)},
            )
            await refusal(scope, receive, send)
            return
        self.in_flight[model] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[model] -= 1
