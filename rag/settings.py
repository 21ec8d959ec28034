"""Every client setting in one place: an env var, a default, and what it is for.

The profile facts the serving half reads (roles, model sets, the models folder,
profile detection) live in rag/stack/profiles.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass

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


Retrieval = Literal["dense", "lexical", "fused"]  # rag/retrieve.py MODES
RerankMode = Literal["", "order", "blend", "floor", "off"]  # "": the server says (rag/rerank.py)
GuardFormat = Literal["", "score", "qwen3guard", "llamaguard3"]  # "": the server says (rag/guard.py)
Share = Annotated[float, Field(ge=0.0, le=1.0)]

# The env var each setting is read from, for errors that name what the user set.
ENV_OF = {
    "base_url": "RAG_BASE_URL", "api_key": "RAG_API_KEY", "chat_model": "RAG_CHAT_MODEL",
    "guard_model": "RAG_GUARD_MODEL", "embed_model": "RAG_EMBED_MODEL", "score_model": "RAG_SCORE_MODEL",
    "timeout_s": "RAG_TIMEOUT_S", "retry_deadline_s": "RAG_RETRY_DEADLINE_S", "index_dir": "RAG_INDEX_DIR",
    "retrieval": "RAG_RETRIEVAL", "top_k": "RAG_TOP_K", "rerank_n": "RAG_RERANK_N",
    "rerank_mode": "RAG_RERANK_MODE", "sources": "RAG_SOURCES", "source_chars": "RAG_SOURCE_CHARS",
    "min_score": "RAG_MIN_SCORE", "guard_format": "RAG_GUARD_FORMAT",
    "guard_input_threshold": "RAG_GUARD_INPUT_THRESHOLD",
    "guard_output_threshold": "RAG_GUARD_OUTPUT_THRESHOLD",
    "guard_strict": "RAG_GUARD_STRICT", "max_tokens": "RAG_MAX_TOKENS",
    "support_threshold": "RAG_SUPPORT_THRESHOLD", "overlap": "RAG_OVERLAP",
}  # fmt: skip


@pydantic_dataclass(frozen=True)
class Settings:
    """Client-side settings, each read from its env var and checked by pydantic: a wrong
    value is a ConfigError naming the variable, the value and what is allowed
    (`Settings.checked`; `dataclasses.replace` checks the same way)."""

    base_url: str
    api_key: str
    chat_model: str
    guard_model: str
    embed_model: str
    score_model: str
    timeout_s: PositiveFloat  # read timeout: the longest silence from one engine
    retry_deadline_s: NonNegativeFloat  # how long a failing call that is safe to repeat is retried
    index_dir: Path
    retrieval: Retrieval
    top_k: PositiveInt  # candidates retrieved
    rerank_n: NonNegativeInt  # of those, how many go through /v1/score
    rerank_mode: RerankMode  # or "" (the server's reranker decides)
    sources: PositiveInt  # of those, how many the answer may cite
    source_chars: NonNegativeInt  # each source cut to this many characters around the question (0: whole)
    # Rerank floor: below it the corpus "does not cover" the question; None: the floor the
    # server's reranker was calibrated for (rag/served.py), else MIN_SCORE.
    min_score: float | None
    guard_format: GuardFormat  # or "" (the server says)
    # P(unsafe) at or above which the score-format guard blocks a question / an answer;
    # None: the threshold the server's guard was calibrated for (rag/served.py).
    guard_input_threshold: Share | None
    guard_output_threshold: Share | None
    guard_strict: bool  # qwen3guard: block "Controversial" too
    max_tokens: PositiveInt
    # Attribution: support at or above which a source backs a sentence; above 1, none ever does.
    support_threshold: NonNegativeFloat
    # In floor mode, run the chat beside the reranker; None: as the server says
    # (`overlap_stages`: whether its chat and reranker fit the cores together).
    overlap: bool | None = None

    @classmethod
    def checked(cls, **values: Any) -> Settings:
        """Settings from `values` (strings from the environment are converted); a wrong
        one is a ConfigError naming its env var, the value and what is allowed."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError("; ".join(_explain(e) for e in exc.errors())) from None

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
        return cls.checked(
            base_url=os.environ.get("RAG_BASE_URL", f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/v1").rstrip("/"),
            # The first key RAG_API_KEY / RAG_API_KEY_FILE name, the ones `rag serve` takes;
            # with none the edge is open, and the OpenAI client still insists on a string.
            api_key=next(iter(keys_from_env()), "EMPTY"),
            chat_model=os.environ.get("RAG_CHAT_MODEL", "chat"),
            guard_model=os.environ.get("RAG_GUARD_MODEL", "guard"),
            embed_model=os.environ.get("RAG_EMBED_MODEL", "embed"),
            score_model=os.environ.get("RAG_SCORE_MODEL", "score"),
            timeout_s=_env("RAG_TIMEOUT_S", 300.0),
            # Long enough for Serve to replace a dead engine on a 2-core AVX2 machine.
            retry_deadline_s=_env("RAG_RETRY_DEADLINE_S", 600.0),
            index_dir=Path(os.environ.get("RAG_INDEX_DIR", ".rag/index")).expanduser(),
            retrieval=os.environ.get("RAG_RETRIEVAL", "fused").strip(),
            top_k=_env("RAG_TOP_K", 20),
            rerank_n=_env("RAG_RERANK_N", 8),
            # Empty: ask the server what its reranker is (rag/served.py). A trained one
            # orders the candidates; the CPU one (MiniLM trained here) ranks worse than
            # fused retrieval on manuals it never saw, so an answer does not call it (`off`).
            rerank_mode=os.environ.get("RAG_RERANK_MODE", "").strip(),
            sources=_env("RAG_SOURCES", 3),
            # The sentences around each source's best match for the question (rag/focus.py);
            # 0 keeps whole chunks. Opt-in: 500 showed the first word 30 % sooner on the Git
            # and bash manuals with their keywords kept, but cost the dev set's answers
            # citations (README, "Each source is cut ...").
            source_chars=_env("RAG_SOURCE_CHARS", 0),
            min_score=_optional("RAG_MIN_SCORE"),
            # Empty: ask the server which format its guard speaks (rag/served.py).
            guard_format=os.environ.get("RAG_GUARD_FORMAT", "").strip(),
            # RAG_GUARD_THRESHOLD sets both stages; the stage's own variable wins; unset,
            # the server's guard says (rag/served.py).
            guard_input_threshold=_optional("RAG_GUARD_INPUT_THRESHOLD", "RAG_GUARD_THRESHOLD"),
            guard_output_threshold=_optional("RAG_GUARD_OUTPUT_THRESHOLD", "RAG_GUARD_THRESHOLD"),
            guard_strict=_env("RAG_GUARD_STRICT", False),
            max_tokens=_env("RAG_MAX_TOKENS", 384),
            support_threshold=_env("RAG_SUPPORT_THRESHOLD", SUPPORT_THRESHOLD),
            overlap=_optional("RAG_OVERLAP"),
        )


def _env(name: str, default: Any) -> Any:
    """The variable's text, or `default` when unset or empty (pydantic converts and checks it)."""
    raw = os.environ.get(name, "").strip()
    return raw if raw else default


def _optional(*names: str) -> str | None:
    """The first of `names` that is set, as text; None if none is (the server decides)."""
    return next((os.environ[n].strip() for n in names if os.environ.get(n, "").strip()), None)


def _explain(err: Any) -> str:
    """One pydantic error as `RAG_X='bad' ...`, saying what is allowed instead."""
    field = str(err["loc"][0]) if err["loc"] else ""
    name, found, ctx = ENV_OF.get(field, field), err.get("input"), err.get("ctx", {})
    said = {
        "literal_error": f": choose one of {str(ctx.get('expected', '')).replace(chr(39) * 2, 'unset')}",
        "int_parsing": " is not a whole number",
        "int_from_float": " is not a whole number",
        "float_parsing": " is not a number",
        "bool_parsing": ": use 1 or 0 (or leave it unset)",
        "greater_than": f" must be above {ctx.get('gt')}",
        "greater_than_equal": f" must be at least {ctx.get('ge')}",
        "less_than_equal": f" must be at most {ctx.get('le')}",
    }
    return f"{name}={found!r}" + said.get(err["type"], f": {err['msg']}")
