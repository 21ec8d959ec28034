"""Bounds on structured output (JSON schema, regex, grammar, choice), checked at the edge.

A structured-output request makes the chat engine build a grammar before its first
token: xgrammar compiles it ahead (vLLM's first choice), llguidance walks it lazily
(the fallback, and what the CPU profile's schemas mostly get). Either can be made to
cost seconds or fail inside the engine by a small, valid request. Measured with
`scripts/measure_schema_limits.py` (xgrammar 1 thread, Qwen2.5 tokenizer; 2-core
Xeon, AMX/AVX512-BF16):

| schema | compile |
|---|---|
| enum of 2,000 / 5,000 / 20,000 30-character strings (68 / 170 / 680 KB) | 0.22 / 0.84 / 8.5 s |
| 100 / 200 optional properties | 0.11 / 0.36 s; llguidance fails (a 500) at 800 |
| 1,000 required properties | 0.13 s |
| pattern `(a|bc){1,2000}` (47 bytes) | 0.58 s |
| 300 nested objects | a 500: Ray cannot pickle a body that deep |

So each limit below keeps a worst case near 0.2 s of compile on this CPU, well past
what a real schema needs (OpenAI's own structured outputs allow 1,000 enum values,
5,000 properties and 10 levels of nesting). Past a limit the request is refused with
a 400 naming the field, before any engine sees it. The limits are published in the
chat model's `/v1/models` metadata (`rag.limits`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["SCHEMA_LIMITS", "SchemaLimits", "check_regex", "check_schema", "check_tools_schema"]


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int = 64 << 10  # the spec as JSON (or the regex / grammar text)
    max_depth: int = 32  # JSON nesting inside one schema
    max_enum_values: int = 2000  # enum + const values, and `choice` options, in total
    max_properties: int = 1000  # object properties in total
    max_optional_properties: int = 128  # of those, not in their object's `required`
    max_repeat: int = 256  # the largest {m,n} bound in a regex or a schema's `pattern`

    def as_dict(self) -> dict[str, int]:
        return {f"schema_{k}": v for k, v in asdict(self).items()}


SCHEMA_LIMITS = SchemaLimits()
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def _walk(node: Any, depth: int = 1) -> Iterator[tuple[Any, int]]:
    yield node, depth
    if isinstance(node, dict):
        for value in node.values():
            yield from _walk(value, depth + 1)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value, depth + 1)


def check_regex(pattern: str, param: str, limits: SchemaLimits = SCHEMA_LIMITS) -> str | None:
    """None, or why this regex is refused."""
    if len(pattern.encode("utf-8", "surrogatepass")) > limits.max_bytes:
        return f"{param} is longer than {limits.max_bytes} bytes"
    for low, high in _REPEAT.findall(pattern):
        bound = max(int(low), int(high or 0))
        if bound > limits.max_repeat:
            return (
                f"{param} repeats {{{low},{high}}}: bounds above {limits.max_repeat} make the grammar "
                "too costly to build; use a smaller bound or maxLength"
            )
    return None


def _ref_cycle(schema: dict[str, Any]) -> str | None:
    """A `$ref` chain that comes back to itself through nothing but references (no
    object or array in between): no JSON value can ever satisfy it."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})} if isinstance(schema, dict) else {}

    def target(ref: str) -> Any:
        if ref == "#":
            return schema
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix):
                return defs.get(ref[len(prefix) :])
        return None

    def refs_only(node: Any) -> list[str]:
        """The refs a node is made of, when it is nothing but refs (else [])."""
        if not isinstance(node, dict):
            return []
        if "$ref" in node and set(node) <= {"$ref", "$defs", "definitions", "description", "title"}:
            return [node["$ref"]] if isinstance(node["$ref"], str) else []
        for key in ("allOf", "anyOf", "oneOf"):
            parts = node.get(key)
            if isinstance(parts, list) and parts and set(node) <= {key, "$defs", "definitions", "title"}:
                nested = [refs_only(p) for p in parts]
                if all(nested):
                    return [r for rs in nested for r in rs]
        return []

    for start in ["#", *(f"#/$defs/{k}" for k in schema.get("$defs", {}))]:
        seen, todo = set(), [start]
        while todo:
            ref = todo.pop()
            if ref in seen:
                return ref
            seen.add(ref)
            todo.extend(refs_only(target(ref)))
    return None


def check_schema(schema: Any, param: str, limits: SchemaLimits = SCHEMA_LIMITS) -> str | None:
    """None, or why this JSON schema is refused."""
    size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        return f"{param} is {size} bytes as JSON; the limit is {limits.max_bytes}"
    enums, properties, optional = 0, 0, 0
    for node, depth in _walk(schema):
        if depth > limits.max_depth:
            return f"{param} nests deeper than {limits.max_depth} levels"
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("enum"), list):
            enums += len(node["enum"])
        enums += 1 if "const" in node else 0
        props = node.get("properties")
        if isinstance(props, dict) and node.get("type", "object") == "object":
            listed = node.get("required")
            required: list[Any] = listed if isinstance(listed, list) else []
            properties += len(props)
            optional += sum(1 for name in props if name not in required)
        if isinstance(node.get("pattern"), str) and (
            why := check_regex(node["pattern"], f"{param} pattern", limits)
        ):
            return why
    if enums > limits.max_enum_values:
        return f"{param} lists {enums} enum/const values; the limit is {limits.max_enum_values} in total"
    if properties > limits.max_properties:
        return f"{param} has {properties} properties; the limit is {limits.max_properties} in total"
    if optional > limits.max_optional_properties:
        return (
            f"{param} has {optional} optional properties (not in `required`); the limit is "
            f"{limits.max_optional_properties}: each one multiplies the grammar's states; "
            "list them in `required`"
        )
    if isinstance(schema, dict) and (ref := _ref_cycle(schema)):
        return (
            f"{param} refers to itself ({ref!r}) with nothing in between, so no JSON value satisfies it; "
            "put the recursion inside an object or array property"
        )
    return None


def check_tools_schema(parameters: Any, param: str) -> str | None:
    """With tool_choice="required" vLLM joins every tool's parameters into one schema,
    where a root reference no longer means this tool's parameters (a 500 inside the
    engine; only `$defs` are carried over): refuse any other `#...` reference there."""
    for node, _ in _walk(parameters):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref.startswith("#") and not ref.startswith("#/$defs/"):
                return (
                    f'{param} holds "$ref": {ref!r}; with tool_choice="required" the tools\' parameters '
                    "are joined into one schema where that no longer points here; move the shared part "
                    'under "$defs" and refer to "#/$defs/NAME"'
                )
    return None
