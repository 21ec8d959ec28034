"""The Serve application: Ray Serve LLM's OpenAI ingress, subclassed, behind our boundary.

Built on Ray Serve LLM 2.60's extension points (`OpenAiIngress` subclassed, routes
wired by `make_fastapi_ingress` with our endpoint map `ENDPOINTS`), `RagIngress`
keeps every route Ray serves for text models, checks each request against its
engine's `Limits` before the engine sees it, answers a full engine queue with 429
and Retry-After, and adds /v1/rerank, /health, /metrics (Ray's loopback-only
Prometheus endpoint relayed behind the API key), the `rag` model (rag_model.py) and
the web page at `/`. `make_app` is the FastAPI app
under it: Ray's, with our error handlers, the `Boundary` and the `KeyGate`.
`build_app` binds one deployment per LLMConfig behind a RagIngress, with each
role's facts in its /v1/models `metadata["rag"]`; the replica publishes what to
count and the keys' digests for the front door in Ray's proxy (rag/stack/front_door.py).

Serve pickles RagIngress and each ingress replica imports it from this module.
Over 300 lines because it is one class with a method per route (Ray wires routes to
the methods of the class it is given), and the builder that binds them.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures' types.

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from ray import serve
from ray.exceptions import RayActorError
from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    ModelCard,
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
from starlette.responses import JSONResponse, Response

from rag.settings import Settings
from rag.stack.admission import Admission, Capacity
from rag.stack.auth import KeyGate
from rag.stack.front_door import Plan, publish
from rag.stack.ingress.boundary import Boundary
from rag.stack.ingress.errors import (
    add_error_handlers,
    backpressure_error,
    openai_error,
    refuse,
    refuse_status,
)
from rag.stack.ingress.limits import (
    Limits,
    Refusal,
    check_chat,
    check_completion,
    check_embeddings,
    check_score,
    limits_for,
)
from rag.stack.ingress.rag_model import RAG_MODEL, RagLimits, RagModel, Readiness
from rag.stack.ingress.rerank import RerankRequest, rerank_results
from rag.stack.loopback import keep_replicas_on_loopback
from rag.stack.structured import SCHEMA_LIMITS
from rag.store import LiveIndex

keep_replicas_on_loopback()  # imported as the ingress replica initializes (rag/stack/loopback.py)

__all__ = ["ENDPOINTS", "RagIngress", "build_app", "make_app"]

WEB = Path(__file__).resolve().parent / "web"  # the page: plain files, no build step, no CDN
WEB_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
logger = logging.getLogger("ray.serve")
# Calls to an engine whose replica died before answering: the first and two more, on the
# replicas Serve's router still has (a node lost takes one of each role it held).
LOST_REPLICA_TRIES = 3
WEB_FILES = frozenset(p.name for p in WEB.iterdir() if p.suffix in WEB_TYPES) if WEB.is_dir() else frozenset()
# Everything the page loads comes from here; nothing inline, nothing from elsewhere.
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"


def _engine_states() -> dict[str, str]:
    """Each deployment's Serve status in this replica's app, by role."""
    from rag.stack.serve import deployment_states

    app_name = serve.get_replica_context().app_name
    return {role: status for role, (status, _) in deployment_states(app_name).items()}


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
        rag: dict[str, Any] | None = None,
        front_door: bytes | None = None,
    ) -> None:
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths)
        if front_door is not None:  # for Ray's proxy to count and check keys (front_door.py)
            publish(Plan.loads(front_door))
        self._limits = {model: Limits(**v) for model, v in (limits or {}).items()}
        self._metrics_port = metrics_port
        self._rag: RagModel | None = None
        if rag is not None:  # the `rag` model, over these engines' handles (rag_model.py)
            settings: Settings = rag["settings"]
            rag_limits = RagLimits(**rag["limits"])
            self._model_cards[RAG_MODEL] = ModelCard(
                id=RAG_MODEL, object="model", owned_by="rag", permission=[],
                metadata={"rag": {
                    "role": "rag", "index_dir": str(settings.index_dir), "limits": rag_limits.as_dict(),
                }},
            )  # fmt: skip
            self._rag = RagModel(
                settings,
                LiveIndex(settings.index_dir),
                rag_limits,
                lambda body, method: self._get_response(body=body, call_method=method),
                lambda: {m: dict(card.metadata.get("rag") or {}) for m, card in self._model_cards.items()},
                Readiness(_engine_states),
            )

    @staticmethod
    def _only_chat(model: str | None) -> Response | None:
        """The `rag` model answers chat completions only."""
        if model != RAG_MODEL:
            return None
        return openai_error(
            400, f"model `{RAG_MODEL}` answers /v1/chat/completions only; name an engine "
            "(chat, guard, embed, score) for this route", param="model",
        )  # fmt: skip

    def _check(self, model: str | None, check: Callable[[Limits], Refusal | None]) -> Response | None:
        limits = self._limits.get(model or "")
        if limits is None:  # unknown or missing model: Ray's own lookup answers 400/404
            return None
        refusal = check(limits)
        return refuse(refusal) if refusal is not None else None

    @staticmethod
    async def call_engine(call: Callable[[], Awaitable[Response]]) -> Response:
        """The engine's response; a 429 with Retry-After when its queue is full; and the
        call made again when the replica it went to died before answering.

        A replica lost with its node (or its process killed) fails every request it held.
        Those that had not answered yet have sent the client nothing, so they go again:
        Serve's router has struck the dead replica off by then and picks a live one. A
        stream that had started cannot be taken back, and fails (tests/test_cluster.py)."""
        for attempt in range(1, LOST_REPLICA_TRIES + 1):
            try:
                return await call()
            except BackPressureError as exc:
                return backpressure_error(exc)
            except RayActorError as exc:
                if attempt == LOST_REPLICA_TRIES:
                    return openai_error(
                        503, f"the engine's replicas were lost {attempt} times in a row "
                        f"({type(exc).__name__}); retry shortly", headers={"Retry-After": "5"},
                    )  # fmt: skip
                logger.warning("a replica died before answering (%s); trying again", type(exc).__name__)
                await asyncio.sleep(0.2 * attempt)
        raise AssertionError("unreachable")

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        if body.model == RAG_MODEL and self._rag is not None:
            return await self._rag.respond(body)
        refused = self._check(body.model, lambda lim: check_chat(body, lim))
        return refused or await self.call_engine(partial(super().chat, body, request))

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        refused = self._only_chat(body.model) or self._check(
            body.model, lambda lim: check_completion(body, lim)
        )
        return refused or await self.call_engine(partial(super().completions, body, request))

    async def embeddings(self, body: EmbeddingRequest, request: Request) -> Response:
        refused = self._only_chat(body.model) or self._check(
            body.model, lambda lim: check_embeddings(body, lim)
        )
        return refused or await self.call_engine(partial(super().embeddings, body, request))

    async def score(self, body: ScoreRequest, request: Request) -> Response:
        refused = self._only_chat(body.model) or self._check(body.model, lambda lim: check_score(body, lim))
        return refused or await self.call_engine(partial(super().score, self._as_trained(body), request))

    def _as_trained(self, body: ScoreRequest) -> ScoreRequest:
        """`body` with each document cut where the reranker was trained to read it (its
        `max_tokens_per_doc` fact, the CPU cross-encoder's 160 tokens), unless it says."""
        card = self._model_cards.get(body.model or "")
        trained = (card.metadata or {}).get("rag", {}).get("max_tokens_per_doc") if card else None
        if not trained or body.max_tokens_per_doc:
            return body
        return body.model_copy(update={"max_tokens_per_doc": int(trained)})

    async def tokenize(self, body: TokenizeCompletionRequest, request: Request) -> Response:
        return await self.call_engine(partial(super().tokenize, body, request))

    async def detokenize(self, body: DetokenizeRequest, request: Request) -> Response:
        return await self.call_engine(partial(super().detokenize, body, request))

    async def rerank(self, body: RerankRequest, request: Request) -> Response:
        """Cohere / Jina / vLLM rerank, through the score engine's /v1/score."""
        if refused_rag := self._only_chat(body.model):
            return refused_rag
        if body.return_embeddings:
            return openai_error(
                400, "return_embeddings: rerank returns no embeddings here; use /v1/embeddings",
                param="return_embeddings",
            )  # fmt: skip
        texts = body.texts()
        if isinstance(texts, Refusal):
            return refuse(texts)
        documents: list[Any] = texts
        score = ScoreRequest(model=body.model, text_1=body.query, text_2=documents, **body.score_options())
        refused = self._check(body.model, lambda lim: check_score(score, lim, field="documents"))
        if refused:
            return refused
        response = await self.call_engine(partial(super().score, self._as_trained(score), request))
        if response.status_code != 200 or not isinstance(response, JSONResponse):
            return response
        scored = json.loads(bytes(response.body))
        return JSONResponse(
            {
                "id": body.request_id or f"rerank-{uuid.uuid4().hex}",
                "model": scored.get("model", body.model),
                "results": rerank_results(body, texts, scored.get("data", [])),
                "usage": scored.get("usage"),
            }
        )

    async def rerank_v2(self, body: RerankRequest, request: Request) -> Response:
        return await self.rerank(body, request)

    async def health(self) -> Response:
        """Open to all (no key): the ingress is up. `rag serve` probes each engine itself."""
        return JSONResponse({"status": "ok"})

    async def page(self) -> Response:
        """The web page: ask the documents through the `rag` model (behind the key)."""
        return self._web_file("index.html")

    async def web_file(self, name: str) -> Response:
        return self._web_file(name)

    @staticmethod
    def _web_file(name: str) -> Response:
        if name not in WEB_FILES:
            return openai_error(404, f"no such file: /web/{name}")
        media = WEB_TYPES[Path(name).suffix] + "; charset=utf-8"
        headers = {"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"}
        return Response((WEB / name).read_bytes(), media_type=media, headers=headers)

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
    "page": lambda app: app.get("/", include_in_schema=False),
    "web_file": lambda app: app.get("/web/{name}", include_in_schema=False),
}


