"""Where each system's model computed: its threads and the cores they were allowed, as run.

A side-by-side is fair only if both sides compute on the same cores with the same
threads. Settings alone do not show it: bare vLLM's default
`VLLM_CPU_OMP_THREADS_BIND=auto` reserves one core of two for its scheduler and binds
the model to the other, whatever OMP_NUM_THREADS says. So the bench reads it off
the running system: `Watch` takes every process of a system's session before and
after its sweep, and `Watch.report` names the process that burned the most CPU
(the model's), how many of its threads did real work, and which cores each was
allowed (`sched_getaffinity` per thread). bench.md prints it per system beside
the settings the system was started with (`declared`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

__all__ = ["Watch", "core_list", "describe"]

BUSY_THREAD_S = 0.5  # a thread with less CPU than this over a sweep did no compute


def core_list(cores: Iterable[int]) -> str:
    """`[0, 1, 2, 5]` as `0-2,5`, the form VLLM_CPU_OMP_THREADS_BIND and taskset take."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cores)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _threads(p: psutil.Process) -> dict[int, float]:
    """CPU seconds per live thread, and under key 0 the process's own total, which
    keeps the time of threads that have ended (a server's thread per request)."""
    with contextlib.suppress(psutil.Error):
        times = p.cpu_times()
        return {t.id: t.user_time + t.system_time for t in p.threads()} | {0: times.user + times.system}
    return {}


def _affinity(tid: int) -> str:
    try:
        return core_list(os.sched_getaffinity(tid))
    except OSError:  # the thread ended
        return "?"


@dataclass
class Watch:
    """CPU time per thread of each process in `procs()`, taken at `start` and compared at `report`."""

    procs: Any  # Callable[[], list[psutil.Process]]: the system's processes, asked again each time
    before: dict[int, dict[int, float]] = field(default_factory=dict)

    def start(self) -> None:
        self.before = {p.pid: _threads(p) for p in self.procs()}

    def report(self, declared: dict[str, str]) -> dict[str, Any]:
        """The busiest process since `start`: its name, CPU seconds, busy threads and their cores."""
        best: tuple[float, psutil.Process, dict[int, float]] | None = None
        total = 0.0
        for p in self.procs():
            now = _threads(p)
            was = self.before.get(p.pid, {})
            delta = {tid: t - was.get(tid, 0.0) for tid, t in now.items()}
            spent = delta.pop(0, 0.0)
            total += spent
            if best is None or spent > best[0]:
                best = (spent, p, delta)
        out: dict[str, Any] = {"declared": declared}
        if best is None:
            return out
        spent, p, delta = best
        busy = sorted((tid for tid, t in delta.items() if t >= BUSY_THREAD_S), key=lambda tid: -delta[tid])
        name = "?"
        with contextlib.suppress(psutil.Error):
            name = p.name()
        out["measured"] = {
            "process": name,
            "cpu_s": round(spent, 1),
            "share_of_system_cpu": round(spent / total, 2) if total else None,
            "busy_threads": len(busy),
            "thread_cores": [_affinity(tid) for tid in busy],
            "thread_cpu_s": [round(delta[tid], 1) for tid in busy],
        }
        return out


def describe(compute: dict[str, Any]) -> str:
    """One line for bench.md: `OMP_NUM_THREADS=2, ...; ran: ray::ServeReplica 2 busy threads on 0-1, 0-1`."""
    declared = ", ".join(f"{k}={v}" for k, v in (compute.get("declared") or {}).items()) or "-"
    m = compute.get("measured")
    if not m:
        return f"{declared}; not measured (a system the bench did not start)"
    cores = ", ".join(m["thread_cores"]) or "-"
    return (
        f"{declared}; ran: `{m['process']}` {m['cpu_s']} s of CPU ({m['share_of_system_cpu']} of the "
        f"system's), {m['busy_threads']} busy threads allowed on cores {cores}"
    )
