"""Index on disk: unit float32 vectors (.npy) + chunk metadata (JSON lines) + a manifest.

Layout of an index folder:

    manifest.json            what is current: generation, embedding model, files
    vectors-<gen>.npy        float32, one unit row per chunk (memory-mapped, allow_pickle=False)
    chunks-<gen>.jsonl       one chunk per line, in the same order
    offsets-<gen>.npy        where each chunk's line starts (int64), so a query reads only its hits
    lexical-<gen>/           the BM25 matrix (bm25s, .npy and .json; memory-mapped)

A query process maps these files instead of reading them: opening a 100k-chunk
index costs milliseconds, and only the chunks a query returns are decoded.

`write_index` writes a new generation's files first and then replaces
manifest.json in one atomic rename, so an interrupted `rag index` leaves the
previous index whole. The manifest records the embedding model and a fingerprint
of it (its vector for PROBE, a fixed sentence), so an index is never queried
through a different model. Nothing read back is ever unpickled. An index of
format 1 (no offsets, no lexical folder) is still read, eagerly, and its BM25
built in memory; the build (rag.index) rewrites it as format 2.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from rag.chunk import Chunk, Chunker
from rag.errors import ConfigError
from rag.retrieve import BM25

__all__ = [
    "FORMAT",
    "MANIFEST",
    "PROBE",
    "READABLE_FORMATS",
    "ChunkFile",
    "Index",
    "LiveIndex",
    "load_index",
    "write_index",
]

FORMAT = 2
READABLE_FORMATS = (1, 2)
MANIFEST = "manifest.json"
# Embedded at build time and again at query time: the same model gives the same vector.
PROBE = "retrieval-augmented generation on one GPU"


class ChunkFile(Sequence[Chunk]):
    """The chunks of a JSON-lines file, decoded on access (the file is memory-mapped)."""

    def __init__(self, path: Path, offsets: np.ndarray) -> None:
        self._offsets = offsets  # n + 1 byte positions: chunk i is [offsets[i], offsets[i + 1])
        with path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(self._map) != int(offsets[-1]):
            raise ValueError(f"{path.name} is {len(self._map)} bytes, its offsets say {int(offsets[-1])}")

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> Chunk: ...
    @overload
    def __getitem__(self, i: slice) -> list[Chunk]: ...
    def __getitem__(self, i: int | slice) -> Chunk | list[Chunk]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return Chunk(**json.loads(self._map[int(self._offsets[i]) : int(self._offsets[i + 1])]))

    def __iter__(self) -> Iterator[Chunk]:
        return (self[i] for i in range(len(self)))


@dataclass
class Index:
    """A loaded index: chunks, their vectors, and what built them."""

    folder: Path
    chunks: Sequence[Chunk]
    vectors: np.ndarray
    manifest: dict[str, Any]
    _bm25: BM25 | None = field(default=None, repr=False)

    @property
    def bm25(self) -> BM25:
        """The lexical index: memory-mapped from the folder, or built here for a format-1 index."""
        if self._bm25 is None:
            lexical = self.manifest.get("lexical_dir")
            self._bm25 = BM25.load(self.folder / lexical, self.chunks) if lexical else BM25(self.chunks)
        return self._bm25

    @property
    def embed_model(self) -> str:
        return str(self.manifest["embed_model"])

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def check_model(self, model: str, probe_vector: np.ndarray) -> None:
        """Refuse to be queried through another embedding model than the one that built it."""
        built = np.asarray(self.manifest["probe"], dtype=np.float32)
        same = (
            model == self.embed_model
            and probe_vector.shape == built.shape
            and float(probe_vector @ built) > 0.99
        )
        if not same:
            raise ConfigError(
                f"the index in {self.folder} was built with embedding model `{self.embed_model}` "
                f"({self.dim} dims), but `{model}` ({probe_vector.shape[0]} dims) answers now; "
                "rebuild it with `rag index PATH` (or point RAG_EMBED_MODEL/RAG_BASE_URL at the original)"
            )


def load_index(folder: Path) -> Index:
    """Read the current generation; ConfigError saying to run `rag index` if there is none."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise ConfigError(f"no index in {folder}; build one with `rag index PATH` (e.g. `rag index corpus/`)")
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") not in READABLE_FORMATS:
            raise ConfigError(
                f"the index in {folder} has format {manifest.get('format')}; rebuild it with `rag index`"
            )
        vectors = np.load(folder / manifest["vectors_file"], mmap_mode="r", allow_pickle=False)
        chunks: Sequence[Chunk]
        if "offsets_file" in manifest:
            offsets = np.load(folder / manifest["offsets_file"], allow_pickle=False)
            chunks = ChunkFile(folder / manifest["chunks_file"], offsets)
        else:  # format 1
            with (folder / manifest["chunks_file"]).open() as f:
                chunks = [Chunk(**json.loads(line)) for line in f if line.strip()]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"the index in {folder} is unreadable ({exc}); rebuild it with `rag index PATH`"
        ) from exc
    if len(chunks) != len(vectors):
        raise ConfigError(f"the index in {folder} is inconsistent; rebuild it with `rag index PATH`")
    if not chunks:
        raise ConfigError(f"the index in {folder} is empty; index some documents with `rag index PATH`")
    return Index(folder, chunks, vectors.astype(np.float32, copy=False), manifest)


