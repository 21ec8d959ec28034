"""Building an index: files -> parse + chunk -> embed -> a new generation on disk.

`build` scans the paths, has a `Runner` parse and embed (LocalRunner: a process per
core parses, a few threads keep the embed engine busy; rag.index_ray's RayRunner:
the same steps as Ray Data stages), and hands the result to rag.store, which
writes it atomically: an interrupted `rag index` leaves the previous index whole.
A build is incremental: a chunk is keyed by a hash of its path, heading and text,
and only chunks the previous index lacks are embedded, so rebuilding an unchanged
corpus embeds nothing but the probe sentence; a file whose bytes repeat an earlier
file's is left out. When the embedding model changed (its probe vector differs),
everything is embedded again and BuildStats says why. A format-1 index is upgraded
to the current format the same way, without embedding again.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rag.chunk import Chunk, Chunker
from rag.errors import ConfigError
from rag.ingest import Scan, load, scan
from rag.store import PROBE, Index, load_index, write_index

__all__ = [
    "BuildStats",
    "Embedder",
    "LocalRunner",
    "Parsed",
    "Progress",
    "Runner",
    "build",
    "parse",
    "parse_one",
]


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
    write_index(folder, chunks, vectors, embed_model, probe, files, str(root), chunker)
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


def parse_one(job: tuple[Path, Path, Chunker]) -> Parsed:
    """One file read and chunked: its path relative to `root`, its sha256, its chunks."""
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
            out.append(parse_one(job))
            progress(len(out), len(jobs))
        return out
    from concurrent.futures import ProcessPoolExecutor

    # fork: workers start in milliseconds and need no importable __main__. The parent holds
    # no threads here but the tokenizer's pool, which a forked child must not reuse.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
        for result in pool.map(parse_one, jobs, chunksize=max(1, min(32, len(jobs) // (8 * n)))):
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
