"""Stack commands: prepare the CPU weights, preflight a deploy, serve the four engines.

Just over 300 lines: most of it is the three commands' options and help text, which a
user reads through `--help`; the work itself lives in rag/stack/.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import TextIO

import click

from rag.cli.common import CONTEXT, deploy_file_option, err, friendly, main
from rag.errors import ConfigError
from rag.settings import DEFAULT_HOST, DEFAULT_METRICS_PORT, DEFAULT_PORT
from rag.stack.profiles import (
    CPU_MODEL_SETS,
    CPU_MODELS_ENV,
    DEFAULT_CPU_MODEL_SET,
    cpu_model_set,
    default_models_dir,
    detect_profile,
)


@main.command(context_settings=CONTEXT)
@click.option(
    "--set", "model_set", type=click.Choice(list(CPU_MODEL_SETS)), envvar=CPU_MODELS_ENV,
    default=DEFAULT_CPU_MODEL_SET, show_default=True, show_envvar=True,
    help="CPU model set: qwen (0.5B chat and guard), qwen-1.5b (1.5B chat and guard: better answers "
    "and guard, 1.7x slower answers, 3x slower checks, ~5 GiB more, bf16 CPUs only) or smollm2 "
    "(135M, least memory).",
)  # fmt: skip
@click.option(
    "--models-dir", type=click.Path(file_okay=False, path_type=Path), envvar="RAG_MODELS_DIR",
    default=None, show_envvar=True, help="Where prepared weights go [default: ~/.cache/rag-stack/models].",
)  # fmt: skip
@friendly
def prepare(model_set: str, models_dir: Path | None) -> None:
    """Download, verify (sha256) and convert the CPU profile's weights.

    Then resolves each engine's model config once, so vLLM's model-inspection
    cache is filled and the first boot skips that step (about 6 s here).
    Idempotent: a second run verifies what is there and does nothing else.
    An interrupted run leaves no half-written model behind.

    \b
    Examples:
      rag prepare
      rag prepare --set smollm2
    """
    from rag.stack.prepare import prepare as run

    models_dir = models_dir or default_models_dir()
    folders = run(model_set, models_dir, err)
    for role, folder in folders.items():
        click.echo(f"{role}\t{folder}")
    _warm(model_set, models_dir)


def _warm(model_set: str, models_dir: Path) -> None:
    """vLLM's per-model inspection for the serve module's CPU configs, done now rather than
    in each engine's first boot (rag/stack/warm.py); skipped without inference.yaml here."""
    from rag.stack.preflight import load_configs, load_deploy
    from rag.stack.warm import is_warm, marker, warm_model_info

    done = marker(models_dir, model_set)
    if is_warm(done):
        return
    deploy = Path(os.environ.get("RAG_DEPLOY_FILE") or "inference.yaml")
    if not deploy.is_file():
        err(f"note: no {deploy} here, so vLLM's model inspection is left to the first boot")
        return
    # The set and folder just prepared, whatever the environment says.
    chosen = {CPU_MODELS_ENV: model_set, "RAG_MODELS_DIR": str(models_dir)}
    try:
        configs = load_configs(load_deploy(deploy).module_path, "cpu", env=chosen)
        with contextlib.redirect_stdout(sys.stderr):  # vLLM logs to stdout; stdout is the folder list
            warm_model_info(configs, done, err)
    except Exception as exc:  # the weights are ready; the boot inspects what this could not
        err(f"note: vLLM's model inspection not cached ({type(exc).__name__}: {exc}); the first boot does it")


