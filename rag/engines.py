"""The four engines as the query path calls them, whichever way they are reached.

`rag.client.StackClient` reaches them over HTTP (the CLI, the bench, any machine);
`rag.stack.ingress.handles.HandleEngines` through the ingress's Serve handles (the
`rag` model, inside the server). The pipeline (rag/pipeline.py) takes either.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["Engines", "Usage"]


@dataclass
class Usage:
    """Tokens the chat engine read and wrote for one answer (every attempt of it), as the
    engine's own `usage` reported them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, reported: Mapping[str, Any] | None) -> None:
        """Count one completion's `usage` object in (None: the engine reported none)."""
        if reported:
            self.prompt_tokens += int(reported.get("prompt_tokens") or 0)
            self.completion_tokens += int(reported.get("completion_tokens") or 0)

    def as_dict(self) -> dict[str, int]:
        """OpenAI's `usage` shape."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


class Engines(Protocol):
    def embed(self, texts: Sequence[str], batch_size: int = 32, workers: int = 4) -> np.ndarray:
        """Unit-length float32 rows, one per text."""
        ...

    def score(self, query: str, documents: Sequence[str], model: str | None = None) -> list[float]:
        """A relevance score in [0, 1] per document (the score engine unless `model`)."""
        ...

    def chat(
        self, messages: Sequence[dict[str, str]], *, model: str | None = None, max_tokens: int = 512
    ) -> str:
        """A whole completion (the guard's reply, for a generative guard)."""
        ...

    def chat_stream(
        self, messages: Sequence[dict[str, str]], *, max_tokens: int = 512, usage: Usage | None = None
    ) -> Iterator[str]:
        """The chat engine's answer as it is generated; its tokens counted into `usage`."""
        ...

    def facts(self) -> Mapping[str, Mapping[str, Any]]:
        """metadata["rag"] of each model, by id (rag/served.py)."""
        ...
