"""The engines through the ingress's own Serve handles, for the `rag` model's pipeline.

The query path (rag/pipeline.py) is synchronous and runs in a worker thread of the
ingress replica; each engine call it makes is scheduled onto the replica's event
loop, where it goes through the same handle call Ray's ingress makes for an HTTP
request (`OpenAiIngress._get_response`): Serve composition, no HTTP back into our
own port, no second copy of a request's JSON. An engine whose Serve queue is full
(BackPressureError: the `rag` model's calls are not counted by the edge's
Admission) is waited out with backoff, as is a replica that died before answering
(RayActorError: its node lost; the call goes again, to a replica Serve's router still
has); an engine's error becomes EngineError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from ray.exceptions import RayActorError
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    EmbeddingCompletionRequest,
    ErrorResponse,
    ScoreRequest,
)
from ray.llm._internal.serve.core.ingress.utils import _apply_openai_json_format
from ray.serve.exceptions import BackPressureError
from vllm.entrypoints.generate.base.protocol import StreamOptions

from rag import sse
from rag.engines import Usage
from rag.settings import Settings

__all__ = ["EngineError", "HandleEngines"]

Call = Callable[[Any, str], AsyncGenerator[Any, None]]  # (request body, handle method) -> responses
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)


class EngineError(Exception):
    """An engine answered a call of the `rag` model with an error."""

    def __init__(self, model: str, status: int, message: str) -> None:
        super().__init__(f"engine `{model}` answered {status}: {message}")
        self.model, self.status = model, status


def _error(model: str, response: Any) -> EngineError | None:
    first = response[0] if isinstance(response, list) and response else response
    if isinstance(first, ErrorResponse):
        return EngineError(model, int(first.error.code or 500), str(first.error.message))
    return None


class HandleEngines:
    """rag.engines.Engines over Serve handles, called from a thread off `loop`."""

    def __init__(
        self,
        call: Call,
        loop: asyncio.AbstractEventLoop,
        settings: Settings,
        facts: Mapping[str, Mapping[str, Any]],
    ) -> None:
        self._call, self._loop, self.settings, self._facts = call, loop, settings, facts

    def _wait(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.settings.timeout_s)

    async def _first(self, body: Any, method: str) -> Any:
        """The one response of a non-streaming call, retried while the engine's queue is full."""
        start = time.monotonic()
        for pause in (*BACKOFF_S, None):
            stream = self._call(body, method)
            try:
                response = await stream.__anext__()
            except (BackPressureError, RayActorError) as exc:
                waited = time.monotonic() - start
                if pause is None or waited + pause > self.settings.retry_deadline_s:
                    raise _gave_up(body.model, exc, waited) from exc
                await asyncio.sleep(pause)
                continue
            finally:
                await stream.aclose()
            if error := _error(body.model, response):
                raise error
            return response[0] if isinstance(response, list) else response
        raise AssertionError("unreachable")  # pragma: no cover

    def facts(self) -> Mapping[str, Mapping[str, Any]]:
        return self._facts

    def embed(self, texts: Sequence[str], batch_size: int = 32, workers: int = 4) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        rows: list[list[float]] = []
        for i in range(0, len(texts), batch_size):
            body = EmbeddingCompletionRequest(
                model=self.settings.embed_model,
                input=list(texts[i : i + batch_size]),
                truncate_prompt_tokens=-1,
            )
            data = self._wait(self._first(body, "embeddings")).data
            rows += [list(d.embedding) for d in sorted(data, key=lambda d: d.index)]
        vecs = np.asarray(rows, dtype=np.float32)
        unit: np.ndarray = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        return unit

    def score(self, query: str, documents: Sequence[str], model: str | None = None) -> list[float]:
        if not documents:
            return []
        model = model or self.settings.score_model
        trained = self._facts.get(model, {}).get("max_tokens_per_doc") or 0  # as the ingress cuts them
        body = ScoreRequest(
            model=model, text_1=query, text_2=list(documents), max_tokens_per_doc=int(trained)
        )
        data = self._wait(self._first(body, "score")).data
        return [float(d.score) for d in sorted(data, key=lambda d: d.index)]

    def chat(
        self, messages: Sequence[dict[str, str]], *, model: str | None = None, max_tokens: int = 512
    ) -> str:
        body = ChatCompletionRequest(
            model=model or self.settings.chat_model,
            messages=list(messages),
            max_tokens=max_tokens,
            temperature=0,
            seed=None,
        )
        response = self._wait(self._first(body, "chat"))
        return str(response.choices[0].message.content or "")

    def chat_stream(
        self, messages: Sequence[dict[str, str]], *, max_tokens: int = 512, usage: Usage | None = None
    ) -> Iterator[str]:
        model = self.settings.chat_model
        body = ChatCompletionRequest(
            model=model, messages=list(messages), max_tokens=max_tokens, temperature=0, stream=True,
            seed=None, stream_options=StreamOptions(include_usage=True) if usage is not None else None,
        )  # fmt: skip
        stream, response = self._opened(body)
        try:
            while response is not None:
                if error := _error(model, response):
                    raise error
                for line in _apply_openai_json_format(response).splitlines():
                    chunk = sse.event(line)
                    if chunk is None:
                        continue
                    if chunk.get("error"):
                        raise EngineError(model, 500, str(chunk["error"]))
                    if usage is not None:
                        usage.add(chunk.get("usage"))
                    for choice in chunk.get("choices", []):
                        if piece := (choice.get("delta") or {}).get("content"):
                            yield piece
                response = self._wait(_next(stream))
        finally:  # a stopped answer (guard, client gone) frees its place in the batch
            self._wait(stream.aclose())

    def _opened(self, body: Any) -> tuple[AsyncGenerator[Any, None], Any]:
        """A stream and its first response, retried while the engine's queue is full."""
        start = time.monotonic()
        for pause in (*BACKOFF_S, None):
            stream = self._call(body, "chat")
            try:
                return stream, self._wait(_next(stream))
            except (BackPressureError, RayActorError) as exc:
                self._wait(stream.aclose())
                waited = time.monotonic() - start
                if pause is None or waited + pause > self.settings.retry_deadline_s:
                    raise _gave_up(body.model, exc, waited) from exc
                time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover


def _gave_up(model: str, exc: Exception, waited: float) -> EngineError:
    if isinstance(exc, BackPressureError):
        return EngineError(model, 429, f"its queue stayed full for {waited:.0f} s")
    return EngineError(model, 503, f"its replicas kept dying before answering for {waited:.0f} s")


async def _next(stream: AsyncGenerator[Any, None]) -> Any:
    """The stream's next response; None at its end."""
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None
