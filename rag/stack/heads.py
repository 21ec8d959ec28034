"""Trained heads on prepared weights, and how `rag prepare` builds their folders.

Two kinds, each a small file committed beside this module with a card saying what it
was trained on and what it scored:
- a guard head (guard_head/, scripts/train_guard_head.py): a classifier on a chat
  model's hidden state; its folder links the model's weights and adds the head, so
  vLLM loads it as a sequence classifier;
- a reranker adapter (trained/, scripts/train_reranker.py): LoRA factors, pooler and
  classifier for the embed engine's MiniLM; its folder holds the merged cross-encoder
  (BertForSequenceClassification, one label), which vLLM serves on /v1/score.

Facts flow one way: profiles.py reads the cards here; prepare.py builds what the
profile names; nothing here imports either.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rag.errors import ModelPrepError
from rag.stack.manifest import FORMAT_VERSION, MANIFEST, sha256_file

__all__ = [
    "GUARD_HEADS",
    "RERANKERS",
    "GuardHead",
    "RerankerAdapter",
    "merge_reranker",
    "prepare_head",
    "prepare_reranker",
]

Log = Callable[[str], None]
HERE = Path(__file__).parent


@dataclass(frozen=True)
class GuardHead:
    """A guard made of a prepared chat model and a classifier head trained on its hidden
    states (scripts/train_guard_head.py): the folder links the model's weights and adds
    the head, so vLLM loads it as a sequence classifier."""

    name: str  # folder name under the models dir
    base: str  # the prepared model whose weights it reads
    architecture: str  # vLLM's sequence-classification class for the base

    @property
    def head(self) -> Path:
        return HERE / "guard_head" / f"{self.base}.safetensors"

    @property
    def card(self) -> Path:
        """What the head was trained on, its cross-validated rates and thresholds."""
        return self.head.with_suffix(".json")


GUARD_HEADS: dict[str, GuardHead] = {
    "qwen2.5-coder-0.5b-guard": GuardHead(
        "qwen2.5-coder-0.5b-guard", "qwen2.5-coder-0.5b-instruct", "Qwen2ForSequenceClassification"
    ),
    # The qwen-1.5b set's: the same cases and template, on the 1.5B's hidden state.
    "qwen2.5-coder-1.5b-guard": GuardHead(
        "qwen2.5-coder-1.5b-guard", "qwen2.5-coder-1.5b-instruct", "Qwen2ForSequenceClassification"
    ),
}


@dataclass(frozen=True)
class RerankerAdapter:
    """A cross-encoder made of a prepared encoder and an adapter trained for it
    (scripts/train_reranker.py): LoRA factors for each encoder Linear, pooler, classifier."""

    name: str  # folder name under the models dir
    base: str  # the prepared encoder whose weights it starts from

    @property
    def adapter(self) -> Path:
        return HERE / "trained" / f"{self.name}.safetensors"

    @property
    def card(self) -> Path:
        """What it was trained on, how long, and what it scored."""
        return self.adapter.with_suffix(".json")


RERANKERS: dict[str, RerankerAdapter] = {
    "minilm-reranker": RerankerAdapter("minilm-reranker", "all-minilm-l6-v2"),
}


def _manifest(name: str, base_name: str, base: Path, trained: Path) -> dict[str, object]:
    """What a folder built from `base` and a trained file records: rebuilt when either changes."""
    return {
        "name": name,
        "format": FORMAT_VERSION,
        "base": base_name,
        "base_manifest_sha256": sha256_file(base / MANIFEST),
        "head_sha256": sha256_file(trained),
    }


def _current(final: Path, want: dict[str, object], files: tuple[str, ...]) -> bool:
    try:
        return json.loads((final / MANIFEST).read_text()) == want and all((final / f).exists() for f in files)
    except (OSError, json.JSONDecodeError):
        return False


def _replace(final: Path, out: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    out.rename(final)


def prepare_head(spec: GuardHead, base: Path, models_dir: Path, log: Log) -> Path:
    """`models_dir/spec.name`: the base model's files linked, its config a classifier's,
    and the trained head beside them. Rebuilt when the head or the base changes."""
    final = models_dir / spec.name
    if not spec.head.is_file():
        raise ModelPrepError(f"the guard head {spec.head} is missing; reinstall the package or run "
                             "scripts/train_guard_head.py")  # fmt: skip
    want = _manifest(spec.name, spec.base, base, spec.head)
    if _current(final, want, ("config.json", "model.safetensors", "score.safetensors")):
        log(f"{spec.name}: ready ({final})")
        return final
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}.", dir=models_dir) as td:
        out = Path(td) / "out"
        out.mkdir()
        for f in sorted(base.iterdir()):
            if f.is_file() and f.name not in (MANIFEST, "config.json"):
                (out / f.name).symlink_to(Path("..") / spec.base / f.name)
        config = json.loads((base / "config.json").read_text())
        config |= {
            "architectures": [spec.architecture],
            "id2label": {"0": "unsafe"},
            "label2id": {"unsafe": 0},
        }
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        shutil.copyfile(spec.head, out / "score.safetensors")
        (out / MANIFEST).write_text(json.dumps(want, indent=2) + "\n")
        _replace(final, out)
    log(f"{spec.name}: ready, the head {spec.head.name} on {spec.base} ({final})")
    return final


def merge_reranker(base: Path, adapter: Path, out: Path) -> None:
    """`out`: the encoder in `base` as a one-label BertForSequenceClassification, each
    adapted Linear's weight plus B @ A x alpha / rank (in float32), pooler and classifier
    from the adapter file, the tokenizer copied. Same files in, same weights out."""
    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    # Its load report lists the head as "missing": it is set from the adapter below.
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    with safe_open(str(adapter), "pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118 - safe_open has no iterator
    scale = float(meta.get("alpha", 1)) / float(meta.get("rank", 1))
    model = BertForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    state = model.state_dict()
    plain = {k: v for k, v in tensors.items() if "lora_" not in k}
    for key in [k for k in tensors if k.endswith(".lora_a")]:
        target = key.removesuffix(".lora_a") + ".weight"
        b = tensors[key.removesuffix("_a") + "_b"]
        if target not in state:
            raise ModelPrepError(f"{adapter.name}: {target} is not a weight of {base.name}; retrain it")
        plain[target] = state[target] + (b @ tensors[key]) * scale
    missing = [k for k in plain if k not in state]
    if missing:
        raise ModelPrepError(f"{adapter.name}: {missing[:3]} are not weights of {base.name}; retrain it")
    state.update(plain)
    model.load_state_dict(state)
    model.config.id2label, model.config.label2id = {0: "relevant"}, {"relevant": 0}
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)


def prepare_reranker(spec: RerankerAdapter, base: Path, models_dir: Path, log: Log) -> Path:
    """`models_dir/spec.name`: the merged cross-encoder. Rebuilt when the adapter or the
    base changes (a few seconds)."""
    final = models_dir / spec.name
    if not spec.adapter.is_file():
        raise ModelPrepError(f"the reranker adapter {spec.adapter} is missing; reinstall the package "
                             "or run scripts/train_reranker.py")  # fmt: skip
    want = _manifest(spec.name, spec.base, base, spec.adapter)
    if _current(final, want, ("config.json", "model.safetensors", "tokenizer.json")):
        log(f"{spec.name}: ready ({final})")
        return final
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}.", dir=models_dir) as td:
        out = Path(td) / "out"
        merge_reranker(base, spec.adapter, out)
        (out / MANIFEST).write_text(json.dumps(want, indent=2) + "\n")
        _replace(final, out)
    took = time.monotonic() - start
    log(f"{spec.name}: ready in {took:.0f} s, {spec.adapter.name} merged into {spec.base} ({final})")
    return final
