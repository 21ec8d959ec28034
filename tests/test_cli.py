"""The CLI's contract: exit 0 with results on stdout, exit 1 with one readable line, exit 2 for misuse."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag.cli import main
from rag.stack.prepare import MANIFEST
from rag.stack.profiles import CPU_MODEL_SETS
from tests.conftest import ROOT, free_port


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(ROOT)
    return CliRunner()


@pytest.fixture
def fake_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A models dir whose folders look prepared but hold no weights."""
    models = tmp_path / "models"
    for name in set(CPU_MODEL_SETS["qwen"].values()):
        (models / name).mkdir(parents=True)
        (models / name / MANIFEST).write_text("{}")
    monkeypatch.setenv("RAG_MODELS_DIR", str(models))
    monkeypatch.setenv("RAG_CPU_MODELS", "qwen")
    return models


def one_line_error(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    assert lines[0].startswith("Error: ")
    return lines[0]


def test_help_teaches_with_examples(runner: CliRunner) -> None:
    result = runner.invoke(main, ["-h"])
    assert result.exit_code == 0
    for command in ("prepare", "serve", "check"):
        assert f"rag {command}" in result.output
    # the first-answer tutorial, in the order a first-time user runs it
    steps = [result.output.index(f"  rag {command}") for command in ("serve", "index corpus", "ask ")]
    assert steps == sorted(steps)
    serve_help = runner.invoke(main, ["serve", "--help"]).output
    assert "RAG_PORT" in serve_help and "Examples:" in serve_help


def test_check_passes_on_the_shipped_deploy(runner: CliRunner) -> None:
    result = runner.invoke(main, ["check"])
    assert result.exit_code == 0, result.output
    assert "shares sum to 0.84" in result.output
    assert result.output.strip().splitlines()[-1].startswith("ok: inference.yaml")


def test_check_json_reports_the_budget(runner: CliRunner) -> None:
    result = runner.invoke(main, ["check", "--json"])
    report = json.loads(result.output)
    assert report["ok"] is True
    assert [b["role"] for b in report["budget"]] == ["chat", "guard", "embed", "score"]
    assert all(b["fits"] and b["spare_gib"] >= 0 for b in report["budget"])


def test_check_fails_with_findings_and_exit_1(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copytree(ROOT / "scripts" / "templates", tmp_path / "scripts" / "templates")
    module = (ROOT / "scripts" / "serve_module.py").read_text()
    (tmp_path / "scripts" / "serve_module.py").write_text(module.replace('"guard": 0.40', '"guard": 0.60'))
    shutil.copy(ROOT / "inference.yaml", tmp_path / "inference.yaml")
    result = runner.invoke(main, ["check", "-f", str(tmp_path / "inference.yaml")])
    assert result.exit_code == 1
    assert "FAIL [gpu-shares-sum]" in result.output and "1.04" in result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["check", "-f", "nowhere.yaml"], "nowhere.yaml not found"),
        (["serve", "-f", "nowhere.yaml"], "nowhere.yaml not found"),
    ],
)
def test_expected_failures_are_one_line_and_exit_1(runner: CliRunner, args: list[str], needle: str) -> None:
    result = runner.invoke(main, args)
    assert result.exit_code == 1
    assert needle in one_line_error(result.output)


@pytest.mark.parametrize(
    "args",
    [["prepare", "--set", "llama"], ["serve", "--port", "70000"], ["serve", "--profile", "tpu"], ["nope"]],
)
def test_misuse_exits_2(runner: CliRunner, args: list[str]) -> None:
    assert runner.invoke(main, args).exit_code == 2


