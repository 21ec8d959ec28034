"""Keep a one-machine stack's Ray Serve replicas off the network.

`rag serve` puts Ray's node on 127.0.0.1 (rag/stack/serve.py), which binds the GCS,
raylet, agents and every worker's gRPC port there. One server is left: Ray Serve 2.60
starts an inter-deployment gRPC server in every replica on `[::]:0`, hard-coded, all
interfaces. `rag serve` sets LOOPBACK_ENV before Ray starts, so every replica inherits
it, and our code that each replica imports while it initializes (the ingress; the
engine class of every LLM replica) calls `keep_replicas_on_loopback`, which binds that
server to 127.0.0.1 instead. A multi-node deploy sets nothing and keeps Ray's default.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["LOOPBACK_ENV", "keep_replicas_on_loopback"]

LOOPBACK_ENV = "RAG_RAY_LOOPBACK"


def keep_replicas_on_loopback() -> None:
    if os.environ.get(LOOPBACK_ENV) != "1":
        return
    from ray.serve._private import replica

    bind: Any = getattr(replica, "add_port_to_grpc_server")  # noqa: B009 - not in its __all__
    if getattr(bind, "loopback", False):
        return

    def on_loopback(server: Any, address: str) -> int:
        return int(bind(server, "127.0.0.1:0" if address == "[::]:0" else address))

    on_loopback.loopback = True  # type: ignore[attr-defined]
    setattr(replica, "add_port_to_grpc_server", on_loopback)  # noqa: B010
