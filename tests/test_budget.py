"""Memory arithmetic behind `rag check`, against numbers worked out by hand."""

from __future__ import annotations

import pytest

from rag.stack.budget import GiB, engine_budget, load_facts

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


def test_every_fact_is_for_an_open_licence() -> None:
    assert {f.license for f in FACTS.values()} <= {"apache-2.0", "mit"}
