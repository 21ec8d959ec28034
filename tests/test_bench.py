"""`rag bench`: its workload, knee and percentile; bare vLLM's command from the chat engine's
config; stopping the systems it starts (nothing of theirs outlives the bench); and a smoke
run with tiny parameters, all three systems, every output file. No timing is asserted."""

from __future__ import annotations

import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from rag.bench import probes
from rag.bench.compute import Watch, core_list, describe
from rag.bench.stats import percentile
from rag.bench.systems import bare_binding, bare_command
from rag.bench.workload import knee, workload
from rag.cli import main
from rag.errors import ServeError
from rag.stack.process import Managed
from tests.conftest import Stack


def test_workload_is_seeded_and_varied() -> None:
    a, b = workload(6, seed=3), workload(6, seed=3)
    assert a == b and a != workload(6, seed=4)
    assert len({len(p.split()) for p in a}) > 1


def test_knee_is_the_last_level_before_throughput_flattens() -> None:
    levels = [
        {"concurrency": c, "output_tokens_per_s": t}
        for c, t in [(1, 10), (2, 19), (4, 35), (8, 36), (16, 50)]
    ]
    assert knee(levels) == 4
    assert knee(levels[:3]) is None


def test_percentile_is_the_inclusive_quantile_and_copes_with_few_values() -> None:
    xs = [0.9, 0.1, 0.5, 0.3]
    assert percentile(xs, 50) == statistics.quantiles(xs, n=100, method="inclusive")[49] == 0.4
    assert percentile([float(v) for v in range(1, 102)], 95) == 96.0
    assert percentile([0.123456], 99, 4) == 0.1235  # one value: that value, not an error
    assert percentile([], 50) is None


LEAVES_A_CHILD = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(sys.argv[1], "w").write(str(child.pid))
    print("http://127.0.0.1:1/v1", flush=True)
    time.sleep(120)
    """
)


def test_the_pause_watcher_reports_late_wake_ups_beyond_its_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_watch_pauses` on a scripted clock: wake-ups on time are no pause, a late one is
    reported as the time beyond its tick, with when it ended."""

    class Clock:
        now = 100.0
        naps = iter([0.005, 0.005, 0.305, 0.005, 0.049, 0.205])  # each sleep's real length

    class Stop:
        calls = 0

        def is_set(self) -> bool:
            self.calls += 1
            return self.calls > 6

    def sleep(s: float) -> None:
        Clock.now += next(Clock.naps, s) if s == 0.005 else max(s, 0.0)

    monkeypatch.setattr(probes.time, "sleep", sleep)
    monkeypatch.setattr(probes.time, "perf_counter", lambda: Clock.now)
    monkeypatch.setattr(probes.time, "time", lambda: Clock.now)
    asked: list[tuple[int, ...]] = []  # not this test process's priority: record the call
    monkeypatch.setattr(probes.os, "setpriority", lambda *a: asked.append(a))
    nice, pauses = probes._watch_pauses(start_at=100.0, stop=Stop())
    assert asked == [(os.PRIO_PROCESS, 0, -20)] and nice == os.getpriority(os.PRIO_PROCESS, 0)
    assert [(round(t, 3), round(p, 3)) for t, p in pauses] == [(0.315, 0.3), (0.574, 0.2)]


