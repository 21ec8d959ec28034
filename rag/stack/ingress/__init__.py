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
- Back-pressure: each engine holds a batch running and a batch queued (serve_module's
  `_deployment`), counted at the edge (rag/stack/admission.py: in Ray's proxy, the
  front door, and again here); a request past that is refused with 429 and
  Retry-After before it crosses a handle, instead of queueing. Serve's own bound
  stays behind it (its handler would answer a plain-text body).
- `/v1/models` carries each role's facts (guard format, reranker kind, limits) in
  `metadata["rag"]`, so clients ask the server instead of guessing.
- API keys (rag/stack/auth.py): with any key set, every route but `GET /health`
  needs `Authorization: Bearer KEY`; `GET /metrics` relays the loopback-only
  Prometheus endpoint behind the same key.
- JSON bodies are parsed once at the boundary: nesting past MAX_JSON_DEPTH and
  unpaired UTF-16 surrogates are 400s naming the field, and structured-output
  schemas are held to rag/stack/structured.py's limits.

- The `rag` model on /v1/chat/completions (rag_model.py): `rag ask`'s guarded, cited
  answer for any OpenAI client, through the engines' Serve handles, from the index
  `rag serve --index` names; and the web page at `/` (web/) that asks it.

Not routed: `/v1/audio/transcriptions` (no engine here takes audio).

    limits.py    what one request may ask of one engine; roles; structured output
    rerank.py    the rerank request shape and its results
    errors.py    the OpenAI error shape for refusals, Ray's and FastAPI's errors, 429s
    boundary.py  body size, content type and JSON checks, before any route
    rag_model.py the `rag` model: its request checks, limits, answers streamed or whole
    handles.py   the engines through Serve handles, as the query path calls them
    completion.py  an answer in the OpenAI chat shape, with its sources
    web/         the page: index.html, app.js, app.css (no build step, no CDN)
    app.py       RagIngress, its FastAPI app, build_app
"""

from rag.stack.admission import Admission, Capacity
from rag.stack.ingress.app import ENDPOINTS, RagIngress, build_app, make_app
from rag.stack.ingress.boundary import MAX_BODY_BYTES, MAX_JSON_DEPTH, Boundary, check_json
from rag.stack.ingress.errors import openai_error
from rag.stack.ingress.limits import (
    ROLES_ALLOWED,
    Limits,
    Refusal,
    check_chat,
    check_completion,
    check_embeddings,
    check_score,
    limits_for,
)
from rag.stack.ingress.rerank import RerankRequest

__all__ = [
    "ENDPOINTS",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "ROLES_ALLOWED",
    "Admission",
    "Boundary",
    "Capacity",
    "Limits",
    "RagIngress",
    "Refusal",
    "RerankRequest",
    "build_app",
    "check_chat",
    "check_completion",
    "check_embeddings",
    "check_json",
    "check_score",
    "limits_for",
    "make_app",
    "openai_error",
]
