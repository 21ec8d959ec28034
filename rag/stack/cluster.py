"""Reaching a running Ray cluster: `rag serve --address` and `rag index --ray ADDRESS`.

Ray itself waits minutes on an address where nothing listens, and its `auto` falls back
to any Ray process it finds running (a private `rag serve`'s included). So an address is
resolved here first (`auto`: only the cluster `ray start` recorded on this machine) and
tried with a plain TCP connection, which fails in seconds with the reason.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

__all__ = ["resolve", "unreachable"]


def resolve(address: str) -> str | None:
    """`address` as HOST:PORT (or ray://HOST:PORT); `auto` as the address `ray start`
    recorded on this machine, None if it recorded none."""
    if address != "auto":
        return address
    from ray._private.services import find_bootstrap_address

    found: str | None = find_bootstrap_address(None)
    return found or None


def unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why HOST:PORT (or ray://HOST:PORT) takes no TCP connection; None if it does or if
    the address is not of that form."""
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # a port that is not a number
        return str(exc)
    if not host or port is None:
        return None
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"
    return None
