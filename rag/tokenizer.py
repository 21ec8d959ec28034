"""Find a model's tokenizer.json on this machine, from the source the server lists for it.

A model's source (metadata.rag.source in /v1/models) is a folder (the CPU profile's
prepared weights) or a Hugging Face hub name, looked up in the hub cache (HF_HOME,
default ~/.cache/huggingface). Chunk sizes count in that tokenizer's tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

from rag.chunk import Tokens

__all__ = ["hub_cache", "local_tokenizer"]


def hub_cache() -> Path:
    """The Hugging Face hub cache: $HF_HOME/hub, or ~/.cache/huggingface/hub."""
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def local_tokenizer(source: str) -> Path | None:
    """The tokenizer.json of the model `source` names (a folder or a hub name), if it is here."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        return Tokens.find([folder])
    cached = f"models--{source.replace('/', '--')}/snapshots/*"
    return Tokens.find(sorted(hub_cache().glob(cached)))
