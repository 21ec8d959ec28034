"""The profiles' facts, in one home: roles, which weights back each role on CPU, where
prepared weights live, which profile this machine runs, and what each role tells clients.

Read by the serve module (scripts/serve_module.py, which builds the four configs
from them), by `rag prepare` (which folders to build), by the client's settings
and by the CLI. Each is data or a small function of the environment:

- RAG_PROFILE: `cpu` or `gpu` (unset: `gpu` where an NVIDIA device is visible).
- RAG_MODELS_DIR: where `rag prepare` puts the CPU weights (unset: the user's cache).
- RAG_CPU_MODELS: which CPU model set (`qwen`, the default, `qwen-1.5b` or `smollm2`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rag.stack.heads import GUARD_HEADS, RERANKERS

__all__ = [
    "CPU_MODELS_ENV",
    "CPU_MODEL_SETS",
    "DEFAULT_CPU_MODEL_SET",
    "GUARD_HEADED",
    "PROFILES",
    "ROLES",
    "ROLE_FACTS",
    "cpu_model_set",
    "default_models_dir",
    "detect_profile",
    "role_facts",
]

# The served model ids are the roles themselves, so a client never changes when the
# profile (and with it the weights behind each role) does.
ROLES: tuple[str, ...] = ("chat", "guard", "embed", "score")
PROFILES: tuple[str, ...] = ("cpu", "gpu")

CPU_MODELS_ENV = "RAG_CPU_MODELS"
DEFAULT_CPU_MODEL_SET = "qwen"
# Which prepared folder (rag/stack/prepare.py builds them) serves each role, per CPU
# model set. Score is the embed engine's MiniLM with a trained relevance head (a
# cross-encoder, rag/stack/heads.py); the Qwen guard reads the chat weights through a
# trained head; SmolLM2 has no head, its guard is the LM as a two-token classifier.
CPU_MODEL_SETS: dict[str, dict[str, str]] = {
    "qwen": {
        "chat": "qwen2.5-coder-0.5b-instruct",
        "guard": "qwen2.5-coder-0.5b-guard",
        "score": "minilm-reranker",
        "embed": "all-minilm-l6-v2",
    },
    # Opt-in where the CPU computes in bf16: better answers, 1.7x the seconds; the guard's
    # head on the 1.5B ranks better (ROC AUC 0.98 against 0.95), about 3x the seconds per check.
    "qwen-1.5b": {
        "chat": "qwen2.5-coder-1.5b-instruct",
        "guard": "qwen2.5-coder-1.5b-guard",
        "score": "minilm-reranker",
        "embed": "all-minilm-l6-v2",
    },
    "smollm2": {
        "chat": "smollm2-135m-instruct",
        "guard": "smollm2-135m-instruct",
        "score": "minilm-reranker",
        "embed": "all-minilm-l6-v2",
    },
}
# The guard folders that carry a trained head (rag/stack/guard_head/): their config.json
# names a sequence classifier and the head reads the prompt of guard_head.jinja. Any
# other guard is its LM as a two-token classifier asked whether it would refuse.
GUARD_HEADED = frozenset(GUARD_HEADS)

# What a client may ask the server about each role, served in /v1/models as each
# model's metadata["rag"] (the ingress adds the request limits): the `rag` client reads
# the guard's reply format and the reranker's kind from there, so it works the same
# against a stack on another machine.
# The serve module adds chat's `overlap_stages` (may a client run the chat beside the
# reranker?), which on CPU follows from the engines' threads (serve_module.cpu_threads).
ROLE_FACTS: dict[str, dict[str, dict[str, Any]]] = {
    "gpu": {
        "chat": {"tools": "hermes"},
        "guard": {"guard_format": "qwen3guard"},  # Qwen3Guard-Gen answers through chat
        "embed": {},
        "score": {"reranker": "cross-encoder"},  # a trained reranker: its order is trusted
    },
    "cpu": {
        "chat": {"tools": "hermes_json"},
        "guard": {"guard_format": "score"},  # the chat LM as a P(unsafe) classifier on /v1/score
        "embed": {},
        # Trained here (scripts/train_reranker.py): smaller and faster than the yes/no LLM
        # it replaced, but its order is still worse than fused retrieval (rag/served.py).
        "score": {"reranker": "small-cross-encoder"},
    },
}


def detect_profile(env: Mapping[str, str] = os.environ) -> str:
    """RAG_PROFILE if set, else `gpu` where an NVIDIA device is visible, else `cpu`."""
    given = env.get("RAG_PROFILE", "").strip().lower()
    if given:
        return given
    return "gpu" if Path("/dev/nvidiactl").exists() else "cpu"


def default_models_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where prepared CPU-profile weights live (RAG_MODELS_DIR overrides)."""
    given = env.get("RAG_MODELS_DIR")
    if given:
        return Path(given).expanduser()
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rag-stack" / "models"


def cpu_model_set(env: Mapping[str, str] = os.environ) -> str:
    """The CPU model set RAG_CPU_MODELS names (default `qwen`), checked."""
    name = env.get(CPU_MODELS_ENV, "").strip() or DEFAULT_CPU_MODEL_SET
    if name not in CPU_MODEL_SETS:
        raise ConfigError(f"{CPU_MODELS_ENV}={name!r}: choose one of {', '.join(CPU_MODEL_SETS)}")
    return name


def role_facts(profile: str, model_set: str | None = None) -> dict[str, dict[str, Any]]:
    """ROLE_FACTS for `profile`, with what the CPU's trained heads were calibrated for:
    the guard head's thresholds (rag/stack/guard_head/*.json), at which the client blocks,
    and the reranker's floor (rag/stack/trained/*.json), under which a passage cannot be
    a source, unless the client is told otherwise."""
    facts: dict[str, dict[str, Any]] = {role: dict(f) for role, f in ROLE_FACTS[profile].items()}
    if profile == "cpu":
        guard = CPU_MODEL_SETS[model_set or cpu_model_set()]["guard"]
        if guard in GUARD_HEADED:
            card = json.loads(GUARD_HEADS[guard].card.read_text())
            facts["guard"]["guard_thresholds"] = card["thresholds"]
            if "rule" in card:
                facts["guard"]["guard_rule"] = card["rule"]  # how they were chosen, severity included
        score = CPU_MODEL_SETS[model_set or cpu_model_set()]["score"]
        if score in RERANKERS:
            card = json.loads(RERANKERS[score].card.read_text())
            facts["score"] |= {
                "floor": card["floor"]["threshold"],
                "max_tokens_per_doc": card["max_tokens_per_doc"],  # each passage read as trained
                "model": card["model"],
            }
    return facts
