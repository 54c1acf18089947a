"""Why an upstream could not be used, in the failure classes of docs/design.md: one
classification for `tokengate check` (httpx) and the gateway (aiohttp, probes and live
attempts), so the status page, `/health/ready`, a 503 and `check` say the same thing.

    Cause               from                              said as (summary)
    dns                 the name does not resolve         DNS: cannot resolve 'host'
    connection_refused  nothing listens at host:port      connection refused at host:port
    unreachable         no route, a reset while dialling  unreachable: host:port
    tls                 handshake or certificate failed   TLS handshake with host:port failed
    timeout             no connection / answer in time    timeout: no answer from host:port
    unauthorized        401                               401 from the upstream at host:port
    forbidden           403                               403 ...
    rate_limited        429                               429 ...
    model_not_found     404                               404 ...
    broken              a reset, an answer that is not HTTP  the connection to host:port broke
    status              any other failing status          status N from the upstream at ...

A `Failure` is one occurrence (cause, address, status, when). The address is the
upstream's `host:port`, never a URL's `user:password@`.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit


class Cause(StrEnum):
    DNS = "dns"
    REFUSED = "connection_refused"
    UNREACHABLE = "unreachable"
    TLS = "tls"
    TIMEOUT = "timeout"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    RATE_LIMITED = "rate_limited"
    MODEL_NOT_FOUND = "model_not_found"
    BROKEN = "broken"  # the connection broke off, or the answer was not HTTP
    STATUS = "status"


_BY_STATUS = {
    401: Cause.UNAUTHORIZED,
    403: Cause.FORBIDDEN,
    404: Cause.MODEL_NOT_FOUND,
    429: Cause.RATE_LIMITED,
}
_DNS_WORDS = (
    "Name or service not known",
    "nodename nor servname",
    "Temporary failure in name resolution",
    "No address associated with hostname",
)


def of_status(status: int) -> Cause:
    return _BY_STATUS.get(status, Cause.STATUS)


def of_exception(exc: BaseException | None) -> Cause:
    """The cause of a failure to connect, from the exception and the ones it wraps (an
    HTTP library's error carries the socket's as `__cause__` / `os_error`)."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 8:
        seen.append(exc)
        exc = getattr(exc, "os_error", None) or exc.__cause__ or exc.__context__
    for e in seen:
        if isinstance(e, socket.gaierror) or "DNSError" in type(e).__name__:
            return Cause.DNS
        if isinstance(e, ssl.SSLError | ssl.CertificateError) or "SSL" in type(e).__name__:
            return Cause.TLS
        if isinstance(e, ConnectionRefusedError):
            return Cause.REFUSED
        if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__:
            return Cause.TIMEOUT
    text = " ".join(str(e) for e in seen)
    if any(words in text for words in _DNS_WORDS):
        return Cause.DNS
    if "refused" in text.lower():
        return Cause.REFUSED
    return Cause.UNREACHABLE


def address(url: str) -> str:
    """`host:port` of an upstream URL (the scheme's port when none is given); never its
    credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "the upstream"
    host = parts.hostname or "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def summary(cause: Cause, where: str, status: int | None = None) -> str:
    """One line: what happened, and where."""
    match cause:
        case Cause.DNS:
            return f"DNS: cannot resolve '{where.rpartition(':')[0].strip('[]')}'"
        case Cause.REFUSED:
            return f"connection refused at {where}"
        case Cause.UNREACHABLE:
            return f"unreachable: {where}"
        case Cause.TLS:
            return f"TLS handshake with {where} failed"
        case Cause.TIMEOUT:
            return f"timeout: no answer from {where}"
        case Cause.BROKEN:
            return f"the connection to {where} broke off, or its answer was not HTTP"
        case _:
            said = status if status is not None else "a failing status"
            return f"{said} from the upstream at {where}"


def advice(cause: Cause, *, key_source: str = "the domain's api_key_env", model: str = "") -> str:
    """What to do about it (the diagnosis order of docs/design.md)."""
    match cause:
        case Cause.DNS:
            return "Check the api_base spelling and the node's DNS resolver / egress rules."
        case Cause.REFUSED | Cause.UNREACHABLE:
            return (
                "Is the service up and the port right? Check egress firewall rules from this node."
            )
        case Cause.TLS:
            return (
                "Check the upstream's certificate and the CA bundle (SSL_CERT_FILE), or a TLS "
                "proxy in between."
            )
        case Cause.TIMEOUT:
            return (
                "Egress rules, a proxy, or an overloaded upstream. Raise "
                "token_scheduler.timeout_ms only after checking the network."
            )
        case Cause.UNAUTHORIZED:
            return (
                f"The key was rejected. Is {key_source} set in this process's environment, "
                "and current? Containers must pass it explicitly (-e VAR)."
            )
        case Cause.FORBIDDEN:
            return "The key lacks the scope for this endpoint or model; ask for the scope."
        case Cause.RATE_LIMITED:
            return (
                "Rate limited. The limits are too low for this traffic, or several nodes "
                "share one key: give each domain its own key (api_key_env)."
            )
        case Cause.MODEL_NOT_FOUND:
            return (
                "Model not found. The route names a model /v1/models does not list: fix "
                f"model_route / model_aliases (asked for '{model}')."
            )
        case _:
            return "See the gateway log for the upstream's answer."


@dataclass(frozen=True)
class Failure:
    """One failure of a domain's upstream: shown until a newer one replaces it."""

    cause: Cause
    where: str  # host:port
    status: int | None = None
    at: float = field(default_factory=time.monotonic)

    @property
    def summary(self) -> str:
        return summary(self.cause, self.where, self.status)

    def view(self, now: float | None = None) -> dict[str, object]:
        """The JSON of `/health/ready`, `/admin/status` and the status page."""
        age = (time.monotonic() if now is None else now) - self.at
        return {
            "cause": self.cause.value,
            "address": self.where,
            "status": self.status,
            "summary": self.summary,
            "fix": advice(self.cause),
            "age_sec": round(age, 1),
        }
