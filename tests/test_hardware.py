"""The CPU profile's dtype follows the CPU's flags (faked here), and RAG_CPU_DTYPE wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag.errors import ConfigError
from rag.stack.hardware import choose, cpu_flags, detect

# Flags as /proc/cpuinfo lists them on machines this project has run on.
XEON_AMX = "fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8"
ZEN4 = "fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_vnni"
EPYC_ZEN1 = "fpu sse2 avx avx2 fma bmi2 sha_ni"
SKYLAKE_SP = "fpu sse2 avx avx2 avx512f avx512bw avx512dq avx512vl"  # AVX-512 but no bf16


@pytest.mark.parametrize(
    ("flags", "isa", "bf16", "dtype"),
    [
        (XEON_AMX, "AMX", True, "bfloat16"),
        (ZEN4, "AVX512", True, "bfloat16"),
        (EPYC_ZEN1, "AVX2", False, "float32"),
        (SKYLAKE_SP, "AVX512", False, "float32"),
        ("fpu sse2", "baseline", False, "float32"),
        ("", "baseline", False, "float32"),
    ],
)
def test_bf16_only_where_the_cpu_computes_in_it(flags: str, isa: str, bf16: bool, dtype: str) -> None:
    c = choose(flags.split())
    assert (c.isa, c.bf16, c.dtype, c.overridden) == (isa, bf16, dtype, False)


def test_the_log_line_says_what_was_seen_and_chosen() -> None:
    assert choose(EPYC_ZEN1.split()).describe() == "cpu: AVX2, no bf16 -> float32"
    assert choose(XEON_AMX.split()).describe() == "cpu: AMX, bf16 -> bfloat16"
    assert choose(XEON_AMX.split(), "float32").describe() == "cpu: AMX, bf16 -> float32 (RAG_CPU_DTYPE)"


@pytest.mark.parametrize(
    ("override", "dtype"), [("float32", "float32"), ("fp32", "float32"), ("BF16", "bfloat16")]
)
def test_override_wins_over_the_flags(override: str, dtype: str) -> None:
    assert choose(EPYC_ZEN1.split(), override).dtype == dtype


def test_an_unknown_override_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"RAG_CPU_DTYPE='float8'.*bfloat16, float32"):
        choose(XEON_AMX.split(), "float8")


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {EPYC_ZEN1}\n\nprocessor\t: 1\n")
    assert "avx2" in cpu_flags(info) and "avx512_bf16" not in cpu_flags(info)
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_detect_reads_the_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_CPU_DTYPE", "float32")
    assert detect().dtype == "float32" and detect().overridden


def test_serve_module_runs_the_qwen_engines_in_the_chosen_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_settings import _serve_module

    for forced in ("float32", "bfloat16"):
        module = _serve_module(monkeypatch, RAG_PROFILE="cpu", RAG_CPU_DTYPE=forced)
        assert {module.CONFIGS[r].engine_kwargs["dtype"] for r in ("chat", "guard", "score")} == {forced}
        assert module.CONFIGS["embed"].engine_kwargs["dtype"] == "float32"  # 22M parameters: always


def test_kv_caches_hold_the_same_tokens_in_either_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_settings import _serve_module

    kv = {
        forced: _serve_module(monkeypatch, RAG_PROFILE="cpu", RAG_CPU_DTYPE=forced)
        .CONFIGS["chat"]
        .engine_kwargs["kv_cache_memory_bytes"]
        for forced in ("float32", "bfloat16")
    }
    assert kv["float32"] == 2 * kv["bfloat16"] == 2 * 24 * 1024 * 2 * 24 * 2 * 64 * 2
