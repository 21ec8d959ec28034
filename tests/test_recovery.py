"""A dead engine is replaced by Serve and its callers recover, with no manual step.

Runs after every other stack test (marker `disruptive`): it kills the chat
engine's EngineCore process of the running stack, then asks a question through
the CLI, which must wait for the replacement and answer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from rag.attribute import UNSUPPORTED, strip_markers
from rag.cli import main
from rag.stack import footprint
from tests.conftest import ROOT, Stack, report

pytestmark = [pytest.mark.stack, pytest.mark.disruptive]


def _engine_core(stack_pid: int, role: str) -> int:
    cores = [
        p.pid for p in footprint.measure(stack_pid).processes if p.kind == "engine core" and p.role == role
    ]
    assert len(cores) == 1, f"expected one EngineCore for `{role}`, found {cores}"
    return cores[0]


def test_killing_the_chat_engine_core_then_rag_ask_answers_once_it_is_back(
    stack: Stack, served: Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if stack.pid is None:
        pytest.skip("needs a stack this session started (RAG_TEST_BASE_URL is set)")
    env = {"RAG_BASE_URL": stack.base_url, "RAG_INDEX_DIR": str(tmp_path / "index")}
    runner = CliRunner()
    built = runner.invoke(main, ["index", str(ROOT / "corpus" / "troubleshooting.md")], env=env)
    assert built.exit_code == 0, built.output

    victim = _engine_core(stack.pid, "chat")
    poller = _RagPoller(stack)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    poller.start()

    result = runner.invoke(
        main, ["ask", "What should I do when port 8000 is already taken?", "--json"], env=env
    )
    answered_s = time.monotonic() - killed_at
    poller.stop()
    # Meanwhile the `rag` model told its callers to come back (503 and Retry-After) while its
    # chat engine was dead or being replaced.
    unavailable = [r for r in poller.replies if r[0] == 503 and "rag index" not in r[1]]
    assert unavailable and all(retry for _, _, retry in unavailable), poller.replies
    statuses = sorted({r[0] for r in poller.replies})
    report(request, f"the `rag` model meanwhile: {len(poller.replies)} replies, statuses {statuses}")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["blocked"] is None, answer
    assert any(x["path"].endswith("troubleshooting.md") for x in answer["sources"]), answer["sources"]
    # A whole generated answer came through the replaced engine, sentence by sentence
    # (what it says is the 0.5B model's affair: the dev-set evals measure that).
    sentences = [x["text"].strip() for x in answer["sentences"]]
    assert sentences and sum(len(x.split()) for x in sentences) >= 8, answer
    shown = " ".join(_words(answer["answer"]))
    assert all(" ".join(_words(x)) in shown for x in sentences), answer  # as shown, in order
    assert "waiting for `chat`" in result.stderr  # the wait was explained, not silent
    replacement = _engine_core(stack.pid, "chat")
    assert replacement != victim
    waits = [ln for ln in result.stderr.splitlines() if ln.startswith("waiting for")]
    report(
        request,
        f"kill -9 of chat's EngineCore -> rag ask answered in {answered_s:.0f} s ({len(waits)} waits)",
    )


class _RagPoller(threading.Thread):
    """Asks the `rag` model over and over, recording (status, error message, Retry-After)."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.stack, self.replies = stack, list[tuple[int, str, str]]()
        self._halt = threading.Event()

    def run(self) -> None:
        body = {"model": "rag", "messages": [{"role": "user", "content": "Which port does it use?"}]}
        with httpx.Client(base_url=self.stack.base_url, headers=self.stack.auth, timeout=120) as http:
            while not self._halt.is_set():
                r = http.post("/chat/completions", json=body)
                message = r.json().get("error", {}).get("message", "") if r.status_code >= 400 else ""
                self.replies.append((r.status_code, message, r.headers.get("retry-after", "")))
                self._halt.wait(0.5)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=150)


def _words(text: str) -> list[str]:
    """The words of a text, without source markers and punctuation."""
    return re.findall(r"\w+", strip_markers(text.replace(UNSUPPORTED, ""))[0])
