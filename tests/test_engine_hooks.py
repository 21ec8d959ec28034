"""CpuExecutor's one gloo group, through vLLM's own distributed start-up and teardown."""

from __future__ import annotations

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
