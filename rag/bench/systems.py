"""The systems the bench starts: the stack (`rag serve`), bare vLLM, and the one-at-a-time baseline.

Each is a `Managed` subprocess; the CLI stops one before it starts the next, so
no two share cores. Bare vLLM is what a user would run instead of the stack:
vLLM's own OpenAI server over the stack's chat weights, with the chat engine's
engine arguments and environment (OpenMP threads) read from the serve module, so
`ours / bare` measures what Ray Serve, our ingress and our engine hooks make of
the same engine. One thing differs by vLLM's choice: on CPU it always runs the
model in a worker process of its own (vllm/platforms/cpu.py overrides
`--distributed-executor-backend uni`), where the stack runs it inside the
EngineCore (rag/stack/engine_hooks.py).

Cores: that worker binds its OpenMP threads by VLLM_CPU_OMP_THREADS_BIND, whose
default `auto` reserves one core for vLLM's scheduler and binds the model to the
rest, overriding OMP_NUM_THREADS: on 2 cores, one compute thread against the
stack's two. A side-by-side must not handicap the other side, so bare vLLM is
bound to the cores the stack's chat engine computes on (`bare_binding`), and the
bench reads each system's busy threads and their cores off the running processes
(rag/bench/compute.py) and prints them beside the numbers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from rag.stack.process import Log, Managed

__all__ = [
    "bare_binding",
    "bare_command",
    "chat_config",
    "declared",
    "start_bare",
    "start_baseline",
    "start_stack",
]

# Environment of the chat engine's runtime_env that has a meaning outside Ray Serve LLM.
_ENGINE_ENV_PREFIXES = ("OMP_", "VLLM_", "MALLOC_", "HF_", "TOKENIZERS_")


def start_stack(port: int, workdir: Path, log: Log) -> Managed:
    """`rag serve` on `port` (metrics on port + 2), logging to workdir/stack.log."""
    log(f"starting the stack on port {port} (a few minutes on CPU) ...")
    cmd = [sys.executable, "-m", "rag.cli", "serve", "--port", str(port), "--metrics-port", str(port + 2)]
    return Managed("the stack", cmd, workdir / "stack.log", 1200, log)


def _flag(key: str, value: Any) -> list[str]:
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if value is False:
        return [f"--no-{key.replace('_', '-')}"]
    if isinstance(value, dict | list):
        return [name, json.dumps(value)]
    return [name, str(value)]


def bare_binding(threads: int, cores: set[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for bare vLLM computing as the stack's chat engine does,
    with `threads` OpenMP threads free to run on `cores` (this process's, by default).

    Every core: the list of them (vLLM then runs one thread per core listed, all on
    those cores, and reserves none). Fewer threads than cores (RAG_ENGINE_THREADS):
    `nobind`, which leaves OMP_NUM_THREADS and the OS's placement alone, as the stack
    does; a list of `threads` cores would pin them where the stack's float."""
    cores = cores if cores is not None else os.sched_getaffinity(0)
    from rag.bench.compute import core_list

    return core_list(cores) if threads >= len(cores) else "nobind"


def bare_command(cfg: Any, port: int) -> tuple[list[str], dict[str, str]]:
    """vLLM's OpenAI server with `cfg`'s (an LLMConfig) model, engine arguments and engine
    environment, on 127.0.0.1:`port`: (argv, environment). Its model's threads are bound
    to the cores the stack's chat engine computes on (`bare_binding`)."""
    loading = cfg.model_loading_config
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(loading.model_source), "--served-model-name", loading.model_id,
        "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log",
    ]  # fmt: skip
    engine = dict(cfg.engine_kwargs)
    env_vars = dict((cfg.runtime_env or {}).get("env_vars") or {})
    for key, value in engine.items():
        cmd += _flag(key, value)
    from rag.stack.serve import OFFLINE_ENV

    env = dict(os.environ)
    env.update({k: str(v) for k, v in env_vars.items() if k.startswith(_ENGINE_ENV_PREFIXES)})
    if "OMP_NUM_THREADS" in env_vars:  # the CPU profile: the same threads on the same cores
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", bare_binding(int(env_vars["OMP_NUM_THREADS"])))
    env.update(OFFLINE_ENV)  # no hub, no telemetry: as every process of the stack
    return cmd, env


def chat_config(module_path: Path) -> Any:
    """The chat engine's LLMConfig in `module_path`, for the profile `rag serve` would pick."""
    from rag.stack.preflight import load_configs
    from rag.stack.profiles import detect_profile

    return load_configs(module_path, detect_profile())["chat"]


def declared(cfg: Any) -> dict[str, dict[str, str]]:
    """What each system is told about threads and cores (bench.md prints it beside what
    rag/bench/compute.py saw them run on)."""
    from rag.bench.compute import core_list

    env_vars = dict((cfg.runtime_env or {}).get("env_vars") or {})
    threads = str(env_vars.get("OMP_NUM_THREADS", "vLLM's default"))
    free = f"none, free on cores {core_list(os.sched_getaffinity(0))}"
    _, bare_env = bare_command(cfg, 0)
    return {
        "ours": {"OMP_NUM_THREADS": threads, "binding": free, "nice": env_vars.get("RAG_ENGINE_NICE", "0")},
        "bare": {
            "OMP_NUM_THREADS": bare_env.get("OMP_NUM_THREADS", "vLLM's default"),
            "VLLM_CPU_OMP_THREADS_BIND": bare_env.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        },
        "baseline": {"torch threads": _baseline_threads(cfg), "binding": free},
    }


def _baseline_threads(cfg: Any) -> str:
    env_vars = dict((cfg.runtime_env or {}).get("env_vars") or {})
    return str(env_vars.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))


def start_bare(module_path: Path, port: int, workdir: Path, log: Log) -> Managed:
    """Bare vLLM serving the stack's chat engine as `module_path` configures it (CPU profile
    or GPU, whichever `rag serve` would pick), logging to workdir/bare.log."""
    cfg = chat_config(module_path)
    cmd, env = bare_command(cfg, port)
    if "hermes_json" in cmd:  # our parser, registered by the stack's engine hook, unknown to vLLM
        i = cmd.index("--tool-call-parser")
        cmd[i : i + 2] = ["--tool-call-parser", "hermes"]
    log(f"starting bare vLLM on port {port} ({' '.join(cmd[3:])}) ...")
    url = f"http://127.0.0.1:{port}/v1"
    return Managed("bare vLLM", cmd, workdir / "bare.log", 900, log, ready_url=url, env=env)


def start_baseline(model_dir: str, port: int, workdir: Path, log: Log, module_path: Path) -> Managed:
    """rag.baseline on `port` over `model_dir`, in the dtype the stack would choose here,
    on as many threads as the stack's chat engine computes with."""
    from rag.stack.hardware import detect

    dtype = detect().dtype  # the stack's own choice, so the ratio compares like with like
    threads = _baseline_threads(chat_config(module_path))
    log(f"starting the one-at-a-time baseline on port {port} ({dtype}, {threads} threads) ...")
    cmd = [
        sys.executable, "-m", "rag.baseline", "--model", model_dir, "--port", str(port),
        "--dtype", dtype, "--threads", threads,
    ]  # fmt: skip
    return Managed("the baseline", cmd, workdir / "baseline.log", 600, log)
