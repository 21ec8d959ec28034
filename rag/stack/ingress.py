"""Our edge: Ray Serve LLM's OpenAI ingress, subclassed, with a strict boundary.

Built on Ray Serve LLM 2.60's extension points (`OpenAiIngress` subclassed, routes
wired by `make_fastapi_ingress` with our endpoint map), it keeps every route Ray
serves for text models and adds:

- `POST /v1/rerank` (and `/v2/rerank`, the Cohere v2 client's path): the Cohere /
  Jina / vLLM shape, `{model, query, documents, top_n?, return_documents?}` ->
  `{results: [{index, relevance_score, document?}]}` best first, served by /v1/score.
- Request checks before any engine sees a request: message roles, sequences per
  chat request, inputs per embeddings / score / rerank call (limits derived from
  each engine's batch, see `Limits`), body size and content type. Every refusal is
  a 4xx in the OpenAI error shape, `{"error": {"message", "type", "param", "code"}}`,
  and so is every error Ray or FastAPI raise for a malformed request.
- Back-pressure: each engine deployment has a bounded queue (serve_module's
  `_deployment`); a request past it is refused with 429 and Retry-After instead of
  queueing (Serve's own handler would answer a plain-text body).
- `/v1/models` carries each role's facts (guard format, reranker kind, limits) in
  `metadata["rag"]`, so clients ask the server instead of guessing.
- API keys (rag/stack/auth.py): with any key set, every route but `GET /health`
  needs `Authorization: Bearer KEY`; `GET /metrics` relays the loopback-only
  Prometheus endpoint behind the same key.
- JSON bodies are parsed once at the boundary: nesting past MAX_JSON_DEPTH and
  unpaired UTF-16 surrogates are 400s naming the field, and structured-output
  schemas are held to rag/stack/structured.py's limits.

Not routed: `/v1/audio/transcriptions` (no engine here takes audio).
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures' types.

import json
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    OpenAIHTTPException,
    ScoreRequest,
    TokenizeCompletionRequest,
    to_model_metadata,
)
from ray.llm._internal.serve.core.ingress.ingress import (
    DEFAULT_ENDPOINTS,
    OpenAiIngress,
    init,
    make_fastapi_ingress,
)
from ray.llm._internal.serve.core.server.builder import build_llm_deployment
from ray.serve.deployment import Application
from ray.serve.exceptions import BackPressureError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.stack.auth import KeyGate
from rag.stack.loopback import keep_replicas_on_loopback
from rag.stack.structured import SCHEMA_LIMITS, check_regex, check_schema, check_tools_schema

keep_replicas_on_loopback()  # imported as the ingress replica initializes (rag/stack/loopback.py)

__all__ = [
    "ENDPOINTS",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "ROLES_ALLOWED",
    "Limits",
    "RagIngress",
    "RerankRequest",
    "build_app",
    "check_chat",
    "check_completion",
    "check_embeddings",
    "check_score",
    "limits_for",
    "openai_error",
]

ROLES_ALLOWED = ("system", "user", "assistant", "tool")
# The largest request the engines take is well under this: 256 embedding inputs of
# 256 tokens, or 64 rerank documents of 2048 tokens, are 0.5 MiB of text.
MAX_BODY_BYTES = 4 << 20
# JSON nesting a body may have. Ray pickles each request to its engine and fails (a
# 500) near 300 levels; the deepest real request (a structured-output schema within
# SCHEMA_LIMITS.max_depth, inside the request) stays well under this.
MAX_JSON_DEPTH = 64
_JSON_TYPES = ("application/json", "text/json")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


# --------------------------------------------------------------------------- limits
@dataclass(frozen=True)
class Limits:
    """What one request may ask of one engine, derived from the engine's batch.

    A chat request may take a quarter of the chat engine's batch (`n` x prompts),
    so no single caller holds the engine; an embeddings call up to four batches of
    inputs (a pooling engine clears a batch in one step); a score or rerank call up
    to two batches of pairs.
    """

    batch: int  # the engine's max_num_seqs
    max_sequences: int  # chat / completions: n x prompts
    max_inputs: int  # embeddings: inputs per call
    max_pairs: int  # score / rerank: query-document pairs per call

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def limits_for(engine_kwargs: Mapping[str, Any]) -> Limits:
    """The request limits for an engine with these engine_kwargs."""
    batch = int(engine_kwargs.get("max_num_seqs") or 32)
    return Limits(batch=batch, max_sequences=max(1, batch // 4), max_inputs=4 * batch, max_pairs=2 * batch)


@dataclass(frozen=True)
class Refusal:
    """A request refused at the boundary: what is wrong, which field, and its status."""

    message: str
    param: str | None = None
    status: int = 400


def _role_of(message: Any) -> Any:
    if isinstance(message, Mapping):
        return message.get("role")
    return getattr(message, "role", None)


def _check_roles(messages: Any) -> Refusal | None:
    for i, message in enumerate(messages or ()):
        role = _role_of(message)
        if role not in ROLES_ALLOWED:
            return Refusal(
                f"messages[{i}].role is {role!r}; allowed roles are {', '.join(ROLES_ALLOWED)}",
                f"messages[{i}].role",
            )
    return None


def _structured(body: Any) -> Refusal | None:
    """Structured-output specs of a chat or completions request, held to SCHEMA_LIMITS."""
    why: str | None = None
    fmt = getattr(body, "response_format", None)
    schema = getattr(getattr(fmt, "json_schema", None), "json_schema", None)
    if getattr(fmt, "type", None) == "json_schema" and isinstance(schema, dict):
        why = check_schema(schema, "response_format.json_schema.schema")
    spec = getattr(body, "structured_outputs", None)
    if why is None and spec is not None:
        json_spec = getattr(spec, "json", None)
        if isinstance(json_spec, str):
            try:
                json_spec = json.loads(json_spec)
            except ValueError:
                return Refusal("structured_outputs.json is not valid JSON", "structured_outputs.json")
        if json_spec is not None:
            why = check_schema(json_spec, "structured_outputs.json")
        for name in ("regex", "grammar", "whitespace_pattern", "structural_tag"):
            text = getattr(spec, name, None)
            if why is None and isinstance(text, str):
                why = check_regex(text, f"structured_outputs.{name}")
        choice = getattr(spec, "choice", None)
        if why is None and isinstance(choice, list) and len(choice) > SCHEMA_LIMITS.max_enum_values:
            limit = SCHEMA_LIMITS.max_enum_values
            why = f"structured_outputs.choice has {len(choice)} options; the limit is {limit}"
    tools = getattr(body, "tools", None) or []
    choice_of_tool = getattr(body, "tool_choice", None)
    forced = choice_of_tool == "required" or (
        choice_of_tool is not None and not isinstance(choice_of_tool, str)
    )
    for i, tool in enumerate(tools if forced else []):
        parameters = getattr(getattr(tool, "function", None), "parameters", None)
        if why is None and isinstance(parameters, dict):
            param = f"tools[{i}].function.parameters"
            why = check_schema(parameters, param) or (
                check_tools_schema(parameters, param) if choice_of_tool == "required" else None
            )
    if why is None:
        return None
    return Refusal(why, why.split(" ", 1)[0])


def check_chat(body: ChatCompletionRequest, limits: Limits) -> Refusal | None:
    """Roles, sequences and structured-output specs of one chat completion request."""
    if refusal := _check_roles(body.messages):
        return refusal
    if refusal := _structured(body):
        return refusal
    n = body.n or 1
    if n > limits.max_sequences:
        return Refusal(
            f"n={n} asks for more sequences than one request may take from this engine "
            f"(at most {limits.max_sequences}: a quarter of its batch of {limits.batch}); "
            "send several requests instead",
            "n",
        )
    return None


def check_completion(body: CompletionRequest, limits: Limits) -> Refusal | None:
    """Prompts x n and structured-output specs of one completions request."""
    if refusal := _structured(body):
        return refusal
    prompt = body.prompt
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    sequences = prompts * (body.n or 1)
    if sequences > limits.max_sequences:
        return Refusal(
            f"{prompts} prompt(s) x n={body.n or 1} = {sequences} sequences; one request may take at most "
            f"{limits.max_sequences} (a quarter of this engine's batch of {limits.batch}); split it",
            "prompt" if prompts > 1 else "n",
        )
    return None


def _count(value: Any) -> int:
    """How many inputs a str / list[str] / list[int] / list[list[int]] field holds."""
    if isinstance(value, list) and value and not isinstance(value[0], int):
        return len(value)
    return 1


def check_embeddings(body: Any, limits: Limits) -> Refusal | None:
    """Inputs (or chat messages' roles) of one embeddings request."""
    messages = getattr(body, "messages", None)
    if messages is not None:
        return _check_roles(messages)
    inputs = _count(getattr(body, "input", None))
    if inputs > limits.max_inputs:
        return Refusal(
            f"{inputs} inputs in one embeddings call; this engine takes at most {limits.max_inputs} "
            f"per call (4 batches of {limits.batch}); send them in several calls",
            "input",
        )
    return None


def check_score(body: Any, limits: Limits, field: str = "text_2") -> Refusal | None:
    """Query-document pairs of one score (or rerank) request."""
    first = getattr(body, "text_1", None)
    second = getattr(body, "text_2", None)
    pairs = max(_count(first), _count(second))
    if pairs > limits.max_pairs:
        return Refusal(
            f"{pairs} documents in one call; this engine scores at most {limits.max_pairs} per call "
            f"(2 batches of {limits.batch}); send them in several calls",
            field,
        )
    return None


# --------------------------------------------------------------------------- rerank
# Fields vLLM's score request takes that its rerank request defines too: passed through.
_SCORE_FIELDS = (
    "max_tokens_per_doc", "max_tokens_per_query", "truncate_prompt_tokens", "truncation_side",
    "instruction", "chat_template_kwargs", "use_activation", "user", "cache_salt", "mm_processor_kwargs",
)  # fmt: skip


class RerankRequest(BaseModel):
    """One request shape for the rerank clients we claim: every field Cohere v2, Cohere v1,
    Jina and vLLM define is accepted; anything else is a 400 naming the field.

    documents: strings (all), `{"text": ...}` (Cohere v1, Jina, vLLM) or objects of any
    fields ranked on `rank_fields` (Cohere v1: "field: value" lines, in that order).
    """

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    query: str
    documents: list[str | dict[str, Any]] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=0)  # vLLM: 0 means all
    return_documents: bool = True  # Cohere v1, Jina (Cohere v2 never returns them)
    rank_fields: list[str] | None = Field(default=None, min_length=1)  # Cohere v1
    max_chunks_per_doc: int | None = None  # Cohere v1, deprecated: accepted, no effect (no chunking here)
    priority: int | None = None  # Cohere v2, vLLM: accepted; the engines serve in arrival order
    return_embeddings: bool = False  # Jina: only `false` (rerank returns no embeddings here)
    request_id: str | None = None  # vLLM
    # Cohere v2 and vLLM: each document cut to this many tokens before scoring.
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    # vLLM only, passed to the score engine as they are:
    max_tokens_per_query: int | None = Field(default=None, ge=1)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    use_activation: bool | None = None
    user: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    mm_processor_kwargs: dict[str, Any] | None = None

    def texts(self) -> list[str] | Refusal:
        """Each document as the text the reranker scores, or why one cannot be."""
        fields = self.rank_fields or ["text"]
        out: list[str] = []
        for i, doc in enumerate(self.documents):
            if isinstance(doc, str):
                out.append(doc)
                continue
            missing = [f for f in fields if f not in doc]
            if missing:
                named = (
                    "rank_fields"
                    if self.rank_fields
                    else "a `text` field (or name its fields in rank_fields)"
                )
                return Refusal(
                    f"documents[{i}] has no {', '.join(map(repr, missing))}; it needs {named}",
                    f"documents[{i}]",
                )
            if not self.rank_fields:
                out.append(str(doc["text"]))
            else:
                out.append("\n".join(f"{f}: {doc[f]}" for f in fields))
        return out

    def score_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _SCORE_FIELDS if getattr(self, k) is not None}


