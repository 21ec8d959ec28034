"""The boundary's body checks and structured-output limits, without a stack; the same
classes go through the real stack in tests/test_edge.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rag.stack.ingress import MAX_JSON_DEPTH, check_json
from rag.stack.structured import SCHEMA_LIMITS, check_regex, check_schema, check_tools_schema


def props(n: int, required: bool = False) -> dict[str, Any]:
    names = [f"p{i}" for i in range(n)]
    return {
        "type": "object",
        "properties": {k: {"type": "string"} for k in names},
        "required": names if required else [],
    }


MUTUAL = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
DEEP_BODY = json.dumps({"x": json.loads("[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5))}).encode()
TREE = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["name", "children"],
}


def nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


@pytest.mark.parametrize(
    "schema",
    [
        TREE,  # recursion through an array: a real, satisfiable schema
        {"enum": [f"v{i}" for i in range(SCHEMA_LIMITS.max_enum_values)]},
        props(100),
        {"type": "string", "pattern": "^[a-z]{1,64}$"},
        nested(8),
    ],
    ids=["tree", "enum-at-limit", "100-optional", "pattern", "depth-8"],
)
def test_real_schemas_pass(schema: dict[str, Any]) -> None:
    assert check_schema(schema, "response_format.json_schema.schema") is None


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"enum": [f"v{i}" for i in range(SCHEMA_LIMITS.max_enum_values + 1)]}, "enum/const values"),
        (props(200), "optional properties"),
        (props(1200, required=True), "1200 properties"),
        (nested(40), "nests deeper"),
        ({"type": "string", "pattern": "(a|bc){1,2000}"}, "repeats"),
        ({"enum": ["x" * 70_000]}, "bytes as JSON"),
        ({"$ref": "#"}, "refers to itself"),
        ({"anyOf": [{"$ref": "#"}]}, "refers to itself"),
        (MUTUAL, "refers to itself"),
    ],
    ids=["enum", "optional", "properties", "depth", "repeat", "bytes", "self", "anyOf-self", "mutual"],
)  # fmt: skip
def test_costly_or_unsatisfiable_schemas_are_refused_naming_the_limit(
    schema: dict[str, Any], needle: str
) -> None:
    why = check_schema(schema, "response_format.json_schema.schema")
    assert why is not None and needle in why and why.startswith("response_format.json_schema.schema")


def test_regex_limits() -> None:
    assert check_regex("[0-9]{3}-[0-9]{4}", "structured_outputs.regex") is None
    assert "repeats" in (check_regex("a{300}", "structured_outputs.regex") or "")
    assert check_regex(r"a\{300}", "structured_outputs.regex") is None  # an escaped brace is a literal


def test_root_references_in_tools_are_refused_when_tool_choice_joins_them() -> None:
    assert (
        check_tools_schema({"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}}, "tools[0]") is None
    )
    why = check_tools_schema(
        {"type": "object", "properties": {"x": {"$ref": "#"}}}, "tools[0].function.parameters"
    )
    assert why is not None and "$defs" in why and why.startswith("tools[0].function.parameters")


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        (b'{"model": "chat", "messages": [{"role": "user", "content": "hi \\ud800 there"}]}',
         "messages[0].content", "unpaired UTF-16 surrogate (\\ud800)"),
        (b'{"input": ["ok", "x \\udc00"]}', "input[1]", "\\udc00"),
        (b'{"a": "\\ud83d"}', "a", "surrogate"),
        (b"{not json", None, "not valid JSON"),
        (b'{"a": "\xff"}', None, "not UTF-8"),
        (DEEP_BODY, "x[0][0]", "nests deeper"),
        (b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, "nests deeper"),
    ],
    ids=["high", "low", "lone-high-at-end", "not-json", "not-utf8", "deep", "very-deep"],
)  # fmt: skip
def test_bodies_an_engine_would_fail_on_are_refused_naming_the_field(
    body: bytes, param: str | None, needle: str
) -> None:
    refusal = check_json(body)
    assert refusal is not None and refusal.status == 400 and needle in refusal.message, refusal
    assert refusal.param == param


def test_valid_bodies_pass_including_paired_surrogates_and_token_ids() -> None:
    assert check_json(b'{"content": "ok \\ud83d\\ude00 \\u00e9"}') is None
    assert check_json(json.dumps({"input": [[1, 2, 3] * 500] * 64}).encode()) is None
    assert (
        check_json(json.dumps({"x": json.loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)}).encode())
        is None
    )
