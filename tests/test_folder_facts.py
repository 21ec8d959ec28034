"""`rag check --facts-from DIR`: a model folder's config.json, weights and card become a
model_facts.yaml entry that `rag check` then reads like the shipped ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from rag.cli import main
from rag.errors import ConfigError
from rag.stack.budget import FACTS_FILE, load_facts
from rag.stack.folder_facts import facts_from_folder

# A Llama 3-shaped model, small: 2 layers, 4 heads of 16, 2 KV heads, 128k vocabulary.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "max_position_embeddings": 131_072,
    "vocab_size": 128_256,
}
CARD = "---\nlicense: llama3.1\nextra_gated_prompt: Accept the Llama 3.1 license\n---\n# A model\n"


def _folder(
    tmp_path: Path, config: dict[str, object], tensors: dict[str, np.ndarray], card: str = CARD
) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "README.md").write_text(card)
    half = len(tensors) // 2  # two shards, as large checkpoints come
    names = list(tensors)
    save_file({n: tensors[n] for n in names[:half]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[half:]}, str(folder / "model-00002-of-00002.safetensors"))
    return folder


def test_a_plain_checkpoint_gives_its_architecture_params_license_and_gate(tmp_path: Path) -> None:
    tensors = {
        "embed.weight": np.zeros((100, 64), np.float16),
        "layer.q.weight": np.zeros((64, 64), np.float16),
        "norm.weight": np.zeros((64,), np.float32),
        "lm_head.weight": np.zeros((100, 64), np.float16),
    }
    name, entry = facts_from_folder(_folder(tmp_path, CONFIG, tensors), "org/tiny-llama")
    assert name == "org/tiny-llama"
    assert entry["params"] == {"fp16": 100 * 64 * 2 + 64 * 64, "fp32": 64}
    assert (entry["layers"], entry["kv_heads"], entry["head_dim"]) == (2, 2, 16)
    assert entry["family"] == "llama3" and entry["decoder"] is True
    assert entry["license"] == "llama3.1" and entry["gated"] is True


def test_awq_weights_are_counted_as_eight_four_bit_values_per_int32(tmp_path: Path) -> None:
    config = {**CONFIG, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    tensors = {
        "layer.q.qweight": np.zeros((64, 8), np.int32),  # 64 x 64 four-bit weights
        "layer.q.qzeros": np.zeros((1, 8), np.int32),
        "layer.q.scales": np.zeros((1, 64), np.float16),
        "embed.weight": np.zeros((100, 64), np.float16),
    }
    _, entry = facts_from_folder(_folder(tmp_path, config, tensors, card="# no front matter\n"), "org/awq")
    assert entry["params"] == {"int4": 64 * 64 + 64, "fp16": 64 + 100 * 64}
    assert entry["license"] == "unknown" and entry["gated"] is False


def test_the_printed_entry_appends_to_the_facts_file_and_loads(tmp_path: Path) -> None:
    folder = _folder(tmp_path, CONFIG, {"a": np.zeros((8, 8), np.float16), "b": np.zeros((8,), np.float16)})
    result = CliRunner().invoke(main, ["check", "--facts-from", str(folder), "--model-id", "org/tiny-llama"])
    assert result.exit_code == 0, result.output
    facts_file = tmp_path / "model_facts.yaml"
    shutil.copy(FACTS_FILE, facts_file)
    with facts_file.open("a") as f:
        f.write("\n" + result.output)
    facts = load_facts(facts_file)
    tiny = facts["org/tiny-llama"]
    assert tiny.gated and tiny.family == "llama3" and tiny.params == {"fp16": 72}
    assert tiny.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 2
    assert set(load_facts()) < set(facts)  # the shipped facts still load beside it


@pytest.mark.parametrize(
    ("break_it", "needle"),
    [
        (lambda d: (d / "config.json").unlink(), "has no config.json"),
        (lambda d: [p.unlink() for p in d.glob("*.safetensors")], "no *.safetensors"),
        (lambda d: (d / "config.json").write_text('{"model_type": "llama"}'), "lacks num_attention_heads"),
        (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
    ],
    ids=["no-config", "no-weights", "config-without-shape", "config-not-json"],
)
def test_a_folder_that_is_not_a_model_says_what_is_missing(
    tmp_path: Path, break_it: object, needle: str
) -> None:
    folder = _folder(tmp_path, CONFIG, {"a": np.zeros((2,), np.float16), "b": np.zeros((2,), np.float16)})
    break_it(folder)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=needle.replace("*", r"\*")):
        facts_from_folder(folder)