def test_bare_vllm_gets_the_chat_engines_arguments_and_engine_environment() -> None:
    from ray.serve.llm import LLMConfig

    cfg = LLMConfig(
        model_loading_config={"model_id": "chat", "model_source": "/models/qwen"},
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "RAYLLM_VLLM_ENGINE_CLS": "x.Engine", "A": "b"}},
        engine_kwargs={"dtype": "bfloat16", "enforce_eager": True, "max_num_seqs": 64,
                       "hf_overrides": {"architectures": ["Q"]}, "enable_chunked_prefill": False},
    )  # fmt: skip
    cmd, env = bare_command(cfg, 8303)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    flags = " ".join(cmd[3:])
    assert "--model /models/qwen --served-model-name chat --host 127.0.0.1 --port 8303" in flags
    assert "--dtype bfloat16 --enforce-eager --max-num-seqs 64" in flags
    assert '--hf-overrides {"architectures": ["Q"]}' in flags and "--no-enable-chunked-prefill" in flags
    assert env["OMP_NUM_THREADS"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    # One thread, free on this process's cores as the stack's is: not vLLM's `auto`,
    # which reserves a core and pins the model to the rest.
    cores = os.sched_getaffinity(0)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == ("nobind" if len(cores) > 1 else core_list(cores))
    assert (
        "RAYLLM_VLLM_ENGINE_CLS" not in env or env["RAYLLM_VLLM_ENGINE_CLS"] != "x.Engine"
    )  # Ray's, not vLLM's
    assert env.get("A") != "b"


def test_stopping_a_started_system_kills_what_outlived_ctrl_c(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    cmd = [sys.executable, "-c", LEAVES_A_CHILD, str(pid_file)]
    server = Managed("a server", cmd, tmp_path / "server.log", 60, lambda m: None)
    assert server.url == "http://127.0.0.1:1/v1"
    child = int(pid_file.read_text())
    assert server.stop(timeout_s=30) == [child]  # Ctrl-C ended the server, not its child
    assert gone(child, within_s=10)


def gone(pid: int, within_s: float) -> bool:
    """Whether `pid` has exited (a zombie has) within `within_s`: a kill lands a moment later."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_system_that_prints_no_url_is_stopped_and_named(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "print('not ready')"]
    with pytest.raises(ServeError, match=r"a server did not start in 60 s; see .*server\.log"):
        Managed("a server", cmd, tmp_path / "server.log", 60, lambda m: None)


@pytest.mark.stack
def test_bench_smoke_against_the_stack_and_a_started_baseline(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--levels",
            "1,2",
            "--min-requests",
            "2",
            "--max-tokens",
            "4",
            "--waves",
            "1",
            "--systems",
            "ours,bare,baseline",
            "--no-extras",
            "--ours-url",
            stack.base_url,
            "--out",
            str(out),
            "--port",
            "8390",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert list(report["systems"]) == ["ours", "bare", "baseline"]  # in the order asked, one at a time
    for name in ("ours", "bare", "baseline"):
        levels = report["systems"][name]["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 2]
        assert all(lv["errors"] == 0 and lv["requests"] == 2 for lv in levels)
        assert all(lv["output_tokens_per_s"] > 0 and lv["ttft_p50_s"] <= lv["latency_p50_s"] for lv in levels)
    targets = report["targets"]
    assert targets["ours_over_bare_ttft_p50_at_1"] > 0
    assert set(targets["ours_over_bare_tokens_per_s"]) == {"1", "2"}  # a ratio per level
    assert all(r > 0 for r in targets["ours_over_baseline_tokens_per_s"].values())
    assert "ours/bare tok/s" in (out / "bench.md").read_text()
    assert (out / "logs" / "bare.log").stat().st_size > 0  # vLLM logged its boot there
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "| concurrency |" in (out / "bench.md").read_text()


def test_bare_vllm_computes_on_every_core_the_stacks_chat_engine_may_use() -> None:
    assert bare_binding(2, {0, 1}) == "0-1"  # vLLM then runs a thread per listed core, none reserved
    assert bare_binding(5, {0, 1, 2, 3, 6}) == "0-3,6"
    assert bare_binding(1, {0, 1}) == "nobind"  # one thread free on both, as the stack's


def test_the_bench_reads_which_threads_computed_and_on_which_cores() -> None:
    import threading

    stop = time.monotonic() + 3  # two threads share the GIL: over 0.5 s each (BUSY_THREAD_S)
    done = threading.Event()

    def spin() -> None:
        while time.monotonic() < stop:
            pass

    def worker_spin() -> None:
        spin()
        done.wait(30)  # alive while the watch reads it: an ended thread has no CPU time to read

    watch = Watch(lambda: [psutil.Process()])
    watch.start()
    worker = threading.Thread(target=worker_spin)
    worker.start()
    spin()
    got = watch.report({"OMP_NUM_THREADS": "2"})
    done.set()
    worker.join()
    measured = got["measured"]
    assert measured["busy_threads"] == 2 and measured["cpu_s"] >= 1.0
    assert set(measured["thread_cores"]) == {core_list(os.sched_getaffinity(0))}
    line = describe(got)
    assert line.startswith("OMP_NUM_THREADS=2; ran: ") and "2 busy threads" in line
    assert "not measured" in describe({"declared": {"A": "1"}})