def _rerank_results(
    request: RerankRequest, texts: list[str], scores: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    ranked = sorted(scores, key=lambda d: -float(d["score"]))
    if request.top_n:
        ranked = ranked[: request.top_n]
    results = []
    for d in ranked:
        item: dict[str, Any] = {"index": int(d["index"]), "relevance_score": float(d["score"])}
        if request.return_documents:  # as sent: an object document comes back whole (Cohere v1)
            sent = request.documents[int(d["index"])]
            item["document"] = sent if isinstance(sent, dict) else {"text": texts[int(d["index"])]}
        results.append(item)
    return results


# --------------------------------------------------------------------------- errors
def openai_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    type_: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error response in the OpenAI shape, which every OpenAI-compatible client unpacks."""
    body = {
        "error": {
            "message": message,
            "type": type_
            or _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": status,
        }
    }
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _refuse(refusal: Refusal) -> JSONResponse:
    return openai_error(refusal.status, refusal.message, param=refusal.param)


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


def _backpressure(exc: Exception) -> JSONResponse:
    retry_after = getattr(exc, "retry_after_s", None)
    status = int(getattr(exc, "status_code", 429) or 429)
    headers = {"Retry-After": str(math.ceil(retry_after))} if retry_after is not None else {}
    wait = f"retry after {headers['Retry-After']} s" if headers else "retry shortly"
    return openai_error(
        status,
        f"the engine is busy: its queue is full ({getattr(exc, 'message', exc)}); {wait}",
        headers=headers,
    )


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
    try:
        data = json.loads(body)
    except RecursionError:
        return Refusal(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    except UnicodeDecodeError:
        return Refusal("the body is not UTF-8 text; send JSON encoded as UTF-8")
    except ValueError as exc:
        return Refusal(f"the body is not valid JSON: {exc}")
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
        if problem := check_json(body):
            await _refuse(problem)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# --------------------------------------------------------------------------- ingress
class RagIngress(OpenAiIngress):
    """Ray's OpenAI ingress with request checks, 429s on a full queue, and /v1/rerank."""

    def __init__(
        self,
        llm_deployments: Any,
        model_cards: Any,
        *,
        lora_paths: dict[str, str] | None = None,
        limits: dict[str, dict[str, int]] | None = None,
        metrics_port: int | None = None,
    ) -> None:
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths)
        self._limits = {model: Limits(**v) for model, v in (limits or {}).items()}
        self._metrics_port = metrics_port

    def _check(self, model: str | None, check: Callable[[Limits], Refusal | None]) -> Response | None:
        limits = self._limits.get(model or "")
        if limits is None:  # unknown or missing model: Ray's own lookup answers 400/404
            return None
        refusal = check(limits)
        return _refuse(refusal) if refusal is not None else None

    @staticmethod
    async def _unless_busy(call: Awaitable[Response]) -> Response:
        try:
            return await call
        except BackPressureError as exc:
            return _backpressure(exc)

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        refused = self._check(body.model, lambda lim: check_chat(body, lim))
        return refused or await self._unless_busy(super().chat(body, request))

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        refused = self._check(body.model, lambda lim: check_completion(body, lim))
        return refused or await self._unless_busy(super().completions(body, request))

    async def embeddings(self, body: EmbeddingRequest, request: Request) -> Response:
        refused = self._check(body.model, lambda lim: check_embeddings(body, lim))
        return refused or await self._unless_busy(super().embeddings(body, request))

    async def score(self, body: ScoreRequest, request: Request) -> Response:
        refused = self._check(body.model, lambda lim: check_score(body, lim))
        return refused or await self._unless_busy(super().score(body, request))

    async def tokenize(self, body: TokenizeCompletionRequest, request: Request) -> Response:
        return await self._unless_busy(super().tokenize(body, request))

    async def detokenize(self, body: DetokenizeRequest, request: Request) -> Response:
        return await self._unless_busy(super().detokenize(body, request))

    async def rerank(self, body: RerankRequest, request: Request) -> Response:
        """Cohere / Jina / vLLM rerank, through the score engine's /v1/score."""
        if body.return_embeddings:
            return openai_error(
                400, "return_embeddings: rerank returns no embeddings here; use /v1/embeddings",
                param="return_embeddings",
            )  # fmt: skip
        texts = body.texts()
        if isinstance(texts, Refusal):
            return _refuse(texts)
        documents: list[Any] = texts
        score = ScoreRequest(model=body.model, text_1=body.query, text_2=documents, **body.score_options())
        refused = self._check(body.model, lambda lim: check_score(score, lim, field="documents"))
        if refused:
            return refused
        response = await self._unless_busy(super().score(score, request))
        if response.status_code != 200 or not isinstance(response, JSONResponse):
            return response
        scored = json.loads(bytes(response.body))
        return JSONResponse(
            {
                "id": body.request_id or f"rerank-{uuid.uuid4().hex}",
                "model": scored.get("model", body.model),
                "results": _rerank_results(body, texts, scored.get("data", [])),
                "usage": scored.get("usage"),
            }
        )

    async def rerank_v2(self, body: RerankRequest, request: Request) -> Response:
        return await self.rerank(body, request)

    async def health(self) -> Response:
        """Open to all (no key): the ingress is up. `rag serve` probes each engine itself."""
        return JSONResponse({"status": "ok"})

    async def metrics(self) -> Response:
        """Ray's Prometheus endpoint (loopback only) relayed behind the API key, so a
        scraper on another machine reaches it through --host as every route is."""
        if not self._metrics_port:
            return openai_error(404, "metrics are off: start `rag serve` with --metrics-port PORT")
        import httpx  # only here: a replica that is never scraped never imports it

        try:
            async with httpx.AsyncClient(timeout=10) as client:
                r = await client.get(f"http://127.0.0.1:{self._metrics_port}/metrics")
        except httpx.HTTPError as exc:
            return openai_error(
                503, f"Ray's metrics endpoint on 127.0.0.1:{self._metrics_port} did not answer: {exc}"
            )
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))


