"""GPU memory budget: does each model, with KV cache for its max_model_len, fit its share?

vLLM claims `gpu_memory_utilization x card` at boot and must fit, inside that:
the weights, the activations of one forward pass plus the CUDA context and
graphs (ENGINE_OVERHEAD below, measured-order estimates), and a KV cache
large enough for at least one sequence of `max_model_len` tokens, or it
refuses to start. Everything here is arithmetic on facts from
`rag/stack/model_facts.yaml`; nothing touches a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rag.errors import ConfigError

__all__ = [
    "ENGINE_OVERHEAD_BYTES",
    "FACTS_FILE",
    "PACKED_DTYPES",
    "EngineBudget",
    "GiB",
    "ModelFacts",
    "engine_budget",
    "load_facts",
    "load_tool_parsers",
]

GiB = 1 << 30
FACTS_FILE = Path(__file__).with_name("model_facts.yaml")

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "float32": 4, "float": 4,
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
    "fp8": 1, "int8": 1, "int4": 0.5, "int32": 4, "int64": 8,
}  # fmt: skip
# Stored this way, a parameter keeps its size whatever the engine's `dtype` says:
# quantized weights (and integer buffers) are not cast.
PACKED_DTYPES = frozenset({"fp8", "int8", "int4", "int32", "int64"})

# CUDA context, cuBLAS workspace, the profiling pass's peak activations and CUDA
# graphs. Generative engines profile a full batch of max_num_batched_tokens; pooling
# engines here are small encoders.
ENGINE_OVERHEAD_BYTES = {"generate": int(1.25 * GiB), "pooling": int(0.75 * GiB)}


@dataclass(frozen=True)
class ModelFacts:
    """What the budget needs to know about one model's architecture."""

    name: str
    license: str
    decoder: bool
    params: dict[str, int]  # dtype -> parameter count stored in it
    layers: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int
    gated: bool = False  # its repo asks users to accept terms: downloads need HF_TOKEN
    family: str | None = None  # picks the tool-call parser (load_tool_parsers)
    source: str = ""  # where the facts were read
    guard_format: str | None = None  # a guard model's reply format (rag/guard.py GUARD_FORMATS)

    def weight_bytes(self, dtype: str | None) -> int:
        """Bytes of weights once loaded with engine `dtype` (None/"auto": vLLM's choice)."""
        total = 0.0
        for stored, count in self.params.items():
            if stored in PACKED_DTYPES:
                size = DTYPE_BYTES[stored]  # quantized weights stay quantized whatever `dtype` says
            elif dtype and dtype != "auto":
                size = DTYPE_BYTES[dtype]
            else:
                size = min(DTYPE_BYTES[stored], 2)  # auto serves fp32 checkpoints in 16 bits
            total += count * size
        return int(total)

    def kv_bytes_per_token(self, kv_bytes: int = 2) -> int:
        """K and V for every layer; zero for encoder-only models."""
        if not self.decoder:
            return 0
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_bytes


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), dict):
        raise ConfigError(f"{path}: expected a `models:` mapping (and `tool_parsers:`)")
    return raw


def load_facts(path: Path = FACTS_FILE) -> dict[str, ModelFacts]:
    """Read rag/stack/model_facts.yaml's `models:` into ModelFacts by model name."""
    facts = {}
    for name, f in _read(path)["models"].items():
        try:
            unknown = set(f["params"]) - set(DTYPE_BYTES)
            if unknown:
                raise ConfigError(
                    f"{path}: {name}: unknown parameter dtype(s) {sorted(unknown)}; "
                    f"use {', '.join(sorted(DTYPE_BYTES))}"
                )
            facts[name] = ModelFacts(
                name=name,
                license=str(f["license"]).lower(),
                decoder=bool(f["decoder"]),
                params={k: int(v) for k, v in f["params"].items()},
                layers=int(f["layers"]),
                kv_heads=int(f["kv_heads"]),
                head_dim=int(f["head_dim"]),
                max_position_embeddings=int(f["max_position_embeddings"]),
                gated=bool(f.get("gated", False)),
                family=str(f["family"]) if f.get("family") else None,
                source=str(f.get("source", "")),
                guard_format=str(f["guard_format"]) if f.get("guard_format") else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: model `{name}` is incomplete or malformed ({exc!r})") from None
    return facts


def load_tool_parsers(path: Path = FACTS_FILE) -> dict[str, tuple[str, ...]]:
    """Each model family's vLLM tool-call parsers (the first is the one to suggest)."""
    raw = _read(path).get("tool_parsers") or {}
    return {str(family): tuple(str(p) for p in parsers) for family, parsers in raw.items()}


@dataclass(frozen=True)
class EngineBudget:
    """One engine's share of the card and what it must hold."""

    role: str
    model: str
    share: float
    share_bytes: int
    weights_bytes: int
    kv_bytes: int  # KV cache for one sequence of max_model_len tokens
    overhead_bytes: int
    max_model_len: int

    @property
    def need_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    @property
    def spare_bytes(self) -> int:
        return self.share_bytes - self.need_bytes

    @property
    def fits(self) -> bool:
        return self.spare_bytes >= 0


def engine_budget(
    role: str, facts: ModelFacts, engine_kwargs: dict[str, Any], card_bytes: int
) -> EngineBudget:
    """Budget for one engine from its facts and engine_kwargs."""
    share = float(engine_kwargs.get("gpu_memory_utilization", 0.9))  # vLLM's default
    pooling = engine_kwargs.get("runner") == "pooling"
    max_len = int(engine_kwargs.get("max_model_len") or facts.max_position_embeddings)
    kv_dtype = str(engine_kwargs.get("kv_cache_dtype", "auto"))
    kv_bytes = 1 if kv_dtype.startswith("fp8") else 2
    return EngineBudget(
        role=role,
        model=facts.name,
        share=share,
        share_bytes=int(share * card_bytes),
        weights_bytes=facts.weight_bytes(engine_kwargs.get("dtype")),
        kv_bytes=facts.kv_bytes_per_token(kv_bytes) * max_len,
        overhead_bytes=ENGINE_OVERHEAD_BYTES["pooling" if pooling else "generate"],
        max_model_len=max_len,
    )
