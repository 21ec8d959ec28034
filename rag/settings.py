"""Every setting in one place: an env var, a default, and what it is for.

`scripts/serve_module.py` reads the same env vars with the same defaults (it
cannot import this package on a Ray worker that lacks it); `tests/test_settings.py`
keeps the two in step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CPU_MODEL_SETS",
    "PROFILES",
    "ROLES",
    "Settings",
    "default_models_dir",
    "detect_profile",
]

# The served model ids are the roles themselves, so a client never changes when
# the profile (and with it the weights behind each role) does.
ROLES: tuple[str, ...] = ("chat", "guard", "embed", "score")
PROFILES: tuple[str, ...] = ("cpu", "gpu")
CPU_MODEL_SETS: tuple[str, ...] = ("qwen", "smollm2")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def default_models_dir() -> Path:
    """Where prepared CPU-profile weights live (RAG_MODELS_DIR overrides)."""
    env = os.environ.get("RAG_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rag-stack" / "models"


def detect_profile() -> str:
    """RAG_PROFILE if set, else `gpu` where an NVIDIA device is visible, else `cpu`."""
    env = os.environ.get("RAG_PROFILE", "").strip().lower()
    if env:
        return env
    return "gpu" if Path("/dev/nvidiactl").exists() else "cpu"


@dataclass(frozen=True)
class Settings:
    """Client-side settings, each read from its env var."""

    base_url: str
    api_key: str
    chat_model: str
    guard_model: str
    embed_model: str
    score_model: str
    timeout_s: float

    @classmethod
    def from_env(cls) -> Settings:
        """Read every setting from the environment, falling back to the defaults."""
        return cls(
            base_url=os.environ.get("RAG_BASE_URL", f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/v1").rstrip("/"),
            # Ray Serve's ingress checks no key by default; the OpenAI client insists on one.
            api_key=os.environ.get("RAG_API_KEY", "EMPTY"),
            chat_model=os.environ.get("RAG_CHAT_MODEL", "chat"),
            guard_model=os.environ.get("RAG_GUARD_MODEL", "guard"),
            embed_model=os.environ.get("RAG_EMBED_MODEL", "embed"),
            score_model=os.environ.get("RAG_SCORE_MODEL", "score"),
            timeout_s=float(os.environ.get("RAG_TIMEOUT_S", "120")),
        )
