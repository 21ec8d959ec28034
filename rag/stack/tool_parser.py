"""`hermes_json`: vLLM's hermes tool parser, plus the bare JSON call small Qwen models write.

Qwen2.5 and Qwen3 are trained to wrap a call in <tool_call>...</tool_call>, which
vLLM's `hermes` parser reads. The CPU profile's Qwen2.5-Coder-0.5B (Q4_K_M) writes
the same JSON without the tags: `{"name": "get_weather", "arguments": {...}}`, so
`hermes` returned it as text (0 of 10 calls parsed, measured). This parser takes
a reply that is nothing but such an object (optionally in a ```json fence), naming
one of the request's tools with object arguments, as that call; anything else is
left to hermes. Streamed replies are parsed by hermes alone.

Registered in the engine replica by `rag.stack.engine_hooks.Engine` (Ray does not
load vLLM's tool_parser_plugin); the CPU chat config names it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

__all__ = ["NAME", "HermesOrBareJson", "bare_call"]

NAME = "hermes_json"
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def bare_call(text: str, tool_names: set[str]) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) if `text` is exactly one call of a declared tool, else None."""
    text = text.strip()
    if m := _FENCE.match(text):
        text = m.group(1)
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or set(obj) - {"name", "arguments"}:
        return None
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if name not in tool_names or not isinstance(arguments, dict):
        return None
    return str(name), arguments


class HermesOrBareJson(Hermes2ProToolParser):
    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        info = super().extract_tool_calls(model_output, request)
        if info.tools_called or getattr(request, "tool_choice", None) == "none":
            return info
        names = {t.function.name for t in (getattr(request, "tools", None) or [])}
        call = bare_call(model_output, names)
        if call is None:
            return info
        name, arguments = call
        tool_call = ToolCall(
            type="function",
            function=FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)),
        )
        return ExtractedToolCallInformation(tools_called=True, tool_calls=[tool_call], content=None)


def register() -> None:
    """Make `hermes_json` known to vLLM in this process (idempotent)."""
    ToolParserManager.register_module(NAME, force=True, module=HermesOrBareJson)
