"""The app inference.yaml names, as a Ray Serve config file: what `serve deploy` takes on a
running cluster and a KubeRay RayService takes as its `serveConfigV2` (docs/cluster.md).

Generated, not written by hand, so the file and `rag serve` cannot drift apart. What it
holds, and what it leaves to the nodes:
- one application, the serve module's `app`, imported as `scripts.<module>:app` from the
  repository on every node (the image holds it, its root on PYTHONPATH; or `working_dir`
  names it as a URI: `local://DIR` where every node has it, or a remote zip);
- the environment the app's processes need: the profile, the offline switches, where
  the API keys are (a FILE, mounted from a Secret: never a key), where the prepared CPU
  weights and the `rag` model's index live;
- not Serve's own knobs (`rag.stack.serve.SERVE_ENV`: the front door's key check and
  admission in Ray's proxy, the control loop's pace): Ray's processes read them when they
  start, so they go into every node's environment (`ray start`, the RayService's pods);
  `node_env` lists them;
- not the replicas per role: each node's serve module reads them from inference.yaml,
  their one home.
The whole is checked against Ray's own schema of a Serve config before it is written.
"""

from __future__ import annotations

from typing import Any

from rag.errors import ConfigError
from rag.stack.auth import KEY_FILE_ENV, is_loopback
from rag.stack.preflight import Deploy
from rag.stack.serve import OFFLINE_ENV, SERVE_ENV

__all__ = ["node_env", "serve_config"]


def node_env() -> dict[str, str]:
    """What every Ray node's environment needs before `ray start`: Serve's knobs and the
    offline switches (the proxy and controller read them once, at their start)."""
    return {**OFFLINE_ENV, **SERVE_ENV}


def serve_config(
    deploy: Deploy,
    *,
    profile: str,
    host: str = "0.0.0.0",
    port: int = 8000,
    key_file: str | None = None,
    allow_unauthenticated: bool = False,
    models_dir: str | None = None,
    index_dir: str | None = None,
    working_dir: str | None = None,
) -> dict[str, Any]:
    """The Serve config for `deploy`'s app; ConfigError where the deploy would be open to
    the network without a key, or where Ray's schema refuses the result."""
    if key_file is None and not is_loopback(host) and not allow_unauthenticated:
        raise ConfigError(
            f"--host {host} puts the engines on the cluster's network, and no key file is named: pass "
            "--api-key-file PATH (a path that exists on every node, e.g. a mounted Secret), or "
            "--allow-unauthenticated if that network is yours alone"
        )
    env = {**OFFLINE_ENV, "RAG_PROFILE": profile}
    if key_file:
        env[KEY_FILE_ENV] = key_file
    if models_dir:
        env["RAG_MODELS_DIR"] = models_dir
    if index_dir:
        env["RAG_INDEX_DIR"] = index_dir
    runtime_env: dict[str, Any] = {"env_vars": env}
    if working_dir and "://" not in working_dir:
        raise ConfigError(
            f"--working-dir {working_dir}: a Serve config takes a URI there, not a path: local://DIR for a "
            "folder that exists on every node, or a remote zip (https://..., s3://...)"
        )
    if working_dir:
        runtime_env["working_dir"] = working_dir
    module = deploy.module_path.stem  # load_deploy found it under scripts/
    config = {
        "proxy_location": "EveryNode",  # a Service in front may send a request to any node
        "http_options": {"host": host, "port": port},
        "applications": [
            {
                "name": deploy.name or "rag",
                "route_prefix": "/",
                "import_path": f"scripts.{module}:app",
                "runtime_env": runtime_env,
            }
        ],
    }
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(config)
    except ValidationError as exc:  # a bug here, not the user's input: say what Ray refused
        raise ConfigError(f"Ray's Serve schema refuses the generated config: {exc}") from exc
    return config