def make_app(key_digests: tuple[str, ...] = (), capacity: Mapping[str, Capacity] | None = None) -> FastAPI:
    """Ray's FastAPI app with our error shapes and, from the outside in, the KeyGate,
    the Boundary and the Admission count (`capacity` by model id; none: no count)."""
    app = init()  # Ray's FastAPI app: its middleware (request ids, metrics, errors)
    add_error_handlers(app)
    if capacity:
        app.add_middleware(Admission, capacity=capacity)  # added first: runs innermost
    app.add_middleware(Boundary, routes=app)
    app.add_middleware(KeyGate, digests=key_digests, refuse=refuse_status)  # added last: runs first
    return app


def _source(config: LLMConfig) -> str:
    loading = config.model_loading_config  # a ModelLoadingConfig once LLMConfig has validated it
    return str(loading["model_source"] if isinstance(loading, dict) else loading.model_source)


def _capacity(config: LLMConfig) -> Capacity | None:
    """What the engine's deployment holds: max_ongoing_requests plus max_queued_requests
    per replica, times the replicas it may have (inference.yaml's `replicas:`; Serve's
    own bound per replica stays behind while fewer run), with its backpressure
    Retry-After (serve_module's `_deployment`); None when either is unset (Serve's
    queue is then unbounded, and so is ours)."""
    deployment = config.deployment_config or {}
    ongoing, queued = deployment.get("max_ongoing_requests"), deployment.get("max_queued_requests", -1)
    if ongoing is None or queued is None or int(queued) < 0:
        return None
    backpressure = deployment.get("backpressure_config") or {}
    replicas = int((deployment.get("autoscaling_config") or {}).get("max_replicas") or 1)
    return Capacity((int(ongoing) + int(queued)) * replicas, float(backpressure.get("retry_after_s", 1.0)))


