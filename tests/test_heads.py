"""The trained reranker's folder: its adapter merged into the encoder exactly, rebuilt when
either changes, and the shipped adapter consistent with its card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag.stack import heads
from rag.stack.manifest import MANIFEST

LAYER = "bert.encoder.layer.0.attention.self.query"


def _tiny_base(folder: Path) -> None:
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True)
    config = BertConfig(vocab_size=12, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16)  # fmt: skip
    BertModel(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefg"]))
    (folder / MANIFEST).write_text('{"files": {}}')


def _adapter(path: Path, seed: int) -> dict[str, object]:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {
        f"{LAYER}.lora_a": torch.randn(2, 8, generator=g),
        f"{LAYER}.lora_b": torch.randn(8, 2, generator=g),
        "bert.pooler.dense.weight": torch.randn(8, 8, generator=g),
        "bert.pooler.dense.bias": torch.randn(8, generator=g),
        "classifier.weight": torch.randn(1, 8, generator=g),
        "classifier.bias": torch.randn(1, generator=g),
    }
    save_file(tensors, str(path), metadata={"rank": "2", "alpha": "4"})
    return tensors


def test_the_adapter_is_merged_exactly_and_rebuilt_only_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import load_file

    models = tmp_path / "models"
    base = models / "tiny-encoder"
    _tiny_base(base)
    adapter = tmp_path / "tiny-reranker.safetensors"
    tensors = _adapter(adapter, seed=1)
    spec = heads.RerankerAdapter("tiny-reranker", "tiny-encoder")
    monkeypatch.setattr(heads.RerankerAdapter, "adapter", property(lambda self: adapter))
    logs: list[str] = []
    folder = heads.prepare_reranker(spec, base, models, logs.append)

    merged = load_file(str(folder / "model.safetensors"))
    original = load_file(str(base / "model.safetensors"))
    plain = LAYER.removeprefix("bert.") + ".weight"  # the base is a BertModel: no "bert." prefix
    want = original[plain] + tensors[f"{LAYER}.lora_b"] @ tensors[f"{LAYER}.lora_a"] * 2.0  # type: ignore[operator]
    assert torch.allclose(merged[f"{LAYER}.weight"], want)
    assert torch.equal(merged["classifier.weight"], tensors["classifier.weight"])  # type: ignore[arg-type]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"] == {
        "0": "relevant"
    }
    assert (folder / "tokenizer.json").is_file() or (folder / "vocab.txt").is_file()

    heads.prepare_reranker(spec, base, models, logs.append)
    assert logs[-1] == f"tiny-reranker: ready ({folder})"  # reused, not rebuilt
    tensors = _adapter(adapter, seed=2)  # a retrained adapter replaces the old merge
    heads.prepare_reranker(spec, base, models, logs.append)
    assert "merged" in logs[-1]
    assert torch.equal(
        load_file(str(folder / "model.safetensors"))["classifier.weight"], tensors["classifier.weight"]
    )  # type: ignore[arg-type]
    assert sorted(p.name for p in models.iterdir()) == ["tiny-encoder", "tiny-reranker"]  # no temp folders


def test_an_adapter_for_another_encoder_is_refused_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import save_file

    base = tmp_path / "models" / "tiny-encoder"
    _tiny_base(base)
    adapter = tmp_path / "other.safetensors"
    save_file({"bert.encoder.layer.9.output.dense.lora_a": torch.zeros(2, 8),
               "bert.encoder.layer.9.output.dense.lora_b": torch.zeros(8, 2)}, str(adapter))  # fmt: skip
    monkeypatch.setattr(heads.RerankerAdapter, "adapter", property(lambda self: adapter))
    with pytest.raises(heads.ModelPrepError, match="retrain"):
        heads.prepare_reranker(heads.RerankerAdapter("r", "tiny-encoder"), base, base.parent, lambda m: None)
    assert sorted(p.name for p in base.parent.iterdir()) == ["tiny-encoder"]  # nothing half-built left


def test_the_shipped_reranker_matches_its_card() -> None:
    from safetensors import safe_open

    for spec in heads.RERANKERS.values():
        card = json.loads(spec.card.read_text())
        with safe_open(str(spec.adapter), "pt") as f:
            meta, keys = f.metadata(), list(f.keys())
        assert meta == {"rank": str(card["rank"]), "alpha": str(card["alpha"])}
        assert "classifier.weight" in keys and any(k.endswith(".lora_a") for k in keys)
        floor = card["floor"]
        # calibrated on held-out queries of the training manuals, never on eval/
        assert 0 < floor["threshold"] < 1 and floor["on_topic_passed"] >= 0.97
        assert not set(card["corpora"]) & {"git-doc", "python3-doc", "corpus"}
