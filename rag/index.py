"""Index on disk: unit float32 vectors (.npy) + chunk metadata (JSON lines) + a manifest.

Layout of an index folder:

    manifest.json            what is current: generation, embedding model, files
    vectors-<gen>.npy        float32, one unit row per chunk (memory-mapped, allow_pickle=False)
    chunks-<gen>.jsonl       one chunk per line, in the same order
    offsets-<gen>.npy        where each chunk's line starts (int64), so a query reads only its hits
    lexical-<gen>/           the BM25 matrix (bm25s, .npy and .json; memory-mapped)

A query process maps these files instead of reading them: opening a 100k-chunk
index costs milliseconds, and only the chunks a query returns are decoded.

A build writes a new generation's files first and then replaces manifest.json
in one atomic rename, so an interrupted `rag index` leaves the previous index
whole. The manifest records the embedding model and a fingerprint of it (its
vector for a fixed probe sentence), so an index is never queried through a
different model. Nothing read back is ever unpickled. An index of format 1 (no
offsets, no lexical folder) is still read, eagerly, and its BM25 built in memory;
the next `rag index` rewrites it as format 2, embedding only the chunks whose text
changed (a chunk is keyed by a hash of its path, heading and text).
"""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, overload

import numpy as np

from rag.chunk import Chunk, Chunker
from rag.errors import ConfigError
from rag.ingest import Scan, load, scan
from rag.retrieve import BM25

__all__ = ["PROBE", "BuildStats", "Index", "LocalRunner", "Parsed", "Runner", "build", "load_index", "parse"]

FORMAT = 2
READABLE_FORMATS = (1, 2)
MANIFEST = "manifest.json"
# Embedded at build time and again at query time: the same model gives the same vector.
PROBE = "retrieval-augmented generation on one GPU"


class Embedder(Protocol):
    """What `build` needs from the stack (StackClient satisfies it)."""

    def embed(self, texts: Sequence[str], batch_size: int = ..., workers: int = ...) -> np.ndarray: ...


Parsed = tuple[str, str, list[Chunk]]  # path relative to the root, sha256 of the file, its chunks
Progress = Callable[[int, int], None]


class Runner(Protocol):
    """Where the two heavy steps of a build run: here (LocalRunner) or on Ray (rag.index_ray)."""

    def parse(self, files: Sequence[Path], root: Path, chunker: Chunker, progress: Progress) -> list[Parsed]:
        """Every file read and chunked, in the order given."""
        ...

    def embed(self, chunks: Sequence[Chunk], progress: Progress) -> np.ndarray:
        """One unit vector per chunk, in order."""
        ...


@dataclass
class LocalRunner:
    """This machine: a process per core parses, a few threads keep the embed engine busy."""

    client: Embedder
    batch_size: int = 32
    workers: int = 4
    parse_workers: int | None = None

    def parse(self, files: Sequence[Path], root: Path, chunker: Chunker, progress: Progress) -> list[Parsed]:
        return parse(files, root, chunker, workers=self.parse_workers, progress=progress)

    def embed(self, chunks: Sequence[Chunk], progress: Progress) -> np.ndarray:
        parts: list[np.ndarray] = []
        step = self.batch_size * self.workers
        for i in range(0, len(chunks), step):
            part = [c.embed_text for c in chunks[i : i + step]]
            parts.append(self.client.embed(part, batch_size=self.batch_size, workers=self.workers))
            progress(min(i + step, len(chunks)), len(chunks))
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


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


@dataclass(frozen=True)
class BuildStats:
    """What one `rag index` run did."""

    files: int
    files_changed: int
    files_removed: int
    files_duplicate: int
    chunks: int
    chunks_embedded: int
    skipped: dict[str, int]
    seconds: float
    parse_seconds: float
    rebuilt_because: str | None
    counted_with: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _previous(folder: Path, model: str, probe: np.ndarray) -> tuple[Index | None, str | None]:
    try:
        old = load_index(folder)
    except ConfigError as exc:
        return None, None if "no index" in str(exc) else str(exc)
    try:
        old.check_model(model, probe)
    except ConfigError:
        return None, f"the embedding model changed (was `{old.embed_model}`, {old.dim} dims)"
    return old, None


