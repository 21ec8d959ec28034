"""CpuExecutor's thread switch, against vLLM's CPU worker disabling torch.set_num_threads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from rag.stack.engine_hooks import CpuExecutor


def test_a_one_token_step_runs_on_one_thread_though_vllm_disables_set_num_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = torch.set_num_threads
    before = torch.get_num_threads()
    if before < 2:
        real(2)

    def vllm_init(self: Any) -> None:  # what CPUWorker.init_device does to torch
        torch.set_num_threads = lambda n: None

    seen: list[int] = []
    monkeypatch.setattr(UniProcExecutor, "_init_executor", vllm_init)
    monkeypatch.setattr(
        UniProcExecutor,
        "execute_model",
        lambda self, out, non_block=False: seen.append(torch.get_num_threads()),
    )
    monkeypatch.delenv("RAG_ENGINE_NICE", raising=False)
    executor = CpuExecutor.__new__(CpuExecutor)
    try:
        executor._init_executor()
        for tokens in (37, 1, 1, 4):
            executor.execute_model(SimpleNamespace(total_num_scheduled_tokens=tokens))
    finally:
        torch.set_num_threads = real
        real(before)
    n = max(before, 2)
    assert seen == [n, 1, 1, n]
