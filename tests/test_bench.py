"""A smoke run of `rag bench`: tiny parameters, both systems, every output file. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag.bench import knee, workload
from rag.cli import main
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
    for name in ("ours", "baseline"):
        levels = report["systems"][name]["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 2]
        assert all(lv["errors"] == 0 and lv["requests"] == 2 for lv in levels)
        assert all(lv["output_tokens_per_s"] > 0 and lv["ttft_p50_s"] <= lv["latency_p50_s"] for lv in levels)
    assert report["targets"]["ttft_ratio_at_1"] is not None
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "| concurrency |" in (out / "bench.md").read_text()
