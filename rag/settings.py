"""Every client setting in one place: an env var, a default, and what it is for.

The profile facts the serving half reads (roles, model sets, the models folder,
profile detection) live in rag/stack/profiles.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rag.errors import ConfigError
from rag.stack.auth import keys_from_env

__all__ = ["Settings"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_METRICS_PORT = 8080  # Ray's Prometheus endpoint, as Ray's own docs use it
# Attribution's bar (rag/attribute.py), calibrated on hand-labeled answer sentences
# (eval/attribution-*.jsonl; the README gives the measurements).
SUPPORT_THRESHOLD = 0.72
# P(unsafe) at or above which a score-format guard blocks, per stage, where neither
# the environment nor the server names one: the untrained two-token guard's (SmolLM2).
# A trained head publishes its own, chosen on eval/guard (rag/stack/guard_head/*.json).
GUARD_THRESHOLDS = {"input": 0.86, "output": 0.86}
# The rerank score under which a passage cannot be a source, where neither the environment
# nor the server names one. A trained reranker publishes its calibrated floor
# (rag/stack/trained/*.json).
MIN_SCORE = 0.05


@dataclass(frozen=True)
class Settings:
    """Client-side settings, each read from its env var."""

    base_url: str
    api_key: str
    chat_model: str
    guard_model: str
    embed_model: str
    score_model: str
    timeout_s: float  # read timeout: the longest silence from one engine
    retry_deadline_s: float  # how long a failing call that is safe to repeat is retried
    index_dir: Path
    retrieval: str  # dense | lexical | fused
    top_k: int  # candidates retrieved
    rerank_n: int  # of those, how many go through /v1/score
    rerank_mode: str  # order | blend | floor | off, or "" (the server's reranker decides)
    sources: int  # of those, how many the answer may cite
    source_chars: int  # each source cut to this many characters around the question (0: whole)
    # Rerank floor: below it the corpus "does not cover" the question; None: the floor the
    # server's reranker was calibrated for (rag/served.py), else MIN_SCORE.
    min_score: float | None
    guard_format: str  # score (CPU) | qwen3guard (GPU), or "" (the server says)
    # P(unsafe) at or above which the score-format guard blocks a question / an answer;
    # None: the threshold the server's guard was calibrated for (rag/served.py).
    guard_input_threshold: float | None
    guard_output_threshold: float | None
    guard_strict: bool  # qwen3guard: block "Controversial" too
    max_tokens: int
    support_threshold: float  # attribution: support at or above which a source backs a sentence
    # In floor mode, run the chat beside the reranker; None: as the server says
    # (`overlap_stages`: whether its chat and reranker fit the cores together).
    overlap: bool | None = None

    @property
    def floor(self) -> float:
        """The rerank floor in force: RAG_MIN_SCORE, else the server's, else MIN_SCORE."""
        return MIN_SCORE if self.min_score is None else self.min_score

    def guard_threshold(self, stage: str) -> float:
        t = self.guard_input_threshold if stage == "input" else self.guard_output_threshold
        return GUARD_THRESHOLDS[stage] if t is None else t

    @classmethod
    def from_env(cls) -> Settings:
        """Read every setting from the environment, falling back to the defaults."""
        return cls(
            base_url=os.environ.get("RAG_BASE_URL", f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/v1").rstrip("/"),
            # The first key RAG_API_KEY / RAG_API_KEY_FILE name, the ones `rag serve` takes;
            # with none the edge is open, and the OpenAI client still insists on a string.
            api_key=next(iter(keys_from_env()), "EMPTY"),
            chat_model=os.environ.get("RAG_CHAT_MODEL", "chat"),
            guard_model=os.environ.get("RAG_GUARD_MODEL", "guard"),
            embed_model=os.environ.get("RAG_EMBED_MODEL", "embed"),
            score_model=os.environ.get("RAG_SCORE_MODEL", "score"),
            timeout_s=_float("RAG_TIMEOUT_S", 300.0),
            # Long enough for Serve to replace a dead engine on a 2-core AVX2 machine.
            retry_deadline_s=_float("RAG_RETRY_DEADLINE_S", 600.0),
            index_dir=Path(os.environ.get("RAG_INDEX_DIR", ".rag/index")).expanduser(),
            retrieval=os.environ.get("RAG_RETRIEVAL", "fused"),
            top_k=_int("RAG_TOP_K", 20),
            rerank_n=_int("RAG_RERANK_N", 8),
            # Empty: ask the server what its reranker is (rag/served.py). A trained one
            # orders the candidates; the CPU one (MiniLM trained here) ranks worse than
            # fused retrieval on manuals it never saw, so an answer does not call it (`off`).
            rerank_mode=os.environ.get("RAG_RERANK_MODE", "").strip(),
            sources=_int("RAG_SOURCES", 3),
            # The sentences around each source's best match for the question (rag/focus.py);
            # 0 keeps whole chunks. Opt-in: 500 showed the first word 30 % sooner on the Git
            # and bash manuals with their keywords kept, but cost the dev set's answers
            # citations (README, "Each source is cut ...").
            source_chars=_int("RAG_SOURCE_CHARS", 0),
            min_score=_optional_float("RAG_MIN_SCORE"),
            # Empty: ask the server which format its guard speaks (rag/served.py).
            guard_format=os.environ.get("RAG_GUARD_FORMAT", "").strip(),
            # RAG_GUARD_THRESHOLD sets both stages; the stage's own variable wins; unset,
            # the server's guard says (rag/served.py).
            guard_input_threshold=_optional_float("RAG_GUARD_INPUT_THRESHOLD", "RAG_GUARD_THRESHOLD"),
            guard_output_threshold=_optional_float("RAG_GUARD_OUTPUT_THRESHOLD", "RAG_GUARD_THRESHOLD"),
            guard_strict=os.environ.get("RAG_GUARD_STRICT", "0").lower() in ("1", "true", "yes"),
            max_tokens=_int("RAG_MAX_TOKENS", 384),
            support_threshold=_float("RAG_SUPPORT_THRESHOLD", SUPPORT_THRESHOLD),
            overlap=_optional_bool("RAG_OVERLAP"),
        )


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def _optional_bool(name: str) -> bool | None:
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r}: use 1 or 0 (or leave it unset: the server decides)")


def _optional_float(*names: str) -> float | None:
    """The first of `names` that is set, as a number; None if none is."""
    for name in names:
        if os.environ.get(name, "") != "":
            return _float(name, 0.0)
    return None


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
