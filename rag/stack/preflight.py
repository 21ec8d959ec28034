"""`rag check`: catch a broken deploy before the boot, not minutes into it.

Reads `inference.yaml`, imports the serve module it names (which starts nothing),
and applies every rule below to the module's `LLMConfig`s. Each finding says
what is wrong and how to fix it.

Over 300 lines: each rule is short, but they are many, and a reader checking what
`rag check` enforces should find all of them in one file.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from rag.errors import ConfigError
from rag.guard import CHAT_GUARD_FORMATS
from rag.stack import descriptor
from rag.stack.budget import EngineBudget, GiB, ModelFacts, engine_budget, load_facts, load_tool_parsers
from rag.stack.profiles import ROLES

__all__ = [
    "MAX_TOTAL_SHARE",
    "TOKEN_ENV",
    "Deploy",
    "Finding",
    "Report",
    "check",
    "gated_without_token",
    "load_configs",
    "load_deploy",
    "pack",
]

# Four CUDA contexts and the allocator's slack live outside the engines' shares.
MAX_TOTAL_SHARE = 0.85
PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size")
PERMISSIVE_LICENSES = ("apache-2.0", "mit")
TOKEN_ENV = "HF_TOKEN"  # what huggingface_hub reads in each replica to download a gated model


@dataclass(frozen=True)
class Finding:
    """One broken rule: which, where, and how to fix it."""

    rule: str
    message: str


@dataclass(frozen=True)
class Deploy:
    """What inference.yaml says."""

    path: Path
    module: str
    module_path: Path
    profile: str
    gpu_memory_gib: float
    vllm: dict[str, Any]
    gpus: int = 1
    replicas: dict[str, descriptor.Replicas] = field(default_factory=dict)
    name: str = ""


@dataclass
class Report:
    """Everything `rag check` found; `ok` when there is nothing to fix."""

    deploy: Deploy | None = None
    roles: list[str] = field(default_factory=list)
    budgets: list[EngineBudget] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)  # worth knowing, not wrong (e.g. a license)

    @property
    def ok(self) -> bool:
        return not self.findings

    def add(self, rule: str, message: str) -> None:
        self.findings.append(Finding(rule, message))

    def note(self, rule: str, message: str) -> None:
        self.notes.append(Finding(rule, message))


def load_deploy(path: Path) -> Deploy:
    """Parse and validate inference.yaml (rag/stack/descriptor.py); ConfigError saying how to fix it."""
    spec = descriptor.read(path)
    scripts = path.parent / "scripts"
    name = spec.model.module.removeprefix("scripts/").removesuffix(".py").replace(".", "/")
    module_path = scripts / f"{name}.py"
    if not module_path.is_file():
        have = sorted(p.stem for p in scripts.glob("*.py")) if scripts.is_dir() else []
        raise ConfigError(
            f"{path}: model.module `{spec.model.module}` matches no file under {scripts}/"
            + (f"; modules there: {', '.join(have)}" if have else "")
        )
    return Deploy(
        path=path,
        module=spec.model.module,
        module_path=module_path,
        profile=spec.model.profile,
        gpu_memory_gib=spec.resources.gpu_memory_gib,
        vllm=spec.vllm.model_dump(exclude_none=True),
        gpus=spec.resources.gpus,
        replicas={role: spec.replicas_of(role) for role in ROLES},
        name=spec.name,
    )


def _exports_app(module_path: Path) -> bool:
    """True if the module lists `app` in __all__ and defines it (directly or lazily)."""
    tree = ast.parse(module_path.read_text(), filename=str(module_path))
    defined = lazy = False
    exported: set[str] | None = None
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        for t in targets:
            if isinstance(t, ast.Name) and t.id == "app":
                defined = True
            if isinstance(t, ast.Name) and t.id == "__all__" and value is not None:
                try:
                    exported = set(ast.literal_eval(value))
                except ValueError:
                    exported = None
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            lazy = "'app'" in ast.unparse(node) or '"app"' in ast.unparse(node)
        if isinstance(node, ast.ImportFrom) and any(a.asname == "app" or a.name == "app" for a in node.names):
            defined = True
    if exported is not None and "app" not in exported:
        return False
    return defined or lazy


@contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _import(module_path: Path, profile: str, env: Mapping[str, str] | None = None) -> ModuleType:
    name = f"_rag_check_{module_path.stem}"
    spec = importlib.util.spec_from_file_location(name, module_path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {module_path}")
    module = importlib.util.module_from_spec(spec)
    # vLLM logs to stdout when first imported; stdout is for the report (--json).
    with _env(**(env or {}), RAG_PROFILE=profile), contextlib.redirect_stdout(sys.stderr):
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the user's module: any failure is a finding
            raise ConfigError(f"importing {module_path} failed: {type(exc).__name__}: {exc}") from exc
    sys.modules.pop(name, None)
    return module


def _llm_configs(module: ModuleType) -> dict[str, Any]:
    from ray.serve.llm import LLMConfig

    found = getattr(module, "CONFIGS", None)
    if isinstance(found, Mapping):
        configs = {str(k): v for k, v in found.items() if isinstance(v, LLMConfig)}
    else:
        configs = {k: v for k, v in vars(module).items() if isinstance(v, LLMConfig)}
    return configs


def load_configs(module_path: Path, profile: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The serve module's LLMConfigs by role, as `profile` builds them (starts nothing),
    with `env` set while the module is imported."""
    return _llm_configs(_import(module_path, profile, env))


