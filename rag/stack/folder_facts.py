"""Facts for rag/stack/model_facts.yaml from a model folder a user already has.

`rag check --facts-from DIR` reads what a Hugging Face model folder holds, offline:
- config.json: architecture, layers, KV heads, head size, positions, model type;
- every *.safetensors file's header (its first bytes: each tensor's dtype and shape),
  so parameters are counted per stored dtype exactly, packed 4-bit AWQ/GPTQ weights
  (eight to an int32) included;
- README.md's front matter (the model card): license, and `extra_gated_*` keys,
  which mark a repo whose terms a user must accept before downloading.
It prints one `models:` entry to append to the facts file; nothing is written.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import yaml

from rag.errors import ConfigError

__all__ = ["facts_from_folder", "family_of", "to_yaml"]

# safetensors dtype -> the facts file's dtype names
_DTYPES = {
    "F64": "fp32", "F32": "fp32", "F16": "fp16", "BF16": "bf16",
    "F8_E4M3": "fp8", "F8_E5M2": "fp8", "I8": "int8", "U8": "int8",
    "I16": "fp16", "I32": "int32", "I64": "int64", "BOOL": "int8",
}  # fmt: skip
# Encoder-only model types keep no KV cache.
_ENCODERS = {
    "bert",
    "roberta",
    "xlm-roberta",
    "deberta-v2",
    "distilbert",
    "electra",
    "modernbert",
    "nomic_bert",
}
_MAX_HEADER = 100 << 20  # a header larger than this is not a safetensors file


def family_of(config: dict[str, Any]) -> str | None:
    """The tool-call family of a config (model_facts.yaml's tool_parsers keys)."""
    kind = str(config.get("model_type", ""))
    if kind.startswith("qwen"):
        return "qwen"
    if kind == "llama":  # Llama 3.x has a 128k vocabulary; Llama 2 has no tool format
        return "llama3" if int(config.get("vocab_size", 0)) >= 128_000 else None
    if kind in ("llama4", "mistral", "granite"):
        return kind
    return None


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ConfigError(f"{path} is not a safetensors file (shorter than its header length)")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER:
            raise ConfigError(f"{path} is not a safetensors file (header of {size} bytes)")
        header: dict[str, Any] = json.loads(f.read(size))
    return header


def _params(folder: Path, quant: dict[str, Any]) -> dict[str, int]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(
            f"no *.safetensors in {folder}: the facts count parameters from the weights' headers"
        )
    packed = int(quant.get("bits", 0)) == 4 and quant.get("quant_method") in (
        "awq",
        "gptq",
        "compressed-tensors",
    )
    counts: dict[str, int] = {}
    for file in files:
        for name, tensor in _header(file).items():
            if name == "__metadata__":
                continue
            n = math.prod(int(d) for d in tensor["shape"])
            dtype = _DTYPES.get(str(tensor["dtype"]))
            if dtype is None:
                raise ConfigError(f"{file}: tensor {name} has dtype {tensor['dtype']}, unknown to the facts")
            if packed and dtype == "int32" and name.endswith(("qweight", "qzeros")):
                dtype, n = "int4", n * 8  # eight 4-bit values in each int32
            counts[dtype] = counts.get(dtype, 0) + n
    return counts


def _card(folder: Path) -> dict[str, Any]:
    readme = folder / "README.md"
    if not readme.is_file():
        return {}
    text = readme.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return {}
    try:
        front = yaml.safe_load(text.split("---", 2)[1])
    except yaml.YAMLError:
        return {}
    return front if isinstance(front, dict) else {}


def facts_from_folder(folder: Path, model_id: str | None = None) -> tuple[str, dict[str, Any]]:
    """(model id, its facts entry) from a model folder; ConfigError saying what is missing."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{folder} has no config.json; point --facts-from at a Hugging Face model folder")
    try:
        config: dict[str, Any] = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config_file} is not valid JSON: {exc}") from None
    text = config.get("text_config") or config  # multimodal configs nest the language model
    missing = [
        k for k in ("num_attention_heads", "num_hidden_layers", "max_position_embeddings") if k not in text
    ]
    if "head_dim" not in text and "hidden_size" not in text:
        missing.append("hidden_size")
    if missing:
        raise ConfigError(
            f"{config_file} lacks {', '.join(missing)}; add the facts by hand (see the file's header)"
        )
    heads = int(text["num_attention_heads"])
    card = _card(folder)
    gated = any(str(k).startswith("extra_gated") for k in card)
    entry: dict[str, Any] = {
        "family": family_of(text),
        "license": str(card.get("license", "unknown")).lower(),
        "gated": gated,
        "source": f"{config_file.resolve()} and *.safetensors headers (rag check --facts-from)",
        "architecture": (config.get("architectures") or ["?"])[0],
        "decoder": str(text.get("model_type", "")) not in _ENCODERS,
        "params": _params(folder, dict(config.get("quantization_config") or {})),
        "layers": int(text["num_hidden_layers"]),
        "kv_heads": int(text.get("num_key_value_heads") or heads),
        "head_dim": int(text.get("head_dim") or int(text["hidden_size"]) // heads),
        "max_position_embeddings": int(text["max_position_embeddings"]),
    }
    if entry["family"] is None:
        del entry["family"]
    name = model_id or str(config.get("_name_or_path") or folder.name)
    return name, entry


def to_yaml(name: str, entry: dict[str, Any]) -> str:
    """The entry as it goes under `models:` in model_facts.yaml (indented two spaces)."""
    body = yaml.safe_dump({name: entry}, sort_keys=False, default_flow_style=False)
    lines = [f"  {line}" if line else line for line in body.splitlines()]
    note = "  # check `license` and `gated` against the model card before you rely on them"
    return "\n".join([note, *lines]) + "\n"
