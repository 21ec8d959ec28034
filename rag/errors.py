"""The project's exceptions; the CLI turns each into one line and an exit code.

RagError                    anything this project raises on purpose
├── ConfigError             a setting, flag, inference.yaml or serve module is wrong
├── ModelPrepError          model weights could not be fetched, checked or converted
├── ServeError              the local stack could not be started or stopped
└── ClientError             a request to the running stack failed
    ├── ServerUnreachable   nothing answers at the base URL
    ├── EngineTimeout       the server is up, but one engine gave no answer in time
    └── HTTPStatusError     the server answered 4xx/5xx (carries url, status, message)
"""

from __future__ import annotations

__all__ = [
    "ClientError",
    "ConfigError",
    "EngineTimeout",
    "HTTPStatusError",
    "ModelPrepError",
    "RagError",
    "ServeError",
    "ServerUnreachable",
]


class RagError(Exception):
    """Base class: its message is what the user reads, so it says what to do next."""

    exit_code = 1


class ConfigError(RagError):
    """A setting, flag, deploy descriptor or serve module is wrong."""


class ModelPrepError(RagError):
    """Model weights could not be downloaded, verified or converted."""


class ServeError(RagError):
    """The local stack could not be started, or stopped serving."""


class ClientError(RagError):
    """A request to the running stack failed."""


class ServerUnreachable(ClientError):
    """Nothing answers at the configured base URL."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(
            f"no server answers at {url} ({reason}); start the stack with `rag serve` "
            "or point RAG_BASE_URL at a running one"
        )


class EngineTimeout(ClientError):
    """The server is up, but one engine sent nothing back within the read timeout."""

    def __init__(self, url: str, engine: str, timeout_s: float) -> None:
        self.url = url
        self.engine = engine
        self.timeout_s = timeout_s
        super().__init__(
            f"`{engine}` at {url} sent nothing for {timeout_s:g} s: the server is up but that engine "
            f"is busy or slow on this machine; raise RAG_TIMEOUT_S (now {timeout_s:g}) to wait longer"
        )


class HTTPStatusError(ClientError):
    """The server answered with an error status."""

    def __init__(self, url: str, status: int, message: str) -> None:
        self.url = url
        self.status = status
        self.server_message = message
        super().__init__(f"{url} answered {status}: {message}")