@main.command(context_settings=CONTEXT)
@deploy_file_option("The deploy descriptor to check.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--facts-from", type=click.Path(file_okay=False, exists=True, path_type=Path), metavar="DIR",
    help="Print the model_facts.yaml entry for the model in DIR (config.json, *.safetensors, "
    "README.md), instead of checking.",
)  # fmt: skip
@click.option("--model-id", metavar="ORG/NAME", help="With --facts-from: the id configs name it by.")
@friendly
def check(path: Path, as_json: bool, facts_from: Path | None, model_id: str | None) -> None:
    """Preflight a deploy: catch what would fail minutes into a GPU boot.

    \b
    Checks that inference.yaml's model.module names a file under scripts/ that
    exports `app`; that the vllm: block mirrors every tensor/pipeline parallel
    size the configs set; that no engine_kwargs holds an api_key, no config pins
    accelerator_type and every config sets max_ongoing_requests; that the GPU
    shares sum to at most 0.85; that each model's weights plus the KV cache
    for its max_model_len fit its share of the card; that a gated model's config
    passes HF_TOKEN to its replica; and that a config with tool calls names the
    parser of its model's family. Facts per model: rag/stack/model_facts.yaml.
    A license other than Apache-2.0 or MIT is noted, not failed.

    \b
    Examples:
      rag check
      rag check -f staging.yaml --json
      rag check --facts-from ~/models/Llama-3.1-8B-AWQ --model-id ORG/NAME >> rag/stack/model_facts.yaml
    """
    from rag.stack.budget import GiB
    from rag.stack.preflight import check as run

    if facts_from is not None:
        from rag.stack.folder_facts import facts_from_folder, to_yaml

        name, entry = facts_from_folder(facts_from, model_id)
        click.echo(json.dumps({name: entry}, indent=2) if as_json else to_yaml(name, entry), nl=as_json)
        return
    report = run(path)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": report.ok,
                    "findings": [{"rule": f.rule, "message": f.message} for f in report.findings],
                    "notes": [{"rule": f.rule, "message": f.message} for f in report.notes],
                    "budget": [
                        {
                            "role": b.role,
                            "model": b.model,
                            "share": b.share,
                            "share_gib": round(b.share_bytes / GiB, 3),
                            "weights_gib": round(b.weights_bytes / GiB, 3),
                            "kv_gib": round(b.kv_bytes / GiB, 3),
                            "runtime_gib": round(b.overhead_bytes / GiB, 3),
                            "spare_gib": round(b.spare_bytes / GiB, 3),
                            "max_model_len": b.max_model_len,
                            "fits": b.fits,
                        }
                        for b in report.budgets
                    ],
                },
                indent=2,
            )
        )
    else:
        if report.budgets and report.deploy:
            card = report.deploy.gpu_memory_gib
            click.echo(f"memory budget on one {card:g} GiB card (GiB):")
            click.echo(
                f"  {'role':6} {'share':>5} {'has':>6} {'weights':>8} {'kv':>6} "
                f"{'runtime':>8} {'spare':>6}  model"
            )
            for b in report.budgets:
                click.echo(
                    f"  {b.role:6} {b.share:5.2f} {b.share_bytes / GiB:6.2f} {b.weights_bytes / GiB:8.2f} "
                    f"{b.kv_bytes / GiB:6.2f} {b.overhead_bytes / GiB:8.2f} {b.spare_bytes / GiB:6.2f}  "
                    f"{b.model} (max_model_len {b.max_model_len})"
                )
            total = sum(b.share for b in report.budgets)
            click.echo(f"  shares sum to {total:.2f} (limit 0.85)")
        for f in report.notes:
            click.echo(f"note [{f.rule}] {f.message}")
        for f in report.findings:
            click.echo(f"FAIL [{f.rule}] {f.message}")
        if report.ok and report.deploy:
            click.echo(f"ok: {report.deploy.path} -> {report.deploy.module_path} ({', '.join(report.roles)})")
    if not report.ok:
        sys.exit(1)


