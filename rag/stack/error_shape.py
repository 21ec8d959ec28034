"""The OpenAI error shape, `{"error": {"message", "type", "param", "code"}}`, in one place.

Light on purpose (starlette only): Ray's HTTP proxy imports it for the front door
(rag/stack/front_door.py), where importing the ingress (Ray Serve LLM, vLLM's
request models) would cost seconds and hundreds of MB. The ingress's handlers for
Ray's and FastAPI's errors build on it (rag/stack/ingress/errors.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

__all__ = ["ERROR_TYPES", "openai_error"]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


def openai_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    type_: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error response in the OpenAI shape, which every OpenAI-compatible client unpacks."""
    body = {
        "error": {
            "message": message,
            "type": type_
            or ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": status,
        }
    }
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))
