"""Indexing on Ray Data: files -> parse + chunk -> embed, on the local Ray or a cluster.

`rag index --ray` starts a private local Ray for the run; `rag index --ray
ADDRESS` submits the same pipeline to a running cluster (`ray://head:10001`, or
`auto` on one of its nodes). Two Ray Data stages do the heavy work:

    from_items(files) -> map_batches(parse + chunk, one CPU per task)    -> driver
    from_items(chunks) -> map_batches(Embed actors -> the `embed` deployment) -> driver

Between them the driver does what needs the whole corpus: drop repeated files
and chunks, and keep the vectors of chunks the previous index already holds.
Embedding goes through the served `embed` deployment over HTTP, so a cluster
with more GPUs runs more `embed` replicas behind the same URL; `--embed-actors`
sets how many requests are in flight. The result is written by rag.index's
build (through rag.store), so the index is the same, file for file, as a local
build's.

On a cluster every node must read the files at the paths given (a shared
filesystem) and reach the stack's URL.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from rag.chunk import Chunk, Chunker
from rag.errors import ConfigError
from rag.index import Parsed, Progress, parse_one
from rag.settings import Settings
from rag.stack.cluster import resolve, unreachable

__all__ = ["RayRunner"]


def _parse_batch(batch: dict[str, np.ndarray], root: str, chunker: Chunker) -> dict[str, list[str]]:
    """One Ray task: read and chunk a few files (the same code as the local path)."""
    out: dict[str, list[str]] = {"path": [], "sha256": [], "chunks": []}
    for path in batch["path"]:
        rel, sha, chunks = parse_one((Path(str(path)), Path(root), chunker))
        out["path"].append(rel)
        out["sha256"].append(sha)
        out["chunks"].append(json.dumps([c.as_dict() for c in chunks], ensure_ascii=False))
    return out


class _Embed:
    """A Ray Data actor: one HTTP client to the stack, one request per batch."""

    def __init__(self, settings: Settings) -> None:
        from rag.client import StackClient

        self.client = StackClient(settings)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["text"]]
        return {"i": batch["i"], "vector": self.client.embed(texts, batch_size=len(texts), workers=1)}


@dataclass
class RayRunner:
    """Runs rag.index.build's parse and embed steps as Ray Data pipelines."""

    settings: Settings
    address: str = "local"
    embed_actors: int = 2
    batch_size: int = 32
    _started: bool = field(default=False, init=False, repr=False)

    def __enter__(self) -> RayRunner:
        import ray

        if ray.is_initialized():
            return self
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": "ERROR",
        }
        if self.address == "local":
            # A private instance, sized for indexing; it stops when the run ends.
            kwargs |= {"num_cpus": len(os.sched_getaffinity(0)), "object_store_memory": 512 * 1024**2}
        address = resolve(self.address)
        if address is None:
            raise ConfigError(self._unreached("no cluster was started or joined with `ray start` here"))
        if address != "local" and (problem := unreachable(address)) is not None:
            raise ConfigError(self._unreached(problem))  # ray.init would retry for minutes
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(self._unreached(str(exc))) from exc
        self._started = True
        import logging

        from ray.data import DataContext

        for name in ("ray", "ray.data"):  # Ray Data's per-stage INFO lines would bury rag's progress
            logging.getLogger(name).setLevel(logging.ERROR)
        ctx = DataContext.get_current()
        ctx.execution_options.preserve_order = True  # the same chunk order as a local build
        ctx.enable_progress_bars = False  # rag prints its own
        return self

    def _unreached(self, why: str) -> str:
        return (
            f"could not reach the Ray cluster at {self.address!r} ({why}); give its address as "
            "`--ray ray://HEAD:10001` (or `auto` on a node of it), or `--ray` alone for a local Ray"
        )

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        import ray

        if self._started:
            ray.shutdown()

    def parse(self, files: Sequence[Path], root: Path, chunker: Chunker, progress: Progress) -> list[Parsed]:
        import ray

        items = [{"path": str(f)} for f in files]
        ds: Any = ray.data.from_items(items, override_num_blocks=max(1, len(files) // 16))
        ds = ds.map_batches(
            _parse_batch, batch_size=16, fn_kwargs={"root": str(root), "chunker": chunker}, num_cpus=1
        )
        out: list[Parsed] = []
        for row in ds.iter_rows():
            chunks = [Chunk(**c) for c in json.loads(row["chunks"])]
            out.append((str(row["path"]), str(row["sha256"]), chunks))
            progress(len(out), len(files))
        return out

    def embed(self, chunks: Sequence[Chunk], progress: Progress) -> np.ndarray:
        import ray

        rows = [{"i": i, "text": c.embed_text} for i, c in enumerate(chunks)]
        blocks = max(self.embed_actors, len(rows) // (4 * self.batch_size))
        ds: Any = ray.data.from_items(rows, override_num_blocks=min(len(rows), blocks))
        with warnings.catch_warnings():
            # Deprecated in Ray 2.60 (removed in 2.64; we pin 2.60.0). Without it Ray keeps the
            # actors restartable and logs an error line about it on every run.
            warnings.simplefilter("ignore", DeprecationWarning)
            ds = ds.map_batches(
                _Embed,
                fn_constructor_kwargs={"settings": self.settings},
                batch_size=self.batch_size,
                compute=ray.data.ActorPoolStrategy(size=self.embed_actors),
                num_cpus=0.25,  # the work is the server's; an actor only waits on HTTP
                # An actor whose requests fail ends the run with the client's message; a
                # restart would only repeat them (the client already retries what is worth it).
                ray_remote_args_fn=lambda: {"max_restarts": 0},
            )
        vectors: np.ndarray | None = None
        done = 0
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            if vectors is None:
                vectors = np.zeros((len(chunks), batch["vector"].shape[1]), dtype=np.float32)
            vectors[batch["i"]] = batch["vector"]
            done += len(batch["i"])
            progress(done, len(chunks))
        return vectors if vectors is not None else np.zeros((0, 0), dtype=np.float32)