def build(
    paths: Sequence[Path],
    folder: Path,
    client: Embedder,
    embed_model: str,
    *,
    chunker: Chunker | None = None,
    runner: Runner | None = None,
    progress: Progress = lambda done, total: None,
    parse_progress: Progress = lambda done, total: None,
) -> BuildStats:
    """Index `paths` into `folder`, embedding only chunks the previous index lacks.

    `client` embeds the probe that pins the model; `runner` does the parsing and the
    embedding (default: LocalRunner(client)). Whatever runs them, the index is the same.
    """
    start = time.monotonic()
    chunker = chunker or Chunker()
    runner = runner or LocalRunner(client)
    root, found = scan(paths)
    if not found.files:
        raise ConfigError(
            f"no indexable files under {', '.join(map(str, paths))} "
            f"(skipped: {_skipped(found) or 'nothing'}); supported: .md .txt .rst .html .pdf"
        )
    probe = client.embed([PROBE])[0]
    old, rebuilt_because = _previous(folder, embed_model, probe)
    old_files: dict[str, str] = dict(old.manifest["files"]) if old else {}
    old_vectors = {c.id: old.vectors[i] for i, c in enumerate(old.chunks)} if old else {}

    parsed = runner.parse(found.files, root, chunker, parse_progress)
    parse_seconds = time.monotonic() - start
    chunks, files, duplicates = _collect(parsed)
    changed = sum(old_files.get(path) != sha for path, sha in files.items())
    todo = [c for c in chunks if c.id not in old_vectors]
    new_vectors = dict(zip((c.id for c in todo), runner.embed(todo, progress), strict=True)) if todo else {}
    if not todo:
        progress(0, 0)

    vectors = np.stack([new_vectors[c.id] if c.id in new_vectors else old_vectors[c.id] for c in chunks])
    vectors = vectors.astype(np.float32, copy=False)
    _write(folder, chunks, vectors, embed_model, probe, files, str(root), chunker)
    return BuildStats(
        files=len(files),
        files_changed=changed,
        files_removed=len(set(old_files) - set(files)),
        files_duplicate=duplicates,
        chunks=len(chunks),
        chunks_embedded=len(todo),
        skipped=dict(found.skipped),
        seconds=time.monotonic() - start,
        parse_seconds=parse_seconds,
        rebuilt_because=rebuilt_because,
        counted_with=chunker.counter.name,
    )


def _parse_one(job: tuple[Path, Path, Chunker]) -> Parsed:
    path, root, chunker = job
    doc = load(path, root)
    return doc.path, doc.sha256, chunker(doc)


def parse(
    files: Sequence[Path],
    root: Path,
    chunker: Chunker,
    *,
    workers: int | None = None,
    progress: Progress = lambda done, total: None,
) -> list[Parsed]:
    """Read and chunk `files`, in parallel across the cores this process may use; in order."""
    jobs = [(f, root, chunker) for f in files]
    n = workers or len(os.sched_getaffinity(0))
    out: list[Parsed] = []
    if n <= 1 or len(jobs) < 32:  # a process pool costs ~0.5 s to start: not worth it for a few files
        for job in jobs:
            out.append(_parse_one(job))
            progress(len(out), len(jobs))
        return out
    from concurrent.futures import ProcessPoolExecutor

    # fork: workers start in milliseconds and need no importable __main__. The parent holds
    # no threads here but the tokenizer's pool, which a forked child must not reuse.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
        for result in pool.map(_parse_one, jobs, chunksize=max(1, min(32, len(jobs) // (8 * n)))):
            out.append(result)
            progress(len(out), len(jobs))
    return out


def _collect(parsed: Sequence[Parsed]) -> tuple[list[Chunk], dict[str, str], int]:
    """All chunks, once each; a file whose bytes repeat an earlier file's is left out."""
    chunks: dict[str, Chunk] = {}
    files: dict[str, str] = {}
    seen: set[str] = set()
    for path, sha, doc_chunks in parsed:
        if sha in seen:
            continue
        seen.add(sha)
        files[path] = sha
        for c in doc_chunks:
            chunks.setdefault(c.id, c)  # identical text under one heading: once
    return list(chunks.values()), files, len(parsed) - len(files)


def _skipped(found: Scan) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(found.skipped.items()))


def _fsync_write(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write(
    folder: Path,
    chunks: list[Chunk],
    vectors: np.ndarray,
    embed_model: str,
    probe: np.ndarray,
    files: dict[str, str],
    root: str,
    chunker: Chunker,
) -> None:
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
