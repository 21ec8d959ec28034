"""`rag serve-config`: the stack as a Ray Serve config that Ray's own schema accepts, open to
a network only behind a key file, and whose import path resolves to the serve module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from ray.serve.schema import ServeDeploySchema

from rag.cli import main
from rag.errors import ConfigError
from rag.stack.preflight import load_deploy
from rag.stack.serve import SERVE_ENV
from rag.stack.serve_config import serve_config
from tests.conftest import ROOT


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(ROOT)
    return CliRunner()


def test_the_written_config_is_one_serve_deploy_takes(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "serve.yaml"
    result = runner.invoke(main, ["serve-config", "--api-key-file", "/etc/rag/keys", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    config = yaml.safe_load(text)
    schema = ServeDeploySchema.model_validate(config)  # what `serve deploy` and KubeRay parse
    (app,) = schema.applications
    assert app.import_path == "scripts.serve_module:app" and app.route_prefix == "/"
    env = config["applications"][0]["runtime_env"]["env_vars"]
    assert env["RAG_PROFILE"] == "gpu" and env["RAG_API_KEY_FILE"] == "/etc/rag/keys"
    assert "RAG_API_KEY" not in env  # a path to the keys, never a key
    # Serve's own knobs are read when Ray's processes start: the header says so, per node.
    for name, value in SERVE_ENV.items():
        assert f"#   {name}={value}" in text and name not in env


def test_a_network_host_needs_a_key_file(runner: CliRunner) -> None:
    result = runner.invoke(main, ["serve-config"])
    assert result.exit_code == 1
    assert "--api-key-file PATH" in result.output and "--allow-unauthenticated" in result.output
    spec = load_deploy(ROOT / "inference.yaml")
    assert serve_config(spec, profile="cpu", host="127.0.0.1")["http_options"]["host"] == "127.0.0.1"
    with pytest.raises(ConfigError, match="no key file"):
        serve_config(spec, profile="cpu", host="10.0.0.5")
    assert serve_config(spec, profile="cpu", allow_unauthenticated=True)["http_options"]["host"] == "0.0.0.0"


@pytest.mark.ray
def test_its_import_path_resolves_to_the_serve_module_with_its_environment() -> None:
    """What a node does with the config: import `scripts.serve_module` from the repository
    root under the app's env_vars (the app itself, built on first access, needs Ray)."""
    spec = load_deploy(ROOT / "inference.yaml")
    (app,) = serve_config(spec, profile="cpu", host="127.0.0.1")["applications"]
    module, attr = app["import_path"].split(":")
    code = f"import importlib; m = importlib.import_module({module!r}); print(sorted(m.CONFIGS), m.PROFILE)"
    env = {**os.environ, **app["runtime_env"]["env_vars"], "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['chat', 'embed', 'guard', 'score'] cpu"
    assert attr == "app"
