"""Hooks that Ray Serve LLM runs inside each engine replica.

They are named by import path in `scripts/serve_module.py` (a callback class in
`LLMConfig.callback_config`, an engine class in the RAYLLM_VLLM_ENGINE_CLS env
var that Ray's LLMServer reads), so they load in the replica, never at import
of the serve module. `Engine` serves both profiles; `LocalWeights` and
`InProcessEngine` only the CPU one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase
from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from rag.stack.loopback import keep_replicas_on_loopback

keep_replicas_on_loopback()  # imported as each LLM replica initializes (rag/stack/loopback.py)

__all__ = ["CpuExecutor", "Engine", "InProcessEngine", "LocalWeights"]


class LocalWeights(CallbackBase):
    """Skip Ray's per-node "download model files" task: the weights are a local folder.

    That task runs in a fresh Ray worker that imports torch and transformers
    only to find the folder already there (about 10 s of a core each at boot),
    and the worker then stays behind idle, holding about 0.45 GiB, one per
    engine. `rag serve` checks the prepared weights before it boots anything.
    """

    async def on_before_node_init(self) -> None:
        self.ctx.run_init_node = False


class Engine(VLLMEngine):
    """Ray's vLLM engine with /tokenize and /detokenize working on vLLM 0.29, and our
    `hermes_json` tool parser registered (rag/stack/tool_parser.py).

    Ray 2.60 looks for vLLM's tokenizer service as `openai_serving_tokenization` in
    the app state vLLM builds; vLLM 0.29 names it `serving_tokenization`, so both
    routes answered "This model does not support the 'tokenization' task".
    """

    async def start(self) -> None:
        from rag.stack import tool_parser

        tool_parser.register()  # `hermes_json`, which the CPU chat config names
        await super().start()
        state = getattr(self, "_app_state", None)
        if getattr(self, "_oai_serving_tokenization", None) is None and state is not None:
            self._oai_serving_tokenization = getattr(state, "serving_tokenization", None)


class InProcessEngine(Engine):
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
        engine_config.parallel_config.distributed_executor_backend = CpuExecutor
        return super()._start_async_llm_engine(engine_args, engine_config, placement_group)


class CpuExecutor(UniProcExecutor):
    """vLLM's single-process executor as the CPU profile runs it: computing at nice
    RAG_ENGINE_NICE (the serve module sets it; 0 leaves the priority alone), on every
    OpenMP thread it was given (OMP_NUM_THREADS), with one gloo group.

    On a CPU the engines' compute and the requests' front door (Ray's proxy, our
    ingress, the replicas that stream tokens) share the cores. At the same priority a
    burst waits behind the model: 640 chats at once on 2 cores (batch 64, so 512 are
    refused) got their refusals in 2.02 s at the median, the slowest in 3.13 s; with the
    engines' compute at nice 10, 1.14 and 1.72 s, the 128 served no slower: the front
    door comes first and the engines still get every cycle it leaves. Set in the
    EngineCore's main thread before the model loads, so the OpenMP threads it starts
    inherit it.

    Threads: every step runs on all of them, as vLLM's own CPU worker does. A step of a
    single token used to drop to one thread; on one 2-core EPYC that was within the
    spread of a run (23.6 tok/s one request at a time, against 21.5 and 22.6), on another
    (avx512_bf16, no AMX) it cost a fifth of the speed of one stream: 13.0 / 13.2 tok/s
    against 15.4 / 16.0 on all threads (`rag bench --levels 1,4`, seeds 7 and 8, prompts
    the stack had not seen), so it went (issue 33).

    Not done: binding the chat's OpenMP threads to cores (OMP_PROC_BIND=close,
    OMP_PLACES={0},{1}, as bare vLLM binds its worker). In the EngineCore that pins the
    main thread, which schedules, and every thread started after it to core 0: 9.4 /
    43.9 / 54.7 / 61.2 tok/s at concurrency 1 / 4 / 16 / 64 against 21.5 / 53.5 / 91.7 /
    106.4 unbound (same machine). Nor does vLLM's own multiprocess executor, its worker
    bound as bare vLLM's is (VLLM_CPU_OMP_THREADS_BIND=0-1), help inside the stack: 15.9 /
    29.7 / 59.7 / 58.8 against 15.7 / 41.8 / 60.0 / 62.8 in-process (2-core EPYC, one run
    each)."""

    def _init_executor(self) -> None:
        nice = int(os.environ.get("RAG_ENGINE_NICE") or 0)
        if nice > 0:
            os.nice(nice)
        with _one_gloo_group():
            super()._init_executor()

    def shutdown(self) -> None:
        super().shutdown()
        _forget_shared_group()


# A single-rank engine's process groups, all one: see _one_gloo_group.
_SHARED: list[Any] = []


@contextlib.contextmanager
def _one_gloo_group() -> Iterator[None]:
    """Every process group vLLM creates while the worker starts is the default one.

    A vLLM worker builds two gloo groups for each of its parallel dimensions (tensor,
    pipeline, data, expert, ...), 15 event loop threads in all (vLLM 0.29), even at one
    rank, where no collective ever runs. Each loop wakes every 10 ms, so an idle
    engine took 0.5 s of CPU per 30 s, four of them 2.0 s, on the two cores the chat
    computes on (2-core EPYC; with one group, under 0.3 s each). At one rank every
    group holds the one process, as the default group does, so vLLM gets that one.
    """
    import torch.distributed as dist

    new_group = dist.new_group

    def shared(*args: Any, **kwargs: Any) -> Any:
        if dist.get_world_size() != 1:
            return new_group(*args, **kwargs)
        _SHARED.append(dist.group.WORLD)
        return dist.group.WORLD

    dist.new_group = shared
    try:
        yield
    finally:
        dist.new_group = new_group


def _forget_shared_group() -> None:
    """Let vLLM's teardown destroy the default group once, not once per alias of it
    (a second destroy raises "Invalid process group specified")."""
    if not _SHARED:
        return
    from vllm.distributed import parallel_state

    for coordinator in vars(parallel_state).values():
        if isinstance(coordinator, parallel_state.GroupCoordinator):
            for name in ("device_group", "cpu_group"):
                if getattr(coordinator, name, None) is _SHARED[0]:
                    delattr(coordinator, name)
    _SHARED.clear()
