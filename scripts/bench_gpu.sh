#!/usr/bin/env bash
# The same benchmark on one GPU, in under 10 minutes: the GPU profile's four engines
# side by side (`rag serve --profile gpu`), the chat engine swept over concurrency
# 1..64 against one-request-at-a-time `generate` on the same weights, then
# embeddings, score and `rag ask` stage latency. Results land in bench/results/gpu.
#
# Needs: a CUDA machine with `pip install -e '.[gpu,dev]'` done, and the four GPU
# models in the Hugging Face cache (or hub access): Qwen/Qwen3-4B-Instruct-2507-FP8,
# Qwen/Qwen3Guard-Gen-4B, BAAI/bge-small-en-v1.5, BAAI/bge-reranker-base.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAG_PROFILE=gpu
OUT=${OUT:-bench/results/gpu}
BASELINE_MODEL=${BASELINE_MODEL:-Qwen/Qwen3-4B-Instruct-2507-FP8}

rag check                      # fail in seconds, not minutes into the boot
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee /dev/stderr >/dev/null
# ~3 min boot, ~1 min ours (64 tokens x up to 64 requests), ~4 min baseline, ~1 min extras.
timeout 570 rag bench \
  --levels 1,2,4,8,16,32,64 --min-requests 8 --max-tokens 64 \
  --baseline-model "$BASELINE_MODEL" --out "$OUT"
