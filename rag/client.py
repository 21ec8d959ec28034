"""One HTTP client for the four engines; every request names its model.

Transport and HTTP failures become the project's errors (ServerUnreachable,
HTTPStatusError) carrying the URL, status and the server's own message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

from rag.errors import HTTPStatusError, ServerUnreachable
from rag.settings import Settings

__all__ = ["StackClient"]

Message = dict[str, str]


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


class StackClient:
    """Embeddings, scores and chat from the running stack."""

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
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
    def _post(self, path: str, body: dict[str, Any]) -> Any:
        url = f"{self.settings.base_url}{path}"
        try:
            r = self._http.post(path, json=body)
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.settings.base_url, type(exc).__name__) from exc
        if r.status_code >= 400:
            raise HTTPStatusError(url, r.status_code, _server_message(r))
        return r.json()

    def models(self) -> list[str]:
        """Model ids the server lists."""
        try:
            r = self._http.get("/models")
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.settings.base_url, type(exc).__name__) from exc
        if r.status_code >= 400:
            raise HTTPStatusError(f"{self.settings.base_url}/models", r.status_code, _server_message(r))
        return [m["id"] for m in r.json().get("data", [])]

    # ------------------------------------------------------------------ engines
    def embed(self, texts: Sequence[str], batch_size: int = 32, workers: int = 4) -> np.ndarray:
        """Unit-length float32 embeddings, one row per text; batches go out concurrently."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        batches = [list(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]

        def one(batch: list[str]) -> list[list[float]]:
            # The chunker's token count is an estimate: let the server cut the rare chunk
            # that still exceeds the model's window (-1: at max_model_len) instead of failing.
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

    def chat_stream(self, messages: Sequence[Message], *, max_tokens: int = 512) -> Iterator[str]:
        """Yield the answer's text as it is generated."""
        body = {
            "model": self.settings.chat_model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
        url = f"{self.settings.base_url}/chat/completions"
        try:
            with self._http.stream("POST", "/chat/completions", json=body) as r:
                if r.status_code >= 400:
                    r.read()
                    raise HTTPStatusError(url, r.status_code, _server_message(r))
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("error"):
                        raise HTTPStatusError(url, 500, str(chunk["error"]))
                    for choice in chunk.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            yield piece
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.settings.base_url, type(exc).__name__) from exc
