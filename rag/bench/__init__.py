"""`rag bench`: the stack's chat engine against bare vLLM and one-request-at-a-time `generate`.

The CLI (rag/cli/benchmark.py) starts each system, sweeps it over concurrency
levels with the same seeded workload and stops it before the next one starts, so
no two share cores; then it writes the report.

workload.py  the load generator: seeded prompts, streamed requests, the sweep in waves, its knee
systems.py   the systems it starts: the stack (`rag serve`), bare vLLM on the chat engine's
             settings, and the baseline (rag.baseline)
probes.py    the extras: embeddings and score throughput, `rag ask` stage latency and
             time to its first shown word,
             overload behaviour, query cost besides the models
report.py    what was measured on, and bench.json, bench.md and bench.png
stats.py     the one percentile every table uses
"""
