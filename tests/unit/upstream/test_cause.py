"""One classification of why an upstream failed, for `check` and for the gateway."""

from __future__ import annotations

import socket
import ssl

import httpx
import pytest

from app.upstream.attempt import AttemptFailed, Reason, status_failure
from app.upstream.cause import Cause, Failure, address, of_exception, summary


def wrapped(inner: BaseException) -> httpx.ConnectError:
    """An HTTP library's connect error, with the socket's error as its cause."""
    try:
        raise httpx.ConnectError("connect failed") from inner
    except httpx.ConnectError as exc:
        return exc


@pytest.mark.parametrize(
    ("inner", "cause"),
    [
        (socket.gaierror(-2, "Name or service not known"), Cause.DNS),
        (ConnectionRefusedError(111, "Connection refused"), Cause.REFUSED),
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), Cause.TLS),
        (TimeoutError(), Cause.TIMEOUT),
        (OSError(113, "No route to host"), Cause.UNREACHABLE),
    ],
)
def test_a_failed_connect_is_classified_from_the_socket_error(
    inner: BaseException, cause: Cause
) -> None:
    assert of_exception(wrapped(inner)) is cause


def test_the_address_never_carries_credentials() -> None:
    assert address("http://user:s3cret@10.0.0.7:9090/api") == "10.0.0.7:9090"
    assert address("https://taotoken.net/api") == "taotoken.net:443"
    assert address("http://[::1]:9090") == "[::1]:9090"
    assert summary(Cause.REFUSED, "127.0.0.1:9090") == "connection refused at 127.0.0.1:9090"
    assert summary(Cause.DNS, "no-such.example:443") == "DNS: cannot resolve 'no-such.example'"


@pytest.mark.parametrize(
    ("status", "cause"),
    [
        (401, Cause.UNAUTHORIZED),
        (403, Cause.FORBIDDEN),
        (429, Cause.RATE_LIMITED),
        (503, Cause.STATUS),
    ],
)
def test_an_upstream_status_says_its_cause(status: int, cause: Cause) -> None:
    failure = status_failure(status, b"{}", "application/json", {}).failure("up:443")
    assert failure is not None and failure.cause is cause and failure.status == status
    assert f"{status} from the upstream at up:443" in failure.summary or cause is Cause.RATE_LIMITED


def test_what_says_nothing_of_the_upstream_is_no_failure() -> None:
    assert status_failure(404, b"{}", "application/json", {}).failure("up:443") is None
    assert AttemptFailed(Reason.CIRCUIT_OPEN, retryable=False).failure("up:443") is None
    refused = AttemptFailed(Reason.CONNECT, retryable=True, cause=Cause.REFUSED)
    found = refused.failure("up:443")
    assert found is not None and (found.cause, found.where) == (Cause.REFUSED, "up:443")
    unknown = AttemptFailed(Reason.CONNECT, retryable=True).failure("up:443")
    assert unknown is not None and unknown.cause is Cause.UNREACHABLE


def test_the_view_has_cause_address_summary_fix_and_age() -> None:
    view = Failure(Cause.REFUSED, "127.0.0.1:9090", at=100.0).view(now=112.0)
    assert view == {
        "cause": "connection_refused",
        "address": "127.0.0.1:9090",
        "status": None,
        "summary": "connection refused at 127.0.0.1:9090",
        "fix": "Is the service up and the port right? Check egress firewall rules from this node.",
        "age_sec": 12.0,
    }
