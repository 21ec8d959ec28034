"""The manifest every prepared model folder carries (`rag-model.json`): what it was built
from and the sha256 of each file, so a second `rag prepare` verifies instead of rebuilding."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["FORMAT_VERSION", "MANIFEST", "folder_hashes", "sha256_file"]

MANIFEST = "rag-model.json"
# Bump when the conversion changes, so old folders are rebuilt rather than trusted.
# 2: input and output embeddings tied again, as upstream ships them.
FORMAT_VERSION = 2


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def folder_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` but the manifest, by relative path."""
    return {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
