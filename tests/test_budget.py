"""Memory arithmetic behind `rag check`, against numbers worked out by hand."""

from __future__ import annotations

import pytest

from rag.stack.budget import GiB, engine_budget, load_facts, load_tool_parsers

FACTS = load_facts()


def test_kv_cache_per_token_from_architecture() -> None:
    # Qwen3-4B: 2 (K,V) x 36 layers x 8 KV heads x 128 dims x 2 bytes = 144 KiB per token
    assert FACTS["Qwen/Qwen3-4B-Instruct-2507-FP8"].kv_bytes_per_token() == 147_456
    assert FACTS["Qwen/Qwen3-4B-Instruct-2507-FP8"].kv_bytes_per_token(kv_bytes=1) == 73_728
    assert FACTS["BAAI/bge-small-en-v1.5"].kv_bytes_per_token() == 0  # encoder: no cache


def test_weights_follow_storage_and_engine_dtype() -> None:
    fp8 = FACTS["Qwen/Qwen3-4B-Instruct-2507-FP8"]
    assert fp8.weight_bytes(None) == 3_633_511_936 + 2 * 388_956_160  # FP8 linears, bf16 embeddings
    assert fp8.weight_bytes("bfloat16") == fp8.weight_bytes(None)  # quantized stays quantized
    small = FACTS["BAAI/bge-small-en-v1.5"]
    assert small.weight_bytes("float32") == 4 * 33_360_000
    assert small.weight_bytes("auto") == small.weight_bytes("float16") == 2 * 33_360_000


def test_budget_adds_weights_kv_and_runtime() -> None:
    b = engine_budget(
        "chat",
        FACTS["Qwen/Qwen3-4B-Instruct-2507-FP8"],
        {"gpu_memory_utilization": 0.32, "max_model_len": 8192},
        24 * GiB,
    )
    assert b.share_bytes == int(0.32 * 24 * GiB)
    assert b.kv_bytes == 8192 * 147_456  # 1.125 GiB
    assert b.need_bytes == b.weights_bytes + b.kv_bytes + b.overhead_bytes
    assert b.fits and b.spare_bytes / GiB == pytest.approx(1.20, abs=0.01)


def test_guard_at_its_position_limit_does_not_fit() -> None:
    b = engine_budget(
        "guard",
        FACTS["Qwen/Qwen3Guard-Gen-4B"],
        {"gpu_memory_utilization": 0.40, "max_model_len": 32_768},
        24 * GiB,
    )
    assert not b.fits and b.kv_bytes == 32_768 * 147_456  # 4.5 GiB of KV on 7.5 GiB of weights


def test_every_model_family_has_a_tool_parser_and_every_entry_names_its_source() -> None:
    parsers = load_tool_parsers()
    for f in FACTS.values():
        assert f.family is None or f.family in parsers, f.name
        assert f.source, f"{f.name}: say where its facts were read"
    assert parsers["qwen"][0] == "hermes" and parsers["llama3"] == ("llama3_json",)


def test_awq_weights_stay_four_bit_whatever_the_engine_dtype() -> None:
    awq = FACTS["hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"]
    assert awq.family == "llama3" and awq.license == "llama3.1"
    assert awq.weight_bytes("float16") == awq.weight_bytes(None) == 7_033_847_808 // 2 + 2 * 1_105_465_344


# The budget `rag check` computes for the models people swap in, each in the share of
# the role it would take on one 24 GB card (README, "Swapping a model").
SWAPS = [
    ("chat", "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4", 0.32, 8192, True, 0.10),
    ("chat", "meta-llama/Llama-3.1-8B-Instruct", 0.32, 8192, False, -9.53),
    ("chat", "mistralai/Mistral-7B-Instruct-v0.3", 0.32, 8192, False, -8.07),
    ("guard", "meta-llama/Llama-Guard-3-1B", 0.40, 4096, True, 5.43),
    ("guard", "Qwen/Qwen3Guard-Gen-0.6B", 0.40, 4096, True, 6.80),
    ("embed", "BAAI/bge-m3", 0.06, 8192, False, -0.37),  # an encoder: no KV, but 1.06 GiB of weights
    ("score", "BAAI/bge-reranker-v2-m3", 0.06, 512, False, -0.37),
]


@pytest.mark.parametrize(("role", "model", "share", "max_len", "fits", "spare_gib"), SWAPS)
def test_the_budget_of_each_model_people_swap_in(
    role: str, model: str, share: float, max_len: int, fits: bool, spare_gib: float
) -> None:
    engine = {"gpu_memory_utilization": share, "max_model_len": max_len, "dtype": "float16"}
    if role in ("embed", "score"):
        engine["runner"] = "pooling"
    b = engine_budget(role, FACTS[model], engine, 24 * GiB)
    assert b.fits is fits and b.spare_bytes / GiB == pytest.approx(spare_gib, abs=0.01)