@main.command(context_settings=CONTEXT)
@click.option("--host", envvar="RAG_HOST", default=DEFAULT_HOST, show_default=True, show_envvar=True)
@click.option(
    "--port",
    envvar="RAG_PORT",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    show_envvar=True,
)
@click.option(
    "--profile", type=click.Choice(["cpu", "gpu"]), envvar="RAG_PROFILE", default=None, show_envvar=True,
    help="Which configs to boot [default: gpu if an NVIDIA device is visible, else cpu].",
)  # fmt: skip
@deploy_file_option("Deploy descriptor naming the serve module.")
@click.option(
    "--num-cpus", type=click.IntRange(1), envvar="RAG_RAY_CPUS", default=12,
    show_default=True, show_envvar=True,
    help="Logical CPUs Ray schedules with; each engine takes 2, and they mostly wait.",
)  # fmt: skip
@click.option(
    "--boot-timeout", type=float, envvar="RAG_BOOT_TIMEOUT_S", default=900.0,
    show_default=True, show_envvar=True,
    help="Seconds to wait for all four engines.",
)  # fmt: skip
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), envvar="RAG_METRICS_PORT", default=DEFAULT_METRICS_PORT,
    show_default=True, show_envvar=True,
    help="Where Prometheus scrapes vLLM engine and Serve metrics (/metrics); 0 turns it off.",
)  # fmt: skip
@click.option(
    "--api-key", "api_keys", multiple=True, envvar="RAG_API_KEY", show_envvar=True, metavar="KEY",
    help="A key clients must send as `Authorization: Bearer KEY`; repeat for several (the env var "
    "takes a comma-separated list). `ps` shows it: prefer --api-key-file.",
)  # fmt: skip
@click.option(
    "--api-key-file", "key_files", multiple=True, envvar="RAG_API_KEY_FILE", show_envvar=True,
    type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
    help="Keys, one per line (# comments); keeps them out of `ps` and shell history.",
)  # fmt: skip
@click.option(
    "--allow-unauthenticated", is_flag=True,
    help="Serve a non-loopback --host with no API key (only on a network that is yours alone).",
)  # fmt: skip
@click.option(
    "--index", "index_dir", type=click.Path(file_okay=False, path_type=Path), envvar="RAG_INDEX_DIR",
    default=Path(".rag/index"), show_default=True, show_envvar=True,
    help="The index the `rag` model and the web page answer from (`rag index` writes it); "
    "a new `rag index` there is picked up without a restart.",
)  # fmt: skip
@click.option(
    "--address", envvar="RAG_RAY_ADDRESS", show_envvar=True, metavar="auto|ray://HEAD:10001",
    help="Deploy onto this running Ray cluster instead of booting a private one; Ctrl-C deletes the "
    "app and leaves the cluster running (docs/cluster.md: what its nodes need).",
)  # fmt: skip
@click.option(
    "--proxies", type=click.Choice(["every-node", "head"]), default="every-node", show_default=True,
    help="With --address: Serve's HTTP proxy on every node of the cluster, or on the head only "
    "(one entry point; or several Ray nodes on one machine, whose proxies would share --port).",
)  # fmt: skip
@click.option("--exit-after-ready", is_flag=True, hidden=True)
@friendly
def serve(
    host: str, port: int, profile: str | None, path: Path, num_cpus: int, boot_timeout: float,
    metrics_port: int, api_keys: tuple[str, ...], key_files: tuple[Path, ...], allow_unauthenticated: bool,
    index_dir: Path, address: str | None, proxies: str, exit_after_ready: bool,
) -> None:  # fmt: skip
    """Boot the four engines on this machine and serve until Ctrl-C.

    Progress goes to stderr while the engines load (a few minutes on CPU);
    the base URL goes to stdout once chat, guard, embed and score all answer.
    Ctrl-C stops Serve and the local Ray cluster, leaving no process behind.

    \b
    Routes: /v1/chat/completions (tool calls too), /v1/completions,
    /v1/embeddings, /v1/score, /v1/rerank (Cohere/Jina shape; /v2/rerank too),
    /v1/models, /tokenize, /detokenize. Requests past an engine's limits get a
    400 naming the limit; past its queue, a 429 with Retry-After. Prometheus
    metrics on --metrics-port (README, "The edge"). GET /health needs no key.

    \b
    The `rag` model on /v1/chat/completions gives `rag ask`'s guarded answer,
    with its sources, to any OpenAI client (model="rag"), and the page at /
    asks it from a browser; both answer from the index in --index, and a new
    `rag index` there is picked up without a restart.

    \b
    CPU profile: bfloat16 where the CPU has AVX512-BF16 or AMX, float32
    elsewhere (logged as `cpu: AVX2, no bf16 -> float32`); RAG_CPU_DTYPE
    overrides it, RAG_ENGINE_THREADS sets each engine's OpenMP threads
    (default: half the cores for chat, all of them for the others). Once all
    four answer, the memory of the whole stack is logged.

    \b
    Who gets in: with a key set (--api-key-file, RAG_API_KEY), every route
    but /health needs `Authorization: Bearer KEY`, which the OpenAI, Cohere,
    LangChain and litellm clients send as their api_key, and `rag` sends from
    RAG_API_KEY / RAG_API_KEY_FILE. A --host other than loopback needs a key
    (or --allow-unauthenticated). Ray's own ports and the metrics port listen
    on 127.0.0.1 only; /metrics on --port relays them behind the key.

    \b
    Examples:
      rag serve
      rag serve --port 8100
      openssl rand -hex 24 > ~/.rag-keys && chmod 600 ~/.rag-keys
      rag serve --host 0.0.0.0 --api-key-file ~/.rag-keys
      RAG_CPU_MODELS=smollm2 rag serve
      RAG_CPU_DTYPE=float32 rag serve
      rag serve --metrics-port 0
      rag serve --address auto          # onto the Ray cluster this node belongs to
      rag serve --address HEAD:6379 --proxies head
    """
    from rag.stack.preflight import load_deploy
    from rag.stack.serve import serve_forever

    deploy = load_deploy(path)
    profile = profile or detect_profile()
    if profile == "cpu":
        from rag.stack.hardware import detect

        _require_prepared()
        detect()  # a bad RAG_CPU_DTYPE fails here, in one line, before Ray starts
    else:
        _require_tokens(deploy.module_path, profile)

    from rag.stack.auth import file_warning, is_loopback, load_keys

    keys = load_keys(api_keys, key_files)
    for file in key_files:
        if warning := file_warning(file):
            err(warning)
    if not keys and not is_loopback(host) and not allow_unauthenticated:
        raise ConfigError(
            f"--host {host} puts the engines on the network, and no API key is set: give one with "
            "--api-key-file FILE (or RAG_API_KEY), or pass --allow-unauthenticated if that network "
            "is yours alone"
        )
    if proxies != "every-node" and not address:
        raise ConfigError("--proxies chooses where a cluster's proxies run: use it with --address")
    index_dir = index_dir.expanduser().resolve()
    os.environ["RAG_INDEX_DIR"] = str(index_dir)  # for the serve module
    url_out = _stdout_for_results_only()

    def ready(url: str) -> None:
        click.echo(url, file=url_out)
        url_out.flush()
        err(_index_status(index_dir))
        err(f"web page: {url.removesuffix('/v1')}/ (the `rag` model: guarded answers with their sources)")
        err("serving; press Ctrl-C to stop")

    serve_forever(
        deploy.module_path, host=host, port=port, profile=profile, num_cpus=num_cpus,
        boot_timeout_s=boot_timeout, log=err, on_ready=ready, metrics_port=metrics_port or None,
        api_keys=keys, exit_after_ready=exit_after_ready, address=address, head_proxy_only=proxies == "head",
        deploy_file=deploy.path,
    )  # fmt: skip