class LiveIndex:
    """The index in `folder` as `rag index` last committed it, for a long-running server.

    `current()` looks at manifest.json (one stat) and loads the new generation when
    it changed; a caller keeps the Index it was handed for its whole request, so it
    sees the old generation or the new, never half of each (each generation's files
    stay mapped after `write_index` removes them). Before any index exists, or while
    the folder holds none, `current()` raises ConfigError naming `rag index`.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._index: Index | None = None

    def current(self) -> Index:
        with self._lock:
            for attempt in (1, 2):
                try:
                    st = (self.folder / MANIFEST).stat()
                except OSError:
                    raise ConfigError(
                        f"no index in {self.folder} yet; build one with `rag index PATH` "
                        f"(RAG_INDEX_DIR={self.folder}), and the server picks it up without a restart"
                    ) from None
                seen = (st.st_ino, st.st_mtime_ns, st.st_size)
                if seen == self._seen and self._index is not None:
                    return self._index
                try:
                    self._index = load_index(self.folder)
                except ConfigError:
                    if attempt == 2:  # not a manifest replaced while it was read: a broken index
                        raise
                    continue
                self._seen = seen
                return self._index
        raise AssertionError("unreachable")  # pragma: no cover

    def generation(self) -> str | None:
        """The generation last loaded (None before the first)."""
        return None if self._index is None else str(self._index.manifest.get("generation"))


def _fsync_write(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_index(
    folder: Path,
    chunks: list[Chunk],
    vectors: np.ndarray,
    embed_model: str,
    probe: np.ndarray,
    files: dict[str, str],
    root: str,
    chunker: Chunker,
) -> None:
    """`chunks` and their `vectors` as a new generation in `folder`, made current by one rename.

    Every file is fsynced before manifest.json is replaced (the commit point); files of
    earlier generations and of interrupted runs are removed after it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    gen = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
    vec_file, chunk_file = f"vectors-{gen}.npy", f"chunks-{gen}.jsonl"
    offsets_file, lexical_dir = f"offsets-{gen}.npy", f"lexical-{gen}"
    _save_npy(folder / vec_file, vectors)
    lines = [(json.dumps(c.as_dict(), ensure_ascii=False) + "\n").encode() for c in chunks]
    _fsync_write(folder / chunk_file, b"".join(lines))
    _save_npy(
        folder / offsets_file, np.concatenate([[0], np.cumsum([len(b) for b in lines])]).astype(np.int64)
    )
    BM25(chunks).save(folder / lexical_dir)
    manifest = {
        "format": FORMAT,
        "generation": gen,
        "embed_model": embed_model,
        "dim": int(vectors.shape[1]),
        "probe": [round(float(x), 6) for x in probe],
        "root": root,
        "files": files,
        "chunker": chunker.describe(),
        "count": len(chunks),
        "vectors_file": vec_file,
        "chunks_file": chunk_file,
        "offsets_file": offsets_file,
        "lexical_dir": lexical_dir,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp = folder / f".{MANIFEST}.{gen}.tmp"
    _fsync_write(tmp, json.dumps(manifest, indent=1).encode())
    os.replace(tmp, folder / MANIFEST)  # the commit point
    for stale in folder.iterdir():  # earlier generations and leftovers of interrupted runs
        if stale.name != MANIFEST and gen not in stale.name:
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)


def _save_npy(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