# Every route Ray serves for text models, plus ours. Transcriptions are left out:
# no engine here takes audio, so the route would only ever fail.
ENDPOINTS: dict[str, Callable[[FastAPI], Callable[..., Any]]] = {
    **{name: route for name, route in DEFAULT_ENDPOINTS.items() if name != "transcriptions"},
    "rerank": lambda app: app.post("/v1/rerank"),
    "rerank_v2": lambda app: app.post("/v2/rerank"),
    "health": lambda app: app.get("/health"),
    "metrics": lambda app: app.get("/metrics"),
}


def _refuse_status(status: int, message: str) -> Response:
    return openai_error(status, message)


def _app(key_digests: tuple[str, ...] = ()) -> FastAPI:
    app = init()  # Ray's FastAPI app: its middleware (request ids, metrics, errors)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OpenAIHTTPException, _openai_http_error)
    app.add_middleware(Boundary, routes=app)
    app.add_middleware(KeyGate, digests=key_digests, refuse=_refuse_status)  # added last: runs first
    return app


def _source(config: LLMConfig) -> str:
    loading = config.model_loading_config  # a ModelLoadingConfig once LLMConfig has validated it
    return str(loading["model_source"] if isinstance(loading, dict) else loading.model_source)


def _generates(config: LLMConfig) -> bool:
    return (config.engine_kwargs or {}).get("runner") != "pooling"