def _generates(config: LLMConfig) -> bool:
    return (config.engine_kwargs or {}).get("runner") != "pooling"


def build_app(
    configs: Mapping[str, LLMConfig],
    facts: Mapping[str, Mapping[str, Any]],
    *,
    key_digests: tuple[str, ...] = (),
    metrics_port: int | None = None,
    rag: Settings | None = None,
) -> Application:
    """The Serve application: one deployment per config behind a RagIngress.

    `facts[role]` goes into that model's /v1/models metadata["rag"], with its limits
    (and the structured-output limits for an engine that generates). With
    `key_digests` (SHA-256 of each API key, rag/stack/auth.py) every route but
    /health needs one of those keys; `metrics_port` is where /metrics relays from.
    With `rag` (the query path's settings, its index folder among them) the ingress
    also serves the `rag` model (rag_model.py) and the web page at `/`. Each
    model's capacity and the key digests also go to the front door in Ray's proxy,
    which counts and checks there first (rag/stack/front_door.py).
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
    capacity = {c.model_id: cap for c in llm_configs if (cap := _capacity(c)) is not None}
    rag_options: dict[str, Any] | None = None
    if rag is not None:
        rag_limits = RagLimits(max_tokens=rag.max_tokens)
        capacity[RAG_MODEL] = rag_limits.capacity()
        rag_options = {"settings": rag, "limits": rag_limits.as_dict()}
    fastapi_app = make_app(tuple(key_digests), capacity)
    ingress_cls = make_fastapi_ingress(RagIngress, endpoint_map=ENDPOINTS, app=fastapi_app)
    options = RagIngress.get_deployment_options(llm_configs)
    deployment: Any = serve.deployment(ingress_cls, **options)
    app: Application = deployment.bind(
        llm_deployments={c.model_id: build_llm_deployment(c) for c in llm_configs},
        model_cards=cards,
        lora_paths={},
        limits={m: lim.as_dict() for m, lim in limits.items()},
        metrics_port=metrics_port,
        rag=rag_options,
        front_door=Plan(capacity, tuple(key_digests)).dumps(),
    )
    return app
