"""Embed: the question's vector, from the same model that embedded the index.

Each query is embedded beside a fixed probe sentence (`PROBE`, rag/store.py), whose
vector the index recorded when it was built: a different embedding model behind
`embed` is caught here, with a message saying to re-index, instead of silently
retrieving nonsense.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rag.store import PROBE, Index

__all__ = ["embed_query"]

Embed = Callable[[Sequence[str]], np.ndarray]  # texts -> unit-length rows


def embed_query(embed: Embed, index: Index, model: str, query: str) -> np.ndarray:
    """The query's vector, after proving the index's embedding model is the one answering."""
    vecs = embed([query, PROBE])
    index.check_model(model, vecs[1])
    query_vec: np.ndarray = vecs[0]
    return query_vec
