"""One HTTP client for the four engines; every request names its model.

Transport and HTTP failures become the project's errors (ServerUnreachable,
EngineTimeout, HTTPStatusError) carrying the URL, status and the server's own
message. Calls that are safe to repeat (embeddings, scores, the guard, and a
chat before any text was shown) are retried with backoff on connection errors,
429, 500, 502, 503 and 504 until RAG_RETRY_DEADLINE_S runs out, honouring
Retry-After: an engine that died is replaced by Serve within a few minutes, and
its callers wait for it instead of failing. Every wait is reported through
`on_wait`, so a person sees what is being waited for.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

from rag import sse
from rag.engines import Usage
from rag.errors import EngineTimeout, HTTPStatusError, ServerUnreachable
from rag.served import facts_from_models
from rag.settings import Settings

__all__ = ["RETRY_STATUSES", "StackClient"]

Message = dict[str, str]
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)  # then 15 s until the deadline


def _server_message(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:300] or r.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        for key in ("detail", "message", "error"):
            if body.get(key):
                return str(body[key])[:300]
    return str(body)[:300]


def _retry_after(r: httpx.Response) -> float | None:
    raw = r.headers.get("retry-after", "")
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP date or garbage: fall back to our own backoff


class _Retry(Exception):
    """One failed attempt that may be repeated."""

    def __init__(self, problem: str, error: Exception, retry_after: float | None = None) -> None:
        super().__init__(problem)
        self.problem, self.error, self.retry_after = problem, error, retry_after


class StackClient:
    """Embeddings, scores and chat from the running stack."""

    def __init__(
        self,
        settings: Settings,
        transport: httpx.BaseTransport | None = None,
        on_wait: Callable[[str], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._on_wait = on_wait or (lambda message: None)
        self._sleep, self._clock = sleep, clock
        self._reached = False  # once the server answered, a refused connection means it restarts
        self._facts: dict[str, dict[str, Any]] | None = None
        self._http = httpx.Client(
            base_url=settings.base_url,
            timeout=httpx.Timeout(settings.timeout_s, connect=5.0),
            headers={"Authorization": f"Bearer {settings.api_key}"},
            transport=transport,
            limits=httpx.Limits(max_connections=32),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> StackClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def _url(self, path: str) -> str:
        return f"{self.settings.base_url}{path}"

    def _check(self, r: httpx.Response, path: str) -> None:
        """Raise for an error status: _Retry for one worth repeating, HTTPStatusError otherwise."""
        self._reached = True
        if r.status_code < 400:
            return
        error = HTTPStatusError(self._url(path), r.status_code, _server_message(r))
        if r.status_code in RETRY_STATUSES:
            raise _Retry(f"answered {r.status_code} ({error.server_message[:80]})", error, _retry_after(r))
        raise error

    def _transport_error(self, exc: httpx.TransportError, engine: str) -> Exception:
        """A read timeout names the slow engine; a refused connection may be worth a retry."""
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            return EngineTimeout(self.settings.base_url, engine, self.settings.timeout_s)
        error = ServerUnreachable(self.settings.base_url, type(exc).__name__)
        if self._reached:  # it answered before: Serve or the proxy is restarting
            return _Retry(f"connection failed ({type(exc).__name__})", error)
        return error

    def _with_retries(self, engine: str, attempt: Callable[[], Any]) -> Any:
        """attempt() until it succeeds, raises a final error, or the retry deadline passes."""
        deadline = self.settings.retry_deadline_s
        start = self._clock()
        for n in itertools.count():
            try:
                return attempt()
            except httpx.TransportError as exc:
                failure = self._transport_error(exc, engine)
                if not isinstance(failure, _Retry):
                    raise failure from exc
                retry = failure
            except _Retry as exc:
                retry = exc
            waited = self._clock() - start
            pause = (
                retry.retry_after if retry.retry_after is not None else BACKOFF_S[min(n, len(BACKOFF_S) - 1)]
            )
            if waited + pause > deadline:
                raise _gave_up(retry.error, waited, deadline) from retry.error
            self._on_wait(
                f"waiting for `{engine}`: {retry.problem}; retrying in {pause:.0f} s "
                f"({waited:.0f} of {deadline:.0f} s, RAG_RETRY_DEADLINE_S)"
            )
            self._sleep(pause)
        raise AssertionError("itertools.count() ended")  # pragma: no cover - for the type checker

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        """POST a request that is safe to repeat, retrying as the module docstring says."""

        def attempt() -> Any:
            r = self._http.post(path, json=body)
            self._check(r, path)
            return r.json()

        return self._with_retries(str(body.get("model", "?")), attempt)

    def _listing(self) -> dict[str, Any]:
        def attempt() -> dict[str, Any]:
            r = self._http.get("/models")
            self._check(r, "/models")
            listing: dict[str, Any] = r.json()
            return listing

        result: dict[str, Any] = self._with_retries("ingress", attempt)
        return result

    def models(self) -> list[str]:
        """Model ids the server lists."""
        return [m["id"] for m in self._listing().get("data", [])]

    def facts(self) -> dict[str, dict[str, Any]]:
        """What the server says about each model (metadata["rag"] in /v1/models), by id."""
        if self._facts is None:
            self._facts = facts_from_models(self._listing())
        return self._facts

    # ------------------------------------------------------------------ engines
    def embed(self, texts: Sequence[str], batch_size: int = 32, workers: int = 4) -> np.ndarray:
        """Unit-length float32 embeddings, one row per text; batches go out concurrently."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        batches = [list(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]

        def one(batch: list[str]) -> list[list[float]]:
            # Chunks are sized with the model's tokenizer when it is at hand, by an estimate
            # otherwise: let the server cut a text over the model's window (-1: at
            # max_model_len) instead of failing the whole batch.
            body = {"model": self.settings.embed_model, "input": batch, "truncate_prompt_tokens": -1}
            data = self._post("/embeddings", body)["data"]
            return [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]

        with ThreadPoolExecutor(max_workers=workers) as pool:
            rows = [row for part in pool.map(one, batches) for row in part]
        vecs = np.asarray(rows, dtype=np.float32)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        unit: np.ndarray = vecs / np.maximum(norms, 1e-12)
        return unit

    def score(self, query: str, documents: Sequence[str], model: str | None = None) -> list[float]:
        """One relevance score in [0, 1] per document (the score engine unless `model`)."""
        if not documents:
            return []
        body = {"model": model or self.settings.score_model, "text_1": query, "text_2": list(documents)}
        data = self._post("/score", body)["data"]
        return [float(d["score"]) for d in sorted(data, key=lambda d: d["index"])]

    def chat(self, messages: Sequence[Message], *, model: str | None = None, max_tokens: int = 512) -> str:
        """A whole chat completion (templated by the server with the model's own template)."""
        body = {
            "model": model or self.settings.chat_model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        return str(self._post("/chat/completions", body)["choices"][0]["message"]["content"] or "")

    def chat_stream(
        self, messages: Sequence[Message], *, max_tokens: int = 512, usage: Usage | None = None
    ) -> Iterator[str]:
        """Yield the answer's text as it is generated; retried only until the first piece.
        The engine's token counts go into `usage` (asked for only when given)."""
        body: dict[str, Any] = {
            "model": self.settings.chat_model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
        if usage is not None:
            body["stream_options"] = {"include_usage": True}
        path = "/chat/completions"
        shown = False

        def pieces() -> Iterator[str]:
            with self._http.stream("POST", path, json=body) as r:
                if r.status_code >= 400:
                    r.read()
                self._check(r, path)
                for line in r.iter_lines():
                    chunk = sse.event(line)
                    if chunk is None:
                        continue
                    if chunk.get("error"):
                        error = HTTPStatusError(self._url(path), 500, str(chunk["error"]))
                        raise error if shown else _Retry("failed before its first token", error)
                    if usage is not None:
                        usage.add(chunk.get("usage"))
                    for choice in chunk.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            yield piece

        def first() -> tuple[Iterator[str], str | None]:
            stream = pieces()
            return stream, next(stream, None)

        try:
            stream, head = self._with_retries(self.settings.chat_model, first)
            if head is None:
                return
            shown = True
            yield head
            yield from stream
        except httpx.TransportError as exc:  # after text was shown: never repeated
            failure = self._transport_error(exc, str(body["model"]))
            raise (failure.error if isinstance(failure, _Retry) else failure) from exc


def _gave_up(error: Exception, waited: float, deadline: float) -> Exception:
    """The last error, saying how long it was retried and which setting gives it longer."""
    hint = (
        f" (still failing after {waited:.0f} s of retries; RAG_RETRY_DEADLINE_S={deadline:g} sets how long)"
    )
    if isinstance(error, HTTPStatusError):
        return HTTPStatusError(error.url, error.status, error.server_message + hint)
    if isinstance(error, ServerUnreachable):
        return ServerUnreachable(error.url, error.reason + hint)
    return error
