"""Hooks that Ray Serve LLM runs inside each CPU engine replica.

Both are named by import path in `scripts/serve_module.py` (a callback class in
`LLMConfig.callback_config`, an engine class in the RAYLLM_VLLM_ENGINE_CLS env
var that Ray's LLMServer reads), so they load in the replica, never at import
of the serve module; only the CPU profile uses them.
"""

from __future__ import annotations

from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase
from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine

__all__ = ["InProcessEngine", "LocalWeights"]


class LocalWeights(CallbackBase):
    """Skip Ray's per-node "download model files" task: the weights are a local folder.

    That task runs in a fresh Ray worker that imports torch and transformers
    only to find the folder already there (about 10 s of a core each at boot),
    and the worker then stays behind idle, holding about 0.45 GiB, one per
    engine. `rag serve` checks the prepared weights before it boots anything.
    """

    async def on_before_node_init(self) -> None:
        self.ctx.run_init_node = False


class InProcessEngine(VLLMEngine):
    """vLLM's engine with the model run inside its EngineCore process.

    On CPU, Ray Serve LLM forces vLLM's multiprocess executor, which starts one
    more process per engine for a single worker: another torch and vLLM import
    (~0.5 GiB, ~10 s of a core at boot), an RPC whose timeout
    (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS) kills an engine whose step is merely
    slow, and OpenMP threads pinned to one core, the same core for every engine
    (vLLM reserves one core of two "for other processes"). The single-process
    executor has none of these; threads follow OMP_NUM_THREADS.
    """

    def _start_async_llm_engine(self, engine_args: Any, engine_config: Any, placement_group: Any) -> Any:
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        engine_config.parallel_config.distributed_executor_backend = UniProcExecutor
        return super()._start_async_llm_engine(engine_args, engine_config, placement_group)