def test_serve_without_prepared_models_says_to_prepare(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_MODELS_DIR", str(tmp_path / "empty"))
    result = runner.invoke(main, ["serve", "--profile", "cpu"])
    assert result.exit_code == 1
    assert "run `rag prepare" in one_line_error(result.output)


def test_serve_with_an_unknown_cpu_dtype_names_the_choices(
    runner: CliRunner, fake_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_CPU_DTYPE", "fp8")
    result = runner.invoke(main, ["serve", "--profile", "cpu", "--port", str(free_port())])
    assert result.exit_code == 1
    assert "RAG_CPU_DTYPE='fp8': choose one of bfloat16, float32" in one_line_error(result.output)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--host", "0.0.0.0"], "no API key is set: give one with --api-key-file FILE"),
        (["--host", "0.0.0.0", "--api-key", "short"], "too short"),
        (["--api-key-file", "/nonexistent/keys"], "/nonexistent/keys does not exist"),
    ],
    ids=["network-without-key", "short-key", "missing-key-file"],
)
def test_serve_refuses_an_open_network_or_a_bad_key_before_anything_starts(
    runner: CliRunner, fake_models: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], needle: str
) -> None:
    monkeypatch.delenv("RAG_API_KEY", raising=False)
    monkeypatch.delenv("RAG_API_KEY_FILE", raising=False)
    result = runner.invoke(main, ["serve", "--profile", "cpu", "--port", str(free_port()), *args])
    assert result.exit_code == 1
    line = one_line_error(result.output)
    assert needle in line, line
    if "--host" in args and "--api-key" not in args:
        assert "--allow-unauthenticated" in line


