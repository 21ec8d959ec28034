"""Server-sent events as the OpenAI-compatible routes stream them: one JSON object per
`data: ` line, ended by `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DONE", "event"]

DONE = "data: [DONE]"


def event(line: str) -> dict[str, Any] | None:
    """The JSON object one line of a stream carries; None for the end marker, blank
    lines, comments and any other field."""
    if not line.startswith("data: ") or line == DONE:
        return None
    data: dict[str, Any] = json.loads(line[6:])
    return data
