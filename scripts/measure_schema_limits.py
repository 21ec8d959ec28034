"""How long xgrammar takes to compile the structured-output schemas that cost the most,
on this CPU: the measurements behind rag/stack/structured.py's limits.

xgrammar is vLLM's first choice of backend and compiles a grammar before the first
token (llguidance, the fallback, walks it lazily). One thread, no cache, the chat
model's tokenizer from the prepared CPU weights. Needs no stack.

    .venv/bin/python scripts/measure_schema_limits.py            # the table
    .venv/bin/python scripts/measure_schema_limits.py --quick    # the sizes at the limits only
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.stack.hardware import detect
from rag.stack.profiles import default_models_dir
from rag.stack.structured import SCHEMA_LIMITS

random.seed(0)
VALUES = ["".join(random.choices(string.ascii_letters + " ", k=30)) for _ in range(20_000)]


def enum(n: int) -> dict[str, Any]:
    return {"enum": VALUES[:n]}


def optional(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


def required(n: int) -> dict[str, Any]:
    return {**optional(n), "required": [f"p{i}" for i in range(n)]}


def nested(n: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(n):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


def repeat(n: int) -> dict[str, Any]:
    return {"type": "string", "pattern": f"(a|bc){{1,{n}}}"}


FAMILIES: dict[str, tuple[Callable[[int], dict[str, Any]], list[int], int]] = {
    # name: (schema of size n, sizes, the limit in structured.py)
    "enum values (30 chars)": (enum, [500, 2000, 5000, 20000], SCHEMA_LIMITS.max_enum_values),
    "optional properties": (optional, [50, 100, 200], SCHEMA_LIMITS.max_optional_properties),
    "required properties": (required, [300, 1000], SCHEMA_LIMITS.max_properties),
    "nested objects": (nested, [10, 30, 60], SCHEMA_LIMITS.max_depth // 2),  # two levels each
    "pattern {1,n}": (repeat, [256, 2000], SCHEMA_LIMITS.max_repeat),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="only the sizes at each limit")
    args = parser.parse_args()
    import xgrammar as xgr
    from transformers import AutoTokenizer

    folder = next(default_models_dir().glob("qwen2.5-coder-0.5b-instruct*"), None)
    if folder is None:
        sys.exit(f"no prepared chat weights in {default_models_dir()}: run `rag prepare` first")
    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(folder))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    print(f"# {detect().describe()}; xgrammar, 1 thread, {folder.name} tokenizer")
    print("| schema | n | bytes | compile s |\n|---|---|---|---|")
    for name, (make, sizes, limit) in FAMILIES.items():
        for n in [limit] if args.quick else sorted({*sizes, limit}):
            text = json.dumps(make(n))
            start = time.perf_counter()
            compiler.compile_json_schema(text)
            mark = " (limit)" if n == limit else ""
            print(f"| {name} | {n}{mark} | {len(text)} | {time.perf_counter() - start:.2f} |", flush=True)


if __name__ == "__main__":
    main()
