"""The engine's port: the one asked for, or any free one (the manifest records which)."""

from __future__ import annotations

import socket


class ServerError(RuntimeError):
    """The engine failed to start or died; the message is one line plus the log's tail."""


def free_port(preferred: int, host: str = "0.0.0.0") -> int:
    """The asked-for port if it can be bound now (else ServerError: the manifest must record the port used), or
    with 0 one the kernel picks."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, preferred))
        except OSError as e:
            if preferred:
                raise ServerError(
                    f"port {preferred} on {host} is in use ({e.strerror}); choose another --port, or "
                    f"--port 0 for any free port"
                ) from None
            raise
        return s.getsockname()[1]
