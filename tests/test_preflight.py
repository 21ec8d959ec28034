"""`rag check`: every rule, fed a broken inference.yaml or serve module.

Each case copies the real inference.yaml and scripts/serve_module.py into a
temporary repo and breaks one thing, so the rules are tested against the files
we actually ship.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rag.errors import ConfigError
from rag.stack.preflight import check
from tests.conftest import ROOT

Edit = Callable[[Path], None]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "inference.yaml", tmp_path / "inference.yaml")
    shutil.copy(ROOT / "scripts" / "serve_module.py", tmp_path / "scripts" / "serve_module.py")
    shutil.copytree(ROOT / "scripts" / "templates", tmp_path / "scripts" / "templates")
    return tmp_path


def replace(rel: str, old: str, new: str, count: int = 1) -> Edit:
    def edit(root: Path) -> None:
        path = root / rel
        text = path.read_text()
        assert old in text, f"{old!r} not in {rel}: the test no longer matches the shipped file"
        path.write_text(text.replace(old, new, count))

    return edit


def test_shipped_deploy_passes_with_the_agreed_split(repo: Path) -> None:
    report = check(repo / "inference.yaml")
    assert report.ok, report.findings
    shares = {b.role: b.share for b in report.budgets}
    assert shares == {"chat": 0.32, "guard": 0.40, "embed": 0.06, "score": 0.06}
    assert all(b.fits for b in report.budgets)


MODULE = "scripts/serve_module.py"
YAML = "inference.yaml"

FINDINGS: list[tuple[str, Edit, str, str]] = [
    (
        "api-key-in-engine-kwargs",
        replace(MODULE, '"max_num_seqs": 32,\n', '"max_num_seqs": 32,\n            "api_key": "sk-123",\n'),
        "api-key",
        "api_key",
    ),
    (
        "accelerator-type-set",
        replace(MODULE, "accelerator_type=None,  # any card", 'accelerator_type="A10G",  # any card'),
        "accelerator-type",
        "A10G",
    ),
    (
        "max-ongoing-requests-missing",
        replace(MODULE, '"max_ongoing_requests": max_ongoing_requests,', ""),
        "max-ongoing-requests",
        "max_ongoing_requests",
    ),
    (
        "queue-unbounded",
        replace(MODULE, '"max_queued_requests": batch,', '"max_queued_requests": -1,'),
        "bounded-queue",
        "max_queued_requests",
    ),
    (
        "shares-sum-above-0.85",
        replace(MODULE, '"embed": 0.06, "score": 0.06}', '"embed": 0.10, "score": 0.06}'),
        "gpu-shares-sum",
        "0.88",
    ),
    (
        "kv-cache-does-not-fit",
        replace(MODULE, '"max_model_len": 8192,', '"max_model_len": 65536,'),
        "model-fits-share",
        "chat",
    ),
    (
        "weights-do-not-fit",
        replace(MODULE, '"Qwen/Qwen3-4B-Instruct-2507-FP8"', '"Qwen/Qwen3Guard-Gen-4B"'),
        "model-fits-share",
        "7.49",
    ),
    (
        "model-without-facts",
        replace(MODULE, '"BAAI/bge-reranker-base"', '"BAAI/bge-reranker-large"'),
        "model-facts",
        "rag check --facts-from DIR --model-id BAAI/bge-reranker-large",
    ),
    (
        "tp-in-configs-not-in-yaml",
        replace(YAML, "vllm:\n  tensor_parallel_size: 1\n", ""),
        "parallel-mirror",
        "no vllm.tensor_parallel_size",
    ),
    (
        "tp-in-yaml-differs",
        replace(YAML, "tensor_parallel_size: 1", "tensor_parallel_size: 2"),
        "parallel-mirror",
        "vllm.tensor_parallel_size=2",
    ),
    (
        "pp-in-yaml-not-in-configs",
        replace(YAML, "tensor_parallel_size: 1", "tensor_parallel_size: 1\n  pipeline_parallel_size: 2"),
        "parallel-mirror",
        "pipeline_parallel_size",
    ),
    (
        "configs-disagree-on-tp",
        replace(MODULE, '"tensor_parallel_size": 1,', '"tensor_parallel_size": 2,'),
        "parallel-mirror",
        "disagree",
    ),
    (
        "app-not-exported",
        replace(
            MODULE,
            '__all__ = ["CONFIGS", "PROFILE", "app", "build_app", "configs"]',
            '__all__ = ["CONFIGS", "PROFILE", "build_app", "configs"]',
        ),
        "exports-app",
        "does not export `app`",
    ),
]


@pytest.mark.parametrize(("edit", "rule", "needle"), [c[1:] for c in FINDINGS], ids=[c[0] for c in FINDINGS])
def test_each_rule_catches_its_breakage(
    repo: Path, edit: Edit, rule: str, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    edit(repo)
    report = check(repo / "inference.yaml")
    rules = {f.rule for f in report.findings}
    assert rule in rules, report.findings
    message = next(f.message for f in report.findings if f.rule == rule)
    assert needle in message


# ---------------------------------------------------------------- swapping a model in
TOKEN = "hf_not_a_real_token_0123456789"
LLAMA_CHAT = replace(
    MODULE, '"Qwen/Qwen3-4B-Instruct-2507-FP8"', '"hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"'
)
LLAMA_GUARD = replace(MODULE, '"Qwen/Qwen3Guard-Gen-4B"', '"meta-llama/Llama-Guard-3-1B"')
LLAMA_PARSER = replace(MODULE, '"tool_call_parser": "hermes"}', '"tool_call_parser": "llama3_json"}')
NO_TOKEN_PASSED = replace(MODULE, "ENGINE_CLS | hf_token()", "ENGINE_CLS", count=4)

# (case, edits, HF_TOKEN in the deployer's environment, rules that fail, a needle per rule)
SWAPS: list[tuple[str, list[Edit], bool, dict[str, str]]] = [
    ("right", [LLAMA_CHAT, LLAMA_PARSER, LLAMA_GUARD], True, {}),
    ("gated-guard-no-token-here", [LLAMA_GUARD], False, {"hf-token": "HF_TOKEN is not set here"}),
    (
        "gated-guard-token-not-passed",
        [LLAMA_GUARD, NO_TOKEN_PASSED],
        True,
        {"hf-token": '"HF_TOKEN": os.environ["HF_TOKEN"]'},
    ),
    ("llama-with-qwens-parser", [LLAMA_CHAT], True, {"tool-parser": "use `llama3_json`"}),
    (
        "parser-without-auto-tool-choice",
        [replace(MODULE, '{"enable_auto_tool_choice": True, "tool_call_parser"', '{"tool_call_parser"')],
        True,
        {"tool-parser": "without enable_auto_tool_choice"},
    ),
    (
        "auto-tool-choice-without-parser",
        [LLAMA_CHAT, replace(MODULE, ', "tool_call_parser": "hermes"}', "}")],
        True,
        {"tool-parser": "set tool_call_parser to `llama3_json`"},
    ),
    (
        # a model with facts but no reply format the client reads, as the guard
        "guard-without-a-reply-format",
        [replace(MODULE, '"Qwen/Qwen3Guard-Gen-4B"', '"Qwen/Qwen3-4B-Instruct-2507-FP8"')],
        True,
        {"guard-format": "add `guard_format:`"},
    ),
    (
        "unknown-model",
        [replace(MODULE, '"BAAI/bge-small-en-v1.5"', '"intfloat/multilingual-e5-large"')],
        True,
        {"model-facts": "--facts-from"},
    ),
]


@pytest.mark.parametrize(("edits", "token", "fails"), [c[1:] for c in SWAPS], ids=[c[0] for c in SWAPS])
def test_swapping_a_model_in_is_checked_for_token_parser_and_facts(
    repo: Path, edits: list[Edit], token: bool, fails: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if token:
        monkeypatch.setenv("HF_TOKEN", TOKEN)
    else:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    for edit in edits:
        edit(repo)
    report = check(repo / "inference.yaml")
    assert {f.rule for f in report.findings} == set(fails), report.findings
    for f in report.findings:
        assert fails[f.rule] in f.message
    said = " ".join(f.message for f in [*report.findings, *report.notes])
    assert TOKEN not in said  # the token's value is never printed


def test_a_license_other_than_apache_or_mit_is_reported_not_refused(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    for edit in (LLAMA_CHAT, LLAMA_PARSER, LLAMA_GUARD):
        edit(repo)
    report = check(repo / "inference.yaml")
    assert report.ok, report.findings
    licenses = {f.message.split("`")[3]: f.rule for f in report.notes}
    assert licenses == {
        "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4": "license",
        "meta-llama/Llama-Guard-3-1B": "license",
    }
    assert {b.role: b.fits for b in report.budgets} == {
        "chat": True,
        "guard": True,
        "embed": True,
        "score": True,
    }


ERRORS: list[tuple[str, Edit, str]] = [
    (
        "module-matches-no-file",
        replace(YAML, "module: serve_module", "module: serve_modul"),
        "matches no file",
    ),
    ("yaml-not-parseable", replace(YAML, "vllm:\n", "vllm: [\n"), "not valid YAML"),
    ("yaml-typo-key", replace(YAML, "vllm:", "vlm:"), "did you mean `vllm`"),
    ("profile-unknown", replace(YAML, "profile: gpu", "profile: tpu"), "'tpu' is not a known value"),
    (
        "share-not-a-number",
        replace(YAML, "gpu_memory_gib: 24", "gpu_memory_gib: lots"),
        "`resources.gpu_memory_gib`: 'lots' is not allowed",
    ),
    (
        "parallel-size-zero",
        replace(YAML, "tensor_parallel_size: 1", "tensor_parallel_size: 0"),
        "`vllm.tensor_parallel_size`: 0 is not allowed (input should be greater than 0)",
    ),
    (
        "replicas-unknown-role",
        replace(YAML, "vllm:\n", "replicas:\n  chatt: {max: 2}\nvllm:\n"),
        "`replicas.chatt`: 'chatt' is not a known role; use 'chat', 'guard', 'embed' or 'score'",
    ),
    (
        "replicas-min-above-max",
        replace(YAML, "vllm:\n", "replicas:\n  chat: {min: 3, max: 2}\nvllm:\n"),
        "`replicas.chat`: min (3) is above max (2)",
    ),
    (
        "replicas-builtin-resource",
        replace(YAML, "vllm:\n", "replicas:\n  chat: {resources: {GPU: 2}}\nvllm:\n"),
        "`replicas.chat.resources`: GPU: set by the serve module",
    ),
    (
        "replicas-typo-key",
        replace(YAML, "vllm:\n", "replicas:\n  chat: {maxx: 2}\nvllm:\n"),
        "did you mean `replicas.chat.max`",
    ),
    ("yaml-without-module", replace(YAML, "  module: serve_module", "  modul: serve_module"), "model.module"),
    (
        "vllm-unknown-key",
        replace(YAML, "tensor_parallel_size: 1", "tensor_parallel: 1"),
        "tensor_parallel_size",
    ),
    (
        "module-fails-to-import",
        replace(MODULE, "import os\n", "import os\nraise RuntimeError('boom')\n"),
        "boom",
    ),
]


@pytest.mark.parametrize(("edit", "needle"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_unusable_deploy_is_a_config_error(repo: Path, edit: Edit, needle: str) -> None:
    edit(repo)
    with pytest.raises(ConfigError) as info:
        check(repo / "inference.yaml")
    assert needle in str(info.value)


def test_missing_yaml_says_where_to_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        check(tmp_path / "inference.yaml")


def test_replicas_come_from_inference_yaml_and_must_fit_the_cards(repo: Path) -> None:
    """inference.yaml's `replicas:` reaches the serve module's deployments, and rag check
    packs the most replicas allowed onto `resources.gpus` cards before Ray is asked."""
    from rag.stack.preflight import load_configs

    replace(YAML, "vllm:\n", "replicas:\n  chat: {min: 1, max: 2, resources: {chat_node: 1}}\nvllm:\n")(repo)
    configs = load_configs(repo / MODULE, "gpu")
    assert configs["chat"].deployment_config["autoscaling_config"] == {
        "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 16.0,
    }  # fmt: skip
    # Only on nodes that advertise chat_node, one per unit of it.
    assert configs["chat"].placement_group_config["bundles"] == [{"GPU": 0.32, "CPU": 1, "chat_node": 1}]
    assert configs["guard"].deployment_config["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 1}
    assert configs["guard"].placement_group_config["bundles"] == [{"GPU": 0.40, "CPU": 1}]
    report = check(repo / "inference.yaml")  # two chats (0.32 each) and a set do not fit one card
    assert [f.rule for f in report.findings] == ["replicas-fit-cards"], report.findings
    assert "raise `resources.gpus`" in report.findings[0].message
    replace(YAML, "gpus: 1 ", "gpus: 2 ")(repo)
    report = check(repo / "inference.yaml")
    assert report.ok, report.findings
    assert any(n.rule == "replicas-fit-cards" and "card 1: chat" in n.message for n in report.notes)


def test_packing_never_splits_an_engine_or_overfills_a_card() -> None:
    from rag.stack.preflight import pack

    shares = {"chat": 0.32, "guard": 0.40, "embed": 0.06, "score": 0.06}
    one = dict.fromkeys(shares, 1)
    assert pack(shares, one, 1) == [["guard", "chat", "score", "embed"]]
    assert pack(shares, one | {"chat": 2}, 1) is None
    assert pack(shares, one | {"chat": 2}, 2) == [["guard", "chat", "score", "embed"], ["chat"]]
    two = pack(shares, dict.fromkeys(shares, 2), 2)  # two full sets on two cards, one guard each
    assert two is not None and sorted(card.count("guard") for card in two) == [1, 1]
    assert pack(shares, one | {"guard": 3}, 2) == [["guard", "guard"], ["guard", "chat", "score", "embed"]]
    assert pack(shares, one | {"guard": 4}, 2) is None  # 0.40 x 4 + the rest: a third card


def test_the_edge_admits_a_batch_and_a_queue_per_replica_it_may_have(repo: Path) -> None:
    """Two chat replicas hold twice the requests of one: the front door's count follows
    inference.yaml's `replicas.chat.max` (Serve's own bound per replica stays behind)."""
    from rag.stack.ingress.app import _capacity
    from rag.stack.preflight import load_configs

    one = _capacity(load_configs(repo / MODULE, "gpu")["chat"])
    replace(YAML, "vllm:\n", "replicas:\n  chat: {min: 1, max: 2}\nvllm:\n")(repo)
    two = _capacity(load_configs(repo / MODULE, "gpu")["chat"])
    assert one is not None and two is not None
    assert (one.requests, two.requests) == (64, 128) and one.retry_after_s == two.retry_after_s