def build_app(
    configs: Mapping[str, LLMConfig],
    facts: Mapping[str, Mapping[str, Any]],
    *,
    key_digests: tuple[str, ...] = (),
    metrics_port: int | None = None,
) -> Application:
    """The Serve application: one deployment per config behind a RagIngress.

    `facts[role]` goes into that model's /v1/models metadata["rag"], with its limits
    (and the structured-output limits for an engine that generates). With
    `key_digests` (SHA-256 of each API key, rag/stack/auth.py) every route but
    /health needs one of those keys; `metrics_port` is where /metrics relays from.
    """
    llm_configs = list(configs.values())
    role_of = {c.model_id: role for role, c in configs.items()}
    limits = {c.model_id: limits_for(c.engine_kwargs or {}) for c in llm_configs}
    cards = {
        c.model_id: to_model_metadata(
            c.model_id,
            c,
            overrides={
                "rag": {
                    "role": role_of[c.model_id],
                    # where its weights and tokenizer come from: a hub name or a local folder
                    "source": _source(c),
                    **facts.get(role_of[c.model_id], {}),
                    "limits": {
                        **limits[c.model_id].as_dict(),
                        **(SCHEMA_LIMITS.as_dict() if _generates(c) else {}),
                    },
                }
            },
        )
        for c in llm_configs
    }
    ingress_cls = make_fastapi_ingress(RagIngress, endpoint_map=ENDPOINTS, app=_app(tuple(key_digests)))
    options = RagIngress.get_deployment_options(llm_configs)
    deployment: Any = serve.deployment(ingress_cls, **options)
    app: Application = deployment.bind(
        llm_deployments={c.model_id: build_llm_deployment(c) for c in llm_configs},
        model_cards=cards,
        lora_paths={},
        limits={m: lim.as_dict() for m, lim in limits.items()},
        metrics_port=metrics_port,
    )
    return app