def _check_config(report: Report, role: str, cfg: Any) -> None:
    where = f"config `{role}`"
    engine: dict[str, Any] = dict(cfg.engine_kwargs or {})
    for key in engine:
        if "api_key" in key.lower():
            report.add(
                "api-key",
                f"{where}: engine_kwargs holds `{key}`; remove it (a key in the config ends up "
                "in logs and the repo) and put auth in front of the ingress instead",
            )
    if cfg.accelerator_type is not None:
        report.add(
            "accelerator-type",
            f"{where}: accelerator_type={cfg.accelerator_type!r}; leave it None so the engine "
            "schedules on whatever 24 GB card the cluster has",
        )
    deployment: dict[str, Any] = dict(cfg.deployment_config or {})
    if "max_ongoing_requests" not in deployment:
        report.add(
            "max-ongoing-requests",
            f"{where}: deployment_config lacks max_ongoing_requests; set it to at least the engine's "
            "max_num_seqs (Serve's default of 5 starves a batching engine)",
        )
    queued = deployment.get("max_queued_requests", -1)
    if not isinstance(queued, int) or queued < 0:
        report.add(
            "bounded-queue",
            f"{where}: deployment_config has no bounded max_queued_requests ({queued!r}); set it "
            "(to about the engine's max_num_seqs) so an overload is refused with 429 + Retry-After "
            "instead of queueing for minutes",
        )


def _check_parallel(report: Report, deploy: Deploy, configs: dict[str, Any]) -> None:
    for key in PARALLEL_KEYS:
        set_by = {role: cfg.engine_kwargs[key] for role, cfg in configs.items() if key in cfg.engine_kwargs}
        in_yaml = deploy.vllm.get(key)
        values = set(set_by.values())
        if len(values) > 1:
            report.add(
                "parallel-mirror",
                f"configs disagree on {key} ({', '.join(f'{r}={v}' for r, v in set_by.items())}); "
                f"make them equal and mirror the value in {deploy.path.name}'s vllm: block",
            )
        elif values and in_yaml is None:
            (value,) = values
            report.add(
                "parallel-mirror",
                f"{', '.join(set_by)} set{'s' if len(set_by) == 1 else ''} {key}={value} but "
                f"{deploy.path.name} has no vllm.{key}; add `vllm: {{{key}: {value}}}`",
            )
        elif values and in_yaml not in values:
            report.add(
                "parallel-mirror",
                f"{deploy.path.name} has vllm.{key}={in_yaml} but the configs set "
                f"{next(iter(values))}; make the two equal",
            )
        elif not values and in_yaml is not None:
            report.add(
                "parallel-mirror",
                f"{deploy.path.name} has vllm.{key}={in_yaml} but no config sets it; add "
                f"`{key}: {in_yaml}` to the engine_kwargs or drop it from the yaml",
            )


def _check_gpu_budget(report: Report, deploy: Deploy, configs: dict[str, Any]) -> None:
    card = int(deploy.gpu_memory_gib * GiB)
    facts = load_facts()
    total = 0.0
    for role, cfg in configs.items():
        engine = dict(cfg.engine_kwargs or {})
        if "gpu_memory_utilization" not in engine:
            report.add(
                "gpu-share",
                f"config `{role}`: no gpu_memory_utilization; vLLM's default 0.9 would claim "
                "the whole card. Set this engine's share",
            )
            continue
        total += float(engine["gpu_memory_utilization"])
        model = _model(cfg)
        f = facts.get(model)
        if f is None:
            report.add(
                "model-facts",
                f"config `{role}`: no facts for `{model}` in rag/stack/model_facts.yaml; with the model "
                f"in a folder, `rag check --facts-from DIR --model-id {model}` prints them from its "
                "config.json and weights, to append there",
            )
            continue
        b = engine_budget(role, f, engine, card)
        report.budgets.append(b)
        if b.max_model_len > f.max_position_embeddings:
            report.add(
                "max-model-len",
                f"config `{role}`: max_model_len {b.max_model_len} exceeds `{model}`'s "
                f"{f.max_position_embeddings} positions; lower it",
            )
        if not b.fits:
            report.add(
                "model-fits-share",
                f"config `{role}`: `{model}` needs {b.need_bytes / GiB:.2f} GiB (weights "
                f"{b.weights_bytes / GiB:.2f} + KV for {b.max_model_len} tokens "
                f"{b.kv_bytes / GiB:.2f} + runtime {b.overhead_bytes / GiB:.2f}) but its share "
                f"{b.share} of {deploy.gpu_memory_gib:g} GiB is {b.share_bytes / GiB:.2f} GiB; "
                "lower max_model_len, pick a smaller or quantized model, or raise the share",
            )
    if total > MAX_TOTAL_SHARE + 1e-9:
        report.add(
            "gpu-shares-sum",
            f"gpu_memory_utilization sums to {total:.2f} across the configs, above "
            f"{MAX_TOTAL_SHARE}: the engines would not all boot on one card. Lower the shares",
        )


