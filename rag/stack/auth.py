"""API keys at our edge: where they come from, and the gate that checks them.

Keys come from `RAG_API_KEY` (one key, or several separated by commas) and from
`RAG_API_KEY_FILE` (one key per line; blank lines and `# comments` skipped), the
way `rag serve --api-key` / `--api-key-file` set them. A file keeps a key out of
shell history and `ps`. The ingress is given only each key's SHA-256, never the
key, and compares digests in constant time (`hmac.compare_digest` over every
key, with no early exit).

Every route needs `Authorization: Bearer KEY` (what the OpenAI, Cohere, LangChain
and litellm clients send as their api_key) except `OPEN_PATHS`, the health route.
A missing or wrong key is answered 401 in the OpenAI error shape before the body
is read: it never reaches an engine. A browser cannot send a bearer token when it
opens a page, so the web page (`PAGE_PATHS`) is asked for with HTTP Basic: the key is
the password (any user name), the browser prompts for it once and sends it with
each request the page makes; every route takes a key that way too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rag.errors import ConfigError

if TYPE_CHECKING:  # the client imports this module too, and needs no web framework
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "MIN_KEY_CHARS",
    "OPEN_PATHS",
    "PAGE_PATHS",
    "KeyGate",
    "digest",
    "is_loopback",
    "keys_from_env",
    "load_keys",
    "read_key_file",
]

KEY_ENV = "RAG_API_KEY"
KEY_FILE_ENV = "RAG_API_KEY_FILE"
MIN_KEY_CHARS = 16  # `openssl rand -hex 16` gives 32; a short key is guessable over the network
OPEN_PATHS = frozenset({"/health"})  # for load balancers and `rag serve`'s own wait
PAGE_PATHS = ("/", "/web/")  # the web page: a 401 there asks the browser for the key (Basic)


def read_key_file(path: Path) -> list[str]:
    """The keys in a key file: one per line, blank lines and `#` comments skipped."""
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"API key file {path} does not exist; create it with one key per line") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the API key file {path}: {exc}") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ConfigError(
            f"API key file {path} holds no key; put one key per line (e.g. `openssl rand -hex 24`)"
        )
    return keys


def file_warning(path: Path) -> str | None:
    """A warning when others than the owner can read the key file."""
    try:
        mode = path.expanduser().stat().st_mode
    except OSError:
        return None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        return f"warning: {path} is readable by other users (mode {stat.S_IMODE(mode):o}); `chmod 600 {path}`"
    return None


def load_keys(values: Iterable[str], files: Iterable[Path]) -> tuple[str, ...]:
    """Every key given as a value (comma-separated allowed) or in a key file, checked."""
    keys: list[str] = []
    for value in values:
        keys.extend(k.strip() for k in value.split(",") if k.strip())
    for path in files:
        keys.extend(read_key_file(path))
    for key in keys:
        if len(key) < MIN_KEY_CHARS:
            raise ConfigError(
                f"an API key of {len(key)} characters is too short (at least {MIN_KEY_CHARS}); "
                "make one with `openssl rand -hex 24`"
            )
        if any(c.isspace() for c in key) or not key.isprintable() or not key.isascii():
            raise ConfigError(
                "an API key holds spaces or characters an HTTP header cannot carry; use [A-Za-z0-9._-]"
            )
    return tuple(dict.fromkeys(keys))


def keys_from_env(env: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The keys RAG_API_KEY and RAG_API_KEY_FILE name (none: the edge is open)."""
    value = env.get(KEY_ENV, "")
    file = env.get(KEY_FILE_ENV, "")
    return load_keys([value] if value else [], [Path(file)] if file else [])


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class KeyGate:
    """ASGI middleware: every HTTP request but OPEN_PATHS must carry a known key.

    `refuse(status, message)` builds the error response (the ingress's OpenAI shape).
    With no digests the gate is open (a loopback-only stack, or one deployed behind a
    gateway that authenticates).
    """

    def __init__(self, app: ASGIApp, digests: Iterable[str], refuse: Callable[[int, str], Response]) -> None:
        self.app = app
        self.digests = tuple(bytes.fromhex(d) for d in digests)
        self.refuse = refuse

    def _allowed(self, presented: str) -> bool:
        candidate = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        ok = False
        for known in self.digests:  # no early exit: the time does not say which key matched
            ok |= hmac.compare_digest(candidate, known)
        return ok

    def problem(self, scope: Scope) -> str | None:
        """Why this request may not pass (what its 401 says), or None: it may."""
        if scope["type"] != "http" or not self.digests or scope.get("path") in OPEN_PATHS:
            return None
        header = ""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                header = value.decode("latin-1")
                break
        scheme, _, presented = header.partition(" ")
        presented = presented.strip()
        if scheme.lower() == "basic":
            presented = _basic_password(presented)
        if not header:
            return (
                "no API key: send `Authorization: Bearer KEY` (the OpenAI client's api_key; "
                "RAG_API_KEY for `rag`)"
            )
        if scheme.lower() not in ("bearer", "basic") or not presented:
            return "the Authorization header must be `Bearer KEY` (or Basic, with the key as password)"
        if not self._allowed(presented):
            return (
                "the API key is not one this server accepts; check RAG_API_KEY (or the key file) "
                "on both sides"
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = self.problem(scope)
        if message is None:
            await self.app(scope, receive, send)
            return
        response = self.refuse(401, message)
        path = str(scope.get("path", ""))
        page = path == PAGE_PATHS[0] or path.startswith(PAGE_PATHS[1:])
        # A browser prompts for a Basic realm (the page), and an API client reads Bearer.
        response.headers["WWW-Authenticate"] = 'Basic realm="rag", charset="UTF-8"' if page else "Bearer"
        await response(scope, receive, send)


def _basic_password(credentials: str) -> str:
    """The password of HTTP Basic credentials (base64 of `user:password`); "" if malformed."""
    try:
        decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return ""
    return decoded.partition(":")[2].strip()
