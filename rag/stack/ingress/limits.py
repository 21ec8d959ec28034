"""What one request may ask of one engine, checked before any engine sees it.

The limits come from each engine's batch (`Limits`, `limits_for`): sequences per
chat or completions request, inputs per embeddings call, query-document pairs per
score or rerank call. Messages may carry only the roles in ROLES_ALLOWED, and
structured-output specs (response_format, structured_outputs, forced tools' schemas)
are held to rag/stack/structured.py's SCHEMA_LIMITS. A failed check is a `Refusal`:
what is wrong, which field, and its status, which rag.stack.ingress.errors turns
into the OpenAI error shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
)

from rag.stack.structured import SCHEMA_LIMITS, check_regex, check_schema, check_tools_schema

__all__ = [
    "ROLES_ALLOWED",
    "Limits",
    "Refusal",
    "check_chat",
    "check_completion",
    "check_embeddings",
    "check_score",
    "limits_for",
]

ROLES_ALLOWED = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Limits:
    """What one request may ask of one engine, derived from the engine's batch.

    A chat request may take a quarter of the chat engine's batch (`n` x prompts),
    so no single caller holds the engine; an embeddings call up to four batches of
    inputs (a pooling engine clears a batch in one step); a score or rerank call up
    to two batches of pairs.
    """

    batch: int  # the engine's max_num_seqs
    max_sequences: int  # chat / completions: n x prompts
    max_inputs: int  # embeddings: inputs per call
    max_pairs: int  # score / rerank: query-document pairs per call

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def limits_for(engine_kwargs: Mapping[str, Any]) -> Limits:
    """The request limits for an engine with these engine_kwargs."""
    batch = int(engine_kwargs.get("max_num_seqs") or 32)
    return Limits(batch=batch, max_sequences=max(1, batch // 4), max_inputs=4 * batch, max_pairs=2 * batch)


@dataclass(frozen=True)
class Refusal:
    """A request refused at the boundary: what is wrong, which field, and its status."""

    message: str
    param: str | None = None
    status: int = 400


def _role_of(message: Any) -> Any:
    if isinstance(message, Mapping):
        return message.get("role")
    return getattr(message, "role", None)


def _check_roles(messages: Any) -> Refusal | None:
    for i, message in enumerate(messages or ()):
        role = _role_of(message)
        if role not in ROLES_ALLOWED:
            return Refusal(
                f"messages[{i}].role is {role!r}; allowed roles are {', '.join(ROLES_ALLOWED)}",
                f"messages[{i}].role",
            )
    return None


def _structured(body: Any) -> Refusal | None:
    """Structured-output specs of a chat or completions request, held to SCHEMA_LIMITS."""
    why: str | None = None
    fmt = getattr(body, "response_format", None)
    schema = getattr(getattr(fmt, "json_schema", None), "json_schema", None)
    if getattr(fmt, "type", None) == "json_schema" and isinstance(schema, dict):
        why = check_schema(schema, "response_format.json_schema.schema")
    spec = getattr(body, "structured_outputs", None)
    if why is None and spec is not None:
        json_spec = getattr(spec, "json", None)
        if isinstance(json_spec, str):
            try:
                json_spec = json.loads(json_spec)
            except ValueError:
                return Refusal("structured_outputs.json is not valid JSON", "structured_outputs.json")
        if json_spec is not None:
            why = check_schema(json_spec, "structured_outputs.json")
        for name in ("regex", "grammar", "whitespace_pattern", "structural_tag"):
            text = getattr(spec, name, None)
            if why is None and isinstance(text, str):
                why = check_regex(text, f"structured_outputs.{name}")
        choice = getattr(spec, "choice", None)
        if why is None and isinstance(choice, list) and len(choice) > SCHEMA_LIMITS.max_enum_values:
            limit = SCHEMA_LIMITS.max_enum_values
            why = f"structured_outputs.choice has {len(choice)} options; the limit is {limit}"
    tools = getattr(body, "tools", None) or []
    choice_of_tool = getattr(body, "tool_choice", None)
    forced = choice_of_tool == "required" or (
        choice_of_tool is not None and not isinstance(choice_of_tool, str)
    )
    for i, tool in enumerate(tools if forced else []):
        parameters = getattr(getattr(tool, "function", None), "parameters", None)
        if why is None and isinstance(parameters, dict):
            param = f"tools[{i}].function.parameters"
            why = check_schema(parameters, param) or (
                check_tools_schema(parameters, param) if choice_of_tool == "required" else None
            )
    if why is None:
        return None
    return Refusal(why, why.split(" ", 1)[0])


def check_chat(body: ChatCompletionRequest, limits: Limits) -> Refusal | None:
    """Roles, sequences and structured-output specs of one chat completion request."""
    if refusal := _check_roles(body.messages):
        return refusal
    if refusal := _structured(body):
        return refusal
    n = body.n or 1
    if n > limits.max_sequences:
        return Refusal(
            f"n={n} asks for more sequences than one request may take from this engine "
            f"(at most {limits.max_sequences}: a quarter of its batch of {limits.batch}); "
            "send several requests instead",
            "n",
        )
    return None


def check_completion(body: CompletionRequest, limits: Limits) -> Refusal | None:
    """Prompts x n and structured-output specs of one completions request."""
    if refusal := _structured(body):
        return refusal
    prompt = body.prompt
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    sequences = prompts * (body.n or 1)
    if sequences > limits.max_sequences:
        return Refusal(
            f"{prompts} prompt(s) x n={body.n or 1} = {sequences} sequences; one request may take at most "
            f"{limits.max_sequences} (a quarter of this engine's batch of {limits.batch}); split it",
            "prompt" if prompts > 1 else "n",
        )
    return None


def _count(value: Any) -> int:
    """How many inputs a str / list[str] / list[int] / list[list[int]] field holds."""
    if isinstance(value, list) and value and not isinstance(value[0], int):
        return len(value)
    return 1


def check_embeddings(body: Any, limits: Limits) -> Refusal | None:
    """Inputs (or chat messages' roles) of one embeddings request."""
    messages = getattr(body, "messages", None)
    if messages is not None:
        return _check_roles(messages)
    inputs = _count(getattr(body, "input", None))
    if inputs > limits.max_inputs:
        return Refusal(
            f"{inputs} inputs in one embeddings call; this engine takes at most {limits.max_inputs} "
            f"per call (4 batches of {limits.batch}); send them in several calls",
            "input",
        )
    return None


def check_score(body: Any, limits: Limits, field: str = "text_2") -> Refusal | None:
    """Query-document pairs of one score (or rerank) request."""
    first = getattr(body, "text_1", None)
    second = getattr(body, "text_2", None)
    pairs = max(_count(first), _count(second))
    if pairs > limits.max_pairs:
        return Refusal(
            f"{pairs} documents in one call; this engine scores at most {limits.max_pairs} per call "
            f"(2 batches of {limits.batch}); send them in several calls",
            field,
        )
    return None
