"""The boundary: request bodies checked as bytes, before any route (or engine) sees them.

`Boundary` is ASGI middleware on every route served by POST: a body over
MAX_BODY_BYTES is a 413 (from Content-Length, and counted again while it is read,
since a chunked body has none), a Content-Type that is not JSON a 415. The body is
then parsed once (`read_json`): invalid JSON, nesting past MAX_JSON_DEPTH and
unpaired UTF-16 surrogates are 400s naming the field; the body's `model` is left in
the ASGI scope (`MODEL_KEY`) for the admission count inside (rag/stack/admission.py).
Each refusal is in the OpenAI error shape (rag.stack.ingress.errors).
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.stack.admission import MODEL_KEY
from rag.stack.ingress.errors import openai_error, refuse
from rag.stack.ingress.limits import Refusal

__all__ = ["MAX_BODY_BYTES", "MAX_JSON_DEPTH", "MODEL_KEY", "Boundary", "check_json", "read_json"]

# The largest request the engines take is well under this: 256 embedding inputs of
# 256 tokens, or 64 rerank documents of 2048 tokens, are 0.5 MiB of text.
MAX_BODY_BYTES = 4 << 20
# JSON nesting a body may have. Ray pickles each request to its engine and fails (a
# 500) near 300 levels; the deepest real request (a structured-output schema within
# SCHEMA_LIMITS.max_depth, inside the request) stays well under this.
MAX_JSON_DEPTH = 64
_JSON_TYPES = ("application/json", "text/json")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _path(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def check_json(body: bytes) -> Refusal | None:
    """A request body as JSON: valid, nested at most MAX_JSON_DEPTH deep, and no string
    holding an unpaired UTF-16 surrogate (`\\ud800` alone: valid JSON, but no engine's
    tokenizer can encode it, so it would fail as a 500 inside the engine)."""
    return read_json(body)[1]


def read_json(body: bytes) -> tuple[Any, Refusal | None]:
    """The body parsed, and what `check_json` finds wrong with it (None: nothing)."""
    try:
        data = json.loads(body)
    except RecursionError:
        return None, Refusal(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    except UnicodeDecodeError:
        return None, Refusal("the body is not UTF-8 text; send JSON encoded as UTF-8")
    except ValueError as exc:
        return None, Refusal(f"the body is not valid JSON: {exc}")
    return data, _problem(data, body)


def _problem(data: Any, body: bytes) -> Refusal | None:
    strings = _SURROGATE_ESCAPE.search(body) is not None  # lone surrogates need an escape
    todo: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while todo:
        node, at = todo.pop()
        if len(at) > MAX_JSON_DEPTH:
            return Refusal(f"{_path(at[:3])}... nests deeper than {MAX_JSON_DEPTH} levels", _path(at[:3]))
        if isinstance(node, dict):
            todo.extend((v, (*at, k)) for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((v, (*at, i)) for i, v in enumerate(node) if not isinstance(v, int | float))
        elif strings and isinstance(node, str) and (m := _SURROGATE.search(node)):
            where = _path(at)
            return Refusal(
                f"{where} holds an unpaired UTF-16 surrogate (\\u{ord(m.group()):04x}), which is not text; "
                "send valid Unicode (a character outside the BMP is a high and a low surrogate together)",
                where,
            )
    return None


class Boundary:
    """ASGI middleware: refuse bodies that are too large, not JSON, nested too deep or
    holding unpaired surrogates, before any route (or engine) sees them.

    Only on the routes `routes` serves by POST; any other path gets FastAPI's 404.
    The size comes from Content-Length and is counted again while the body is read
    (a chunked body has no Content-Length).
    """

    def __init__(self, app: ASGIApp, routes: FastAPI, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.routes = routes
        self.max_body_bytes = max_body_bytes
        self._posted: set[str] | None = None

    def _posts(self, path: str) -> bool:
        if self._posted is None:  # routes are added after the middleware, so look on first use
            self._posted = {
                getattr(r, "path", "") for r in self.routes.routes if "POST" in getattr(r, "methods", ())
            }
        return path in self._posted

    def _too_large(self, size: int) -> JSONResponse:
        return openai_error(
            413,
            f"request body is {size}{'+' if size > self.max_body_bytes else ''} bytes; the limit is "
            f"{self.max_body_bytes} (split the inputs over several requests)",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http" and scope.get("method") == "POST" and self._posts(scope.get("path", ""))
        ):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await self._too_large(int(length))(scope, receive, send)
            return
        if ctype not in _JSON_TYPES:
            refusal = openai_error(
                415,
                f"Content-Type {ctype or '(none)'!r} is not JSON; send the body as JSON with "
                "`Content-Type: application/json` (curl: -H 'Content-Type: application/json')",
            )
            await refusal(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await self._too_large(size)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        data, problem = read_json(body)
        if problem:
            await refuse(problem)(scope, receive, send)
            return
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            scope[MODEL_KEY] = data["model"]  # for Admission, inside: the body is parsed once
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
