"""The CPU profile's numeric type, chosen from what this CPU can do.

bf16 halves memory and runs fast where the CPU has bf16 instructions
(AVX512-BF16, or AMX on newer Xeons). Where it has not (AVX2-only laptops,
desktops, CI runners, AMD Zen 1-3), torch emulates bf16: a 16x896 @ 896x4864
matmul ran at 0.3 GFLOP/s in bf16 against 9.3 in float32 on an AVX2 EPYC, and
a single engine step outlived vLLM's 300 s execute timeout. This module makes
the choice once; `scripts/serve_module.py`, `rag serve` and the `rag bench`
baseline all read it from here, and RAG_CPU_DTYPE overrides it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rag.errors import ConfigError

__all__ = ["CPU_DTYPES", "CpuChoice", "choose", "cpu_flags", "detect"]

CPU_DTYPES: tuple[str, ...] = ("bfloat16", "float32")
BF16_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16")  # native bf16 math
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuChoice:
    """What the CPU offers and the dtype the CPU profile runs in."""

    isa: str  # AMX | AVX512 | AVX2 | baseline: the widest vector unit seen
    bf16: bool  # native bf16 instructions
    dtype: str  # bfloat16 | float32
    overridden: bool  # RAG_CPU_DTYPE chose, not the flags

    def describe(self) -> str:
        """One line for logs: `cpu: AVX2, no bf16 -> float32`."""
        bf16 = "bf16" if self.bf16 else "no bf16"
        how = " (RAG_CPU_DTYPE)" if self.overridden else ""
        return f"cpu: {self.isa}, {bf16} -> {self.dtype}{how}"


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The feature flags of the first CPU listed in /proc/cpuinfo (empty if unreadable)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def choose(flags: Iterable[str], override: str | None = None) -> CpuChoice:
    """bf16 where the CPU computes in it natively, float32 elsewhere; `override` wins."""
    flags = frozenset(flags)
    if any(f.startswith("amx") for f in flags):
        isa = "AMX"
    elif "avx512f" in flags:
        isa = "AVX512"
    elif "avx2" in flags:
        isa = "AVX2"
    else:
        isa = "baseline"
    bf16 = any(f in flags for f in BF16_FLAGS)
    if override:
        dtype = {"bf16": "bfloat16", "fp32": "float32"}.get(
            override.strip().lower(), override.strip().lower()
        )
        if dtype not in CPU_DTYPES:
            raise ConfigError(f"RAG_CPU_DTYPE={override!r}: choose one of {', '.join(CPU_DTYPES)}")
        return CpuChoice(isa, bf16, dtype, overridden=True)
    return CpuChoice(isa, bf16, "bfloat16" if bf16 else "float32", overridden=False)


def detect() -> CpuChoice:
    """The choice for this machine: /proc/cpuinfo's flags, RAG_CPU_DTYPE if set."""
    return choose(cpu_flags(), os.environ.get("RAG_CPU_DTYPE") or None)
