"""Where a running stack's memory goes: PSS per process, grouped by kind and engine.

PSS (proportional set size) charges each shared page to the processes that map
it in equal parts, so the numbers add up to what the stack really holds; RSS
counts shared libraries and weights once per process and overstates the sum.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import psutil

__all__ = ["Footprint", "GiB", "ProcessMemory", "measure"]

GiB = float(1 << 30)

# Ray and vLLM name their processes (setproctitle); the first match wins.
_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("engine worker", re.compile(r"VLLM::Worker|VllmWorker")),
    ("engine core", re.compile(r"EngineCore")),
    ("model inspection", re.compile(r"vllm\.model_executor\.models\.registry")),
    ("serve replica", re.compile(r"ServeReplica:\w+:LLMServer")),
    ("serve ingress", re.compile(r"ServeReplica")),
    ("serve controller", re.compile(r"ServeController")),
    ("serve proxy", re.compile(r"ProxyActor")),
    ("idle ray worker", re.compile(r"ray::IDLE")),
    ("other ray actor", re.compile(r"^ray::")),
    ("ray core", re.compile(r"raylet|gcs_server|dashboard|log_monitor|runtime_env|monitor\.py")),
)
_ROLE = re.compile(r"ServeReplica:\w+:LLMServer:(\w+)")


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    kind: str
    role: str | None  # the engine this process belongs to (chat, guard, ...) or None
    pss: int


@dataclass(frozen=True)
class Footprint:
    processes: tuple[ProcessMemory, ...]

    @property
    def pss(self) -> int:
        return sum(p.pss for p in self.processes)

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """kind -> (processes, PSS bytes), largest first."""
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for p in self.processes:
            out[p.kind][0] += 1
            out[p.kind][1] += p.pss
        return {k: (n, b) for k, (n, b) in sorted(out.items(), key=lambda kv: -kv[1][1])}

    def by_role(self) -> dict[str, int]:
        """engine role -> PSS bytes of its replica, engine core and workers."""
        out: dict[str, int] = defaultdict(int)
        for p in self.processes:
            if p.role:
                out[p.role] += p.pss
        return dict(sorted(out.items()))

    def summary(self) -> str:
        """One line: total PSS, then each kind."""
        kinds = ", ".join(f"{k} {n}x {b / GiB:.2f}" for k, (n, b) in self.by_kind().items())
        return f"{self.pss / GiB:.1f} GiB PSS over {len(self.processes)} processes ({kinds})"


def _kind(title: str) -> str:
    for kind, pattern in _KINDS:
        if pattern.search(title):
            return kind
    return "other"


def measure(root_pid: int, root_kind: str = "driver") -> Footprint:
    """PSS of `root_pid` and every process under it, each labelled with its kind and engine."""
    root = psutil.Process(root_pid)
    procs = [root, *root.children(recursive=True)]
    titles: dict[int, str] = {}
    parents: dict[int, int] = {}
    rows: list[tuple[psutil.Process, Any]] = []
    for p in procs:
        try:
            titles[p.pid] = " ".join(p.cmdline()) or p.name()
            parents[p.pid] = p.ppid()
            rows.append((p, p.memory_full_info()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue

    def role_of(pid: int) -> str | None:
        for _ in range(8):  # replica -> engine core -> worker: a few levels at most
            m = _ROLE.search(titles.get(pid, ""))
            if m:
                return m.group(1)
            if pid not in parents:
                return None
            pid = parents[pid]
        return None

    out = [
        ProcessMemory(
            pid=p.pid,
            kind=root_kind if p.pid == root_pid else _kind(titles[p.pid]),
            role=role_of(p.pid),
            pss=int(getattr(mem, "pss", mem.rss)),
        )
        for p, mem in rows
    ]
    return Footprint(tuple(out))