def _check_replicas(report: Report, deploy: Deploy, configs: dict[str, Any]) -> None:
    """Each config scales as inference.yaml's `replicas:` asks (the serve module reads
    them; a config that sets its own autoscaling_config has drifted)."""
    for role, cfg in configs.items():
        asked = deploy.replicas.get(role, descriptor.Replicas())
        scaling = (cfg.deployment_config or {}).get("autoscaling_config") or {}
        have = (scaling.get("min_replicas"), scaling.get("max_replicas"))
        if have != (asked.min, asked.max):
            report.add(
                "replicas-mirror",
                f"config `{role}` runs {have[0]}-{have[1]} replicas but {deploy.path.name} asks "
                f"{asked.min}-{asked.max}; let the serve module's `_deployment` read them",
            )


def pack(shares: Mapping[str, float], replicas: Mapping[str, int], cards: int) -> list[list[str]] | None:
    """A layout of the engines on `cards` cards, no engine split across two and no card
    past MAX_TOTAL_SHARE of its memory; None if none exists (an exact search: a few
    dozen engines at most). Ray places each engine's fractional-GPU bundle on one card."""
    items = sorted(((sh, role) for role, sh in shares.items() for _ in range(replicas[role])), reverse=True)
    loads = [0.0] * cards
    layout: list[list[str]] = [[] for _ in range(cards)]

    def place(i: int) -> bool:
        if i == len(items):
            return True
        share, role = items[i]
        tried: set[float] = set()
        for card in range(cards):
            if loads[card] in tried or loads[card] + share > MAX_TOTAL_SHARE + 1e-9:
                continue  # a card loaded like one already tried fails the same way
            tried.add(loads[card])
            loads[card] += share
            layout[card].append(role)
            if place(i + 1):
                return True
            loads[card] -= share
            layout[card].pop()
        return False

    return layout if place(0) else None


def _check_packing(report: Report, deploy: Deploy, configs: dict[str, Any]) -> None:
    """The most replicas inference.yaml allows, each engine its share of a card, fit the
    deploy's `resources.gpus` cards: proved on paper before Ray is asked."""
    kwargs = {role: dict(cfg.engine_kwargs or {}) for role, cfg in configs.items()}
    shares = {role: float(kw.get("gpu_memory_utilization") or 0) for role, kw in kwargs.items()}
    most = {role: deploy.replicas.get(role, descriptor.Replicas()).max for role in configs}
    layout = pack(shares, most, deploy.gpus)
    wanted = ", ".join(f"{most[r]} x {r} ({shares[r]:g})" for r in configs)
    if layout is None:
        report.add(
            "replicas-fit-cards",
            f"{wanted} do not fit {deploy.gpus} card(s) of {deploy.gpu_memory_gib:g} GiB at most "
            f"{MAX_TOTAL_SHARE} of each; lower `replicas.<role>.max` or raise `resources.gpus`",
        )
    elif deploy.gpus > 1 or any(n > 1 for n in most.values()):
        cards = "; ".join(f"card {i}: {', '.join(roles) or 'empty'}" for i, roles in enumerate(layout))
        report.note("replicas-fit-cards", f"{wanted} fit {deploy.gpus} card(s): {cards}")


def _model(cfg: Any) -> str:
    return str(cfg.model_loading_config.model_source or cfg.model_id)


def _env_vars(cfg: Any) -> Mapping[str, Any]:
    runtime_env = cfg.runtime_env or {}
    env_vars = runtime_env.get("env_vars") if isinstance(runtime_env, Mapping) else None
    return env_vars if isinstance(env_vars, Mapping) else {}


