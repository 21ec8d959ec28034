"""The serve module builds its configs from the profile facts (rag/stack/profiles.py),
and serves the model ids the client asks for by default."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from rag import settings
from rag.errors import ConfigError
from rag.stack import profiles
from tests.conftest import ROOT


def _serve_module(monkeypatch: pytest.MonkeyPatch, **env: str) -> ModuleType:
    for key in ("RAG_PROFILE", "RAG_MODELS_DIR", "RAG_CPU_MODELS", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location("_sm", ROOT / "scripts" / "serve_module.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_served_model_ids_are_the_clients_default_model_names(
    monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    for var in ("RAG_CHAT_MODEL", "RAG_GUARD_MODEL", "RAG_EMBED_MODEL", "RAG_SCORE_MODEL"):
        monkeypatch.delenv(var, raising=False)
    module = _serve_module(monkeypatch, RAG_PROFILE=profile)
    s = settings.Settings.from_env()
    ids = {role: cfg.model_id for role, cfg in module.CONFIGS.items()}
    assert ids == {
        "chat": s.chat_model,
        "guard": s.guard_model,
        "embed": s.embed_model,
        "score": s.score_model,
    }
    assert tuple(ids) == profiles.ROLES


def test_the_cpu_configs_read_the_models_folder_and_set_from_the_profile_facts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = _serve_module(
        monkeypatch, RAG_PROFILE="cpu", RAG_MODELS_DIR=str(tmp_path), RAG_CPU_MODELS="smollm2"
    )
    assert profiles.default_models_dir() == tmp_path
    sources = {role: cfg.model_loading_config.model_source for role, cfg in module.CONFIGS.items()}
    assert sources == {
        role: str(tmp_path / name) for role, name in profiles.CPU_MODEL_SETS["smollm2"].items()
    }


def test_models_folder_defaults_to_the_user_cache(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert profiles.default_models_dir(env) == tmp_path / "rag-stack" / "models"
    assert profiles.default_models_dir({"RAG_MODELS_DIR": "~/m"}) == Path.home() / "m"


def test_profile_detection_reads_rag_profile_first() -> None:
    assert profiles.detect_profile({"RAG_PROFILE": " GPU "}) == "gpu"
    assert profiles.detect_profile({}) == ("gpu" if Path("/dev/nvidiactl").exists() else "cpu")


def test_unknown_cpu_model_set_is_refused_naming_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"RAG_CPU_MODELS='llama': choose one of qwen, qwen-1\.5b, smollm2"):
        _serve_module(monkeypatch, RAG_PROFILE="cpu", RAG_CPU_MODELS="llama")
    assert profiles.cpu_model_set({}) == "qwen"


def test_an_unknown_profile_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="RAG_PROFILE='tpu': choose `cpu` or `gpu`"):
        _serve_module(monkeypatch, RAG_PROFILE="tpu")


def test_importing_the_serve_module_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    _serve_module(monkeypatch, RAG_PROFILE="gpu")
    assert not ray.is_initialized()


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_every_engine_has_a_bounded_queue_sized_from_its_batch_and_chat_has_tools(
    monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    module = _serve_module(monkeypatch, RAG_PROFILE=profile)
    for role, cfg in module.CONFIGS.items():
        batch = cfg.engine_kwargs["max_num_seqs"]
        deployment = cfg.deployment_config
        assert deployment["max_ongoing_requests"] == batch, role
        assert deployment["max_queued_requests"] == batch, role
        assert deployment["backpressure_config"]["status_code"] == 429, role
        assert deployment["backpressure_config"]["retry_after_s"] > 0, role
        # /tokenize works through our engine class in both profiles (rag/stack/engine_hooks.py).
        assert cfg.runtime_env["env_vars"]["RAYLLM_VLLM_ENGINE_CLS"].startswith("rag.stack.engine_hooks."), (
            role
        )
    chat = module.CONFIGS["chat"].engine_kwargs
    assert chat["enable_auto_tool_choice"] is True
    assert chat["tool_call_parser"] == {"cpu": "hermes_json", "gpu": "hermes"}[profile]
    facts = profiles.role_facts(profile)
    assert facts["guard"]["guard_format"] == {"cpu": "score", "gpu": "qwen3guard"}[profile]


@pytest.mark.parametrize(
    ("cores", "given", "every", "guard", "overlap"),
    [(2, "", 2, 1, False), (8, "", 8, 4, False), (2, "1", 1, 1, True), (1, "", 1, 1, False)],
)
def test_cpu_chat_gets_every_core_and_overlaps_the_reranker_only_when_they_fit(
    monkeypatch: pytest.MonkeyPatch, cores: int, given: str, every: int, guard: int, overlap: bool
) -> None:
    module = _serve_module(monkeypatch, RAG_PROFILE="cpu", RAG_ENGINE_THREADS=given)
    monkeypatch.setattr(module.os, "sched_getaffinity", lambda pid: set(range(cores)))
    threads = module.cpu_threads()
    # chat, embed and score run one after another in an answer (and embed alone while
    # indexing): each takes every core; the guard, beside the chat, half
    assert (threads["chat"], threads["embed"], threads["score"], threads["guard"]) == (
        every,
        every,
        every,
        guard,
    )
    # An answer's prefill runs alone (the CPU reranker is not called): the chat takes all.
    assert module.overlap_stages("cpu") is overlap and module.overlap_stages("gpu") is True
    envs = {
        role: cfg.runtime_env["env_vars"]["OMP_NUM_THREADS"] for role, cfg in module.configs("cpu").items()
    }
    assert envs == {role: str(n) for role, n in threads.items()}


@pytest.mark.parametrize(
    ("guard", "fmt"),
    [("Qwen/Qwen3Guard-Gen-4B", "qwen3guard"), ("meta-llama/Llama-Guard-3-1B", "llamaguard3")],
)
def test_the_gpu_guards_reply_format_follows_its_model(
    monkeypatch: pytest.MonkeyPatch, guard: str, fmt: str
) -> None:
    module = _serve_module(monkeypatch, RAG_PROFILE="gpu")
    cfg = module.CONFIGS["guard"].model_copy(deep=True)
    cfg.model_loading_config.model_source = guard
    assert module.gpu_guard_format(cfg) == fmt  # what /v1/models tells clients (rag/served.py)


def test_the_settings_literals_are_the_modes_the_code_knows() -> None:
    """Settings checks RAG_RETRIEVAL, RAG_RERANK_MODE and RAG_GUARD_FORMAT against
    Literals of its own (no import of the query path): they must stay the code's lists."""
    from typing import get_args

    from rag.guard import GUARD_FORMATS
    from rag.rerank import RERANK_MODES
    from rag.retrieve import MODES
    from rag.settings import GuardFormat, RerankMode, Retrieval

    assert get_args(Retrieval) == MODES
    assert get_args(RerankMode) == ("", *RERANK_MODES) and get_args(GuardFormat) == ("", *GUARD_FORMATS)


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"RAG_TOP_K": "many"}, "RAG_TOP_K='many' is not a whole number"),
        ({"RAG_TOP_K": "0"}, "RAG_TOP_K='0' must be above 0"),
        ({"RAG_RETRIEVAL": "sparse"}, "RAG_RETRIEVAL='sparse': choose one of 'dense', 'lexical' or 'fused'"),
        ({"RAG_RERANK_MODE": "sort"}, "RAG_RERANK_MODE='sort': choose one of unset, 'order', 'blend'"),
        ({"RAG_GUARD_THRESHOLD": "1.5"}, "RAG_GUARD_INPUT_THRESHOLD='1.5' must be at most 1.0"),
        ({"RAG_OVERLAP": "maybe"}, "RAG_OVERLAP='maybe': use 1 or 0 (or leave it unset)"),
        ({"RAG_TIMEOUT_S": "-3"}, "RAG_TIMEOUT_S='-3' must be above 0"),
        ({"RAG_TOP_K": "x", "RAG_SOURCES": "y"}, "RAG_TOP_K='x' is not a whole number; RAG_SOURCES='y'"),
    ],
)
def test_a_wrong_setting_names_its_variable_the_value_and_what_is_allowed(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: str
) -> None:
    from rag.errors import ConfigError
    from rag.settings import Settings

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    assert said in str(info.value)


def test_settings_read_from_text_and_changed_are_checked_the_same_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    from pydantic import ValidationError

    from rag.settings import Settings

    monkeypatch.setenv("RAG_TOP_K", "12")
    monkeypatch.setenv("RAG_GUARD_STRICT", "yes")
    s = Settings.from_env()
    assert (s.top_k, s.guard_strict, s.overlap, s.min_score) == (12, True, None, None)
    with pytest.raises(ValidationError):
        dataclasses.replace(s, top_k=-1)
