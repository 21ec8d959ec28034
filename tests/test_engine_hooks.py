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


_GROUPS = """
import sys, tempfile
from pathlib import Path
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import parallel_state as ps
from rag.stack.engine_hooks import _forget_shared_group, _one_gloo_group

def loops():
    tasks = Path("/proc/self/task").iterdir()
    return sum((t / "comm").read_text().strip() == "gloo_tcp_loop" for t in tasks)

init = f"file://{tempfile.mkdtemp()}/store"
with set_current_vllm_config(VllmConfig()), _one_gloo_group():
    ps.init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=init, local_rank=0, backend="gloo"
    )
    ps.ensure_model_parallel_initialized(1, 1)
print("gloo loops", loops())
_forget_shared_group()
ps.cleanup_dist_env_and_memory()
print("torn down")
"""


def test_a_one_rank_worker_starts_one_gloo_loop_and_tears_down_cleanly() -> None:
    """vLLM's own distributed start-up and teardown (its own process: torch.distributed is
    global): one event loop thread, not one per parallel dimension (15 without the
    sharing), and the teardown destroys the shared group once instead of raising
    "Invalid process group specified" on the second alias."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _GROUPS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "gloo loops 1" in lines and lines[-1] == "torn down", done.stdout