def gated_without_token(
    configs: Mapping[str, Any], facts: Mapping[str, ModelFacts], env: Mapping[str, str] = os.environ
) -> list[str]:
    """`role: model` for each config whose gated model will not download: no HF_TOKEN in
    its runtime_env's env_vars, or none in `env` (the deployer's) for the serve module
    to pass on."""
    missing = []
    for role, cfg in configs.items():
        f = facts.get(_model(cfg))
        if f is not None and f.gated and not (_env_vars(cfg).get(TOKEN_ENV) or env.get(TOKEN_ENV)):
            missing.append(f"{role}: {f.name}")
    return missing


def _check_models(report: Report, configs: dict[str, Any]) -> None:
    """Access (gated models carry a token), license (reported) and the tool parser."""
    facts = load_facts()
    parsers = load_tool_parsers()
    for role, cfg in configs.items():
        model, where = _model(cfg), f"config `{role}`"
        f = facts.get(model)
        if f is None:
            continue  # the budget reports it, with how to add the facts
        if f.gated and TOKEN_ENV not in _env_vars(cfg):
            gated = f"{where}: `{model}` is gated, so its replica needs a Hugging Face token to download it"
            if os.environ.get(TOKEN_ENV):  # the deployer has one: the config does not pass it on
                report.add(
                    "hf-token",
                    f'{gated}: add `"{TOKEN_ENV}": os.environ["{TOKEN_ENV}"]` to its runtime_env='
                    '{"env_vars": {...}} (scripts/serve_module.py: `ENGINE_CLS | hf_token()`)',
                )
            else:
                report.add(
                    "hf-token",
                    f"{gated}, and {TOKEN_ENV} is not set here: accept the model's terms on huggingface.co, "
                    f"`export {TOKEN_ENV}=...` (a read token from huggingface.co/settings/tokens), and have "
                    f'the config pass it: runtime_env={{"env_vars": {{"{TOKEN_ENV}": ...}}}} '
                    "(scripts/serve_module.py: `ENGINE_CLS | hf_token()`)",
                )
        if role == "guard" and f.decoder and f.guard_format not in CHAT_GUARD_FORMATS:
            report.add(
                "guard-format",
                f"{where}: no reply format is known for the guard `{model}`; add `guard_format:` "
                f"({' or '.join(CHAT_GUARD_FORMATS)}) to its entry in rag/stack/model_facts.yaml, or use a "
                "guard model that has one",
            )
        if f.license not in PERMISSIVE_LICENSES:
            report.note(
                "license",
                f"{where}: `{model}` is under the {f.license} license, not Apache-2.0 or MIT: read its "
                "terms before you ship it",
            )
        engine: dict[str, Any] = dict(cfg.engine_kwargs or {})
        auto, parser = engine.get("enable_auto_tool_choice"), engine.get("tool_call_parser")
        right = parsers.get(f.family or "", ())
        suggest = f"`{right[0]}`" if right else "the parser of its family (vLLM docs, Tool Calling)"
        if auto and not parser:
            report.add(
                "tool-parser",
                f"{where}: enable_auto_tool_choice without tool_call_parser; set tool_call_parser "
                f"to {suggest}",
            )
        elif parser and not auto:
            report.add(
                "tool-parser",
                f"{where}: tool_call_parser `{parser}` without enable_auto_tool_choice: True; set it, or "
                "drop the parser",
            )
        elif parser and not right:
            report.add(
                "tool-parser",
                f"{where}: no tool-call parser is known for `{model}` (family {f.family or 'unset'}); add "
                "its family and parser to rag/stack/model_facts.yaml, or drop the tool settings",
            )
        elif parser and parser not in right:
            report.add(
                "tool-parser",
                f"{where}: tool_call_parser `{parser}` does not read `{model}`'s tool calls (family "
                f"{f.family}); use {suggest}",
            )


def check(path: Path) -> Report:
    """Run every rule against the deploy described by `path` (an inference.yaml)."""
    report = Report()
    deploy = load_deploy(path)
    report.deploy = deploy
    if not _exports_app(deploy.module_path):
        report.add(
            "exports-app",
            f"{deploy.module_path} does not export `app`; end it with "
            "`app = build_openai_app(...)` (and list it in __all__ if it has one)",
        )
    # The module reads its replicas from the file checked here (as `rag serve --file` has it).
    module = _import(deploy.module_path, deploy.profile, {"RAG_DEPLOY_FILE": str(deploy.path.resolve())})
    configs = _llm_configs(module)
    if not configs:
        report.add("no-configs", f"{deploy.module_path} defines no LLMConfig; declare one per engine")
        return report
    report.roles = list(configs)
    for role, cfg in configs.items():
        _check_config(report, role, cfg)
    _check_parallel(report, deploy, configs)
    _check_replicas(report, deploy, configs)
    if deploy.profile == "gpu":
        _check_gpu_budget(report, deploy, configs)
        _check_packing(report, deploy, configs)
        _check_models(report, configs)
    return report
