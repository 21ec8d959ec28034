"""Ten times the chat engine's batch at once, from several client processes, against a running stack.

What a burst of users sees at the edge: how many were served, how many refused
with 429 and Retry-After, how long the slowest refusal took, and how /v1/models
answered meanwhile, each timed by the process that sent it (rag/bench/probes.py
`overload`). `rag bench` runs the same probe in its extras; this runs it alone,
several times, and writes what it measured to a JSON file.

    .venv/bin/rag serve &                        # or any stack: RAG_BASE_URL, RAG_API_KEY
    .venv/bin/python scripts/overload.py --clients 4 --runs 3 --out bench/results/cpu/overload.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rag.bench.probes import overload
from rag.bench.report import machine
from rag.settings import Settings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="the stack's base URL [default: RAG_BASE_URL]")
    p.add_argument("--clients", type=int, default=4, help="client processes sharing the burst")
    p.add_argument("--factor", type=int, default=10, help="the burst, in chat batches")
    p.add_argument("--runs", type=int, default=3, help="bursts, one after another")
    p.add_argument(
        "--pool",
        type=int,
        default=0,
        help="connections per client, as a client's pool caps them (0: one per request)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the runs here as JSON")
    args = p.parse_args()
    s = Settings.from_env()
    url = (args.url or s.base_url).rstrip("/")
    runs = []
    for i in range(args.runs):
        r = overload(url, s.chat_model, factor=args.factor, clients=args.clients, pool=args.pool)
        runs.append(r)
        print(
            f"run {i + 1}: {r['concurrent']} chats from {r['clients']} processes "
            f"({r['connections_per_client']} connections each): {r['served']} served, "
            f"{r['refused']} refused (p50 {r['refusal_p50_s']} s, max {r['refusal_max_s']} s), "
            f"other {r['other_status']}, hung {r['hung']}, connection errors {r['connection_errors']}; "
            f"/v1/models p50 {r['models_p50_s']} s, max {r['models_max_s']} s "
            f"over {r['models_polls']} polls; "
            f"the machine paused {r['paused_before_last_refusal_s']} s before the slowest refusal "
            f"(longest pause {r['pause_max_s']} s, watcher at nice {r['pause_watcher_nice']})",
            file=sys.stderr,
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine(), "url": url, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
