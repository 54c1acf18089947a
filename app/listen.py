"""The listening socket: bound by `serve` before anything says it is serving.

`serve` binds its address itself (as uvicorn would: SO_REUSEADDR, IPv6 when the host
has a colon) and hands the socket to uvicorn, so a port already taken stops the start
with one clear line before the banner is printed, and `tokengate check` asks the very
same question (`problem`) without keeping the port.
"""

from __future__ import annotations

import errno
import socket


class AddressInUse(OSError):
    """The address can not be bound; the message says which and what to do."""


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AddressInUse(exc.errno, _explain(host, port, exc)) from None
    sock.set_inheritable(True)  # `--workers N`: the worker processes serve on it
    return sock


def problem(host: str, port: int) -> str | None:
    """Why `serve` could not listen on host:port now, or None when it could."""
    try:
        bind(host, port).close()
    except AddressInUse as exc:
        return exc.strerror
    return None


def _explain(host: str, port: int, exc: OSError) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where} is already in use by another process (another tokengate? "
            f"`ss -ltnp 'sport = :{port}'` names it): stop it, or pass --port / TOKENGATE_PORT"
        )
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges): use --port"
    if exc.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME):
        return f"{where}: this host has no such address: use --host 0.0.0.0 or one of its own"
    return f"{where}: {exc.strerror or exc}"  # every message names the address first