def test_serve_on_a_taken_port_says_so(runner: CliRunner, fake_models: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = runner.invoke(main, ["serve", "--profile", "cpu", "--port", str(port)])
    assert result.exit_code == 1
    line = one_line_error(result.output)
    assert f"port {port} on 127.0.0.1 is taken" in line and "--port" in line


def test_serve_onto_a_cluster_where_nothing_listens_says_so_at_once(
    runner: CliRunner, fake_models: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Ray itself would wait minutes for a GCS at an address where nothing answers.
    port = free_port()
    result = runner.invoke(main, ["serve", "--profile", "cpu", "--address", f"127.0.0.1:{port}"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    line = result.output.strip().splitlines()[-1]  # after the boot's first lines, before Ray
    assert f"Error: nothing answers at --address 127.0.0.1:{port}" in line and "ray://HEAD:10001" in line
    # `auto` is the cluster `ray start` left its address for, never any Ray process found running.
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    result = runner.invoke(main, ["serve", "--profile", "cpu", "--address", "auto"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "no Ray cluster was started or joined with `ray start`" in result.output.strip().splitlines()[-1]
    # Where a cluster's proxies run means nothing for the private one.
    result = runner.invoke(main, ["serve", "--profile", "cpu", "--proxies", "head"])
    assert result.exit_code == 1 and "--proxies chooses where a cluster's proxies run" in result.output


def test_serve_on_a_taken_metrics_port_says_which_option_moves_it(
    runner: CliRunner, fake_models: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        args = ["serve", "--profile", "cpu", "--port", str(free_port()), "--metrics-port", str(taken)]
        result = runner.invoke(main, args)
    assert result.exit_code == 1
    line = one_line_error(result.output)
    assert f"port {taken} on 127.0.0.1 is taken" in line and "--metrics-port" in line


@pytest.mark.stack
def test_serve_names_the_engine_that_failed_to_load(fake_models: Path, tmp_path: Path) -> None:
    """A real boot whose weights are missing: one line naming the engine, exit 1, nothing left."""
    env = {**os.environ, "RAG_BOOT_TIMEOUT_S": "400"}
    cmd = ["serve", "--profile", "cpu", "--port", str(free_port()), "--metrics-port", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "rag.cli", *cmd],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, start_new_session=True,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stdout == ""
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "failed to load" in errors[0] and "engine `" in errors[0]
    assert "stopped" in proc.stderr


# ---------------------------------------------------------------- asking commands


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch) -> str:
    """A base URL where nothing listens (a real refused connection)."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("RAG_BASE_URL", url)
    return url


@pytest.mark.parametrize(
    "args",
    [["index", "corpus"], ["ask", "what?"], ["search", "what?"], ["eval", "eval/dev.jsonl"]],
    ids=["index", "ask", "search", "eval"],
)
def test_server_unreachable_is_one_line_naming_rag_serve(
    runner: CliRunner, nowhere: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    from rag.index import build
    from tests.test_index import HashEmbedder

    build([ROOT / "corpus"], tmp_path / "ix", HashEmbedder(), "embed")  # so the index exists
    monkeypatch.setenv("RAG_INDEX_DIR", str(tmp_path / "ix"))
    result = runner.invoke(main, args)
    assert result.exit_code == 1, result.output
    line = one_line_error(result.output)
    assert nowhere in line and "rag serve" in line


@pytest.mark.parametrize(
    "args", [["ask", "what?"], ["search", "what?"], ["chat"]], ids=["ask", "search", "chat"]
)
def test_missing_index_says_to_run_rag_index(runner: CliRunner, tmp_path: Path, args: list[str]) -> None:
    result = runner.invoke(main, [*args, "--index", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "rag index" in one_line_error(result.output)


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["index", "nowhere/"], {}, "no such file or folder: nowhere"),
        (["index", "corpus", "--tokenizer", "nowhere/"], {}, "no tokenizer.json at nowhere"),
        (["index", "corpus"], {"RAG_TOKENIZER": "corpus"}, "pass the embedding model's folder"),
        (["eval", "missing.jsonl"], {}, "missing.jsonl not found"),
        (["ask", "q"], {"RAG_TOP_K": "many"}, "RAG_TOP_K='many' is not a whole number"),
        (["ask", "q"], {"RAG_RERANK_MODE": "best"}, "RAG_RERANK_MODE"),
        (["ask", "q"], {"RAG_GUARD_FORMAT": "llamaguard"}, "RAG_GUARD_FORMAT"),
    ],
)
def test_bad_input_gets_a_message_that_says_what_to_do(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], needle: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    result = runner.invoke(main, args)
    assert result.exit_code == 1
    assert needle in one_line_error(result.output)


def test_bad_qa_file_names_the_line(runner: CliRunner, tmp_path: Path) -> None:
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "ok?", "files": ["a.md"]}\n{"files": ["b.md"]}\n')
    result = runner.invoke(main, ["eval", str(qa)])
    assert result.exit_code == 1
    assert f"{qa}:2" in one_line_error(result.output)


def test_overlap_not_below_chunk_size_is_misuse(runner: CliRunner) -> None:
    assert runner.invoke(main, ["index", "corpus", "--max-tokens", "64", "--overlap", "64"]).exit_code == 2


def test_index_on_an_unreachable_ray_cluster_fails_at_once(runner: CliRunner) -> None:
    port = free_port()  # nothing listens there
    result = runner.invoke(main, ["index", "corpus", "--ray", f"ray://127.0.0.1:{port}"])
    assert result.exit_code == 1
    line = one_line_error(result.output)
    assert f"could not reach the Ray cluster at 'ray://127.0.0.1:{port}'" in line and "--ray" in line


class _Facts:
    def __init__(self, source: str | None) -> None:
        self.source = source

    def facts(self) -> dict[str, dict[str, str]]:
        return {"embed": {"source": self.source}} if self.source else {"embed": {}}


def test_index_counts_with_the_tokenizer_of_the_source_the_server_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rag.cli.index import served_tokenizer

    folder = tmp_path / "all-minilm"  # the CPU profile: a prepared folder
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    snapshot = tmp_path / "hf" / "hub" / "models--BAAI--bge-small-en-v1.5" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)  # the GPU profile: a hub name, in the Hugging Face cache
    (snapshot / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert served_tokenizer(_Facts(str(folder)), "embed") == str(folder / "tokenizer.json")
    assert served_tokenizer(_Facts("BAAI/bge-small-en-v1.5"), "embed") == str(snapshot / "tokenizer.json")
    assert capsys.readouterr().err == ""
    assert served_tokenizer(_Facts("BAAI/bge-base-en-v1.5"), "embed") is None
    assert "(BAAI/bge-base-en-v1.5): chunk sizes are estimated (pass --tokenizer)" in capsys.readouterr().err
    assert served_tokenizer(_Facts(None), "embed") is None
    assert "(no source listed)" in capsys.readouterr().err