def _index_status(folder: Path) -> str:
    """What the `rag` model will answer from, for the boot log."""
    from rag.store import MANIFEST

    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return (
            f"rag model: no index in {folder} yet; `rag index PATH` builds one there "
            "(RAG_INDEX_DIR), and it is picked up without a restart"
        )
    except (OSError, ValueError) as exc:
        return f"rag model: the index in {folder} is unreadable ({exc}); rebuild it with `rag index PATH`"
    return (
        f"rag model: answers from {folder} ({manifest.get('count', '?')} chunks of "
        f"{len(manifest.get('files') or {})} files, built {manifest.get('built_at', '?')})"
    )


def _stdout_for_results_only() -> TextIO:
    """Point fd 1 at stderr (Ray and vLLM print there) and return the real stdout."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return sys.stdout  # not a real file (tests): nothing below us writes to it
    sys.stdout.flush()
    saved = os.fdopen(os.dup(fd), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), fd)
    return saved


def _require_tokens(module_path: Path, profile: str) -> None:
    """Fail before booting when a gated model's download would fail minutes into it."""
    from rag.stack.budget import load_facts
    from rag.stack.preflight import TOKEN_ENV, gated_without_token, load_configs

    missing = gated_without_token(load_configs(module_path, profile), load_facts())
    if missing:
        raise ConfigError(
            f"{TOKEN_ENV} is not set, and these models are gated: {'; '.join(missing)}. Accept each "
            f"model's terms on huggingface.co, then `export {TOKEN_ENV}=...` (a read token from "
            "huggingface.co/settings/tokens) and run `rag serve` again"
        )


def _require_prepared() -> None:
    """Fail fast (not minutes into a boot) when the CPU weights are not prepared."""
    model_set = cpu_model_set()
    for name in dict.fromkeys(CPU_MODEL_SETS[model_set].values()):
        folder = default_models_dir() / name
        if not (folder / "rag-model.json").is_file():
            raise ConfigError(
                f"{name} is not prepared in {folder.parent}; run `rag prepare --set {model_set}` first"
            )
