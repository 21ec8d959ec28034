"""Every error the edge answers, in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

The shape every OpenAI-compatible client unpacks, for our own refusals (a
`Refusal`, a missing API key) and for what Ray or FastAPI raise on a malformed
request: a body that fails validation names the field in `param`, HTTP errors
keep their status and headers, and an engine whose queue is full (Serve's
BackPressureError, whose own handler would answer a plain-text body) is a 429
with Retry-After instead of a request left to queue.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from rag.stack.error_shape import openai_error
from rag.stack.ingress.limits import Refusal

__all__ = ["add_error_handlers", "backpressure_error", "openai_error", "refuse", "refuse_status"]


def refuse(refusal: Refusal) -> JSONResponse:
    """A refused request's response: its status, message and field."""
    return openai_error(refusal.status, refusal.message, param=refusal.param)


def refuse_status(status: int, message: str) -> Response:
    """A refusal with no field, for rag.stack.auth.KeyGate's `refuse(status, message)`."""
    return openai_error(status, message)


def backpressure_error(exc: Exception) -> JSONResponse:
    """Serve's BackPressureError (the engine's queue is full) as a 429 with Retry-After."""
    retry_after = getattr(exc, "retry_after_s", None)
    status = int(getattr(exc, "status_code", 429) or 429)
    headers = {"Retry-After": str(math.ceil(retry_after))} if retry_after is not None else {}
    wait = f"retry after {headers['Retry-After']} s" if headers else "retry shortly"
    return openai_error(
        status,
        f"the engine is busy: its queue is full ({getattr(exc, 'message', exc)}); {wait}",
        headers=headers,
    )


def _where(loc: Any) -> str:
    parts = [str(p) for p in loc if p != "body"] if isinstance(loc, list | tuple) else [str(loc)]
    return ".".join(parts) or "body"


async def _validation_error(request: Request, exc: Exception) -> Response:
    # Ray's own handler puts the offending input in `param`, which fails to serialize
    # (a 500) when the input is bytes, as it is for a body that is not JSON.
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    if not errors:
        return openai_error(400, "invalid request body")
    first = errors[0]
    where = _where(first.get("loc", ()))
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return openai_error(400, f"{where}: {first.get('msg', 'invalid value')}{more}", param=where)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or str(exc)
    headers = getattr(exc, "headers", None)
    return openai_error(status, str(detail), headers=headers)


async def _openai_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OpenAIHTTPException)
    type_ = exc.type if exc.type and exc.type != "Unknown" else None
    return openai_error(exc.status_code, exc.message, type_=type_)


def add_error_handlers(app: FastAPI) -> None:
    """Answer validation errors, HTTP errors and Ray's OpenAIHTTPException in the OpenAI shape."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OpenAIHTTPException, _openai_http_error)
