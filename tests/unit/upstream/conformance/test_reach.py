"""Reaching the upstream: TLS with a private CA trusted through SSL_CERT_FILE, and
through a real local proxy (CONNECT for https, absolute form for http) named by the
environment, with and without credentials, which never show."""

from __future__ import annotations

import logging
from urllib.parse import quote

import pytest

from tests.support.forward_proxy import ForwardProxy
from tests.support.loopback import Upstream, serve
from tests.support.tls import certificate
from tests.unit.upstream.conformance.conftest import MakeThrough
from tests.unit.upstream.conformance.harness import answer

PROXY_VARS = ["http_proxy", "https_proxy", "no_proxy", "all_proxy"]
SECRET = "pr0xy-s3cret"


@pytest.fixture(autouse=True)
def _no_inherited_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


async def test_tls_upstream_signed_by_a_private_ca_in_ssl_cert_file(
    through: MakeThrough, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate().ca))
    async with Upstream(serve(answer()), tls=certificate().server()) as up:
        # by name: the certificate is for localhost, and the name is verified too
        gw = await through(up, bases=[up.url("", host="localhost")])
        for _ in range(2):
            r = await gw.chat()
            assert r.status_code == 200, r.text
        assert gw.sent(up) == 2 and len(up.peers) == 1


async def test_tls_upstream_the_trust_store_does_not_know_is_refused_before_sending(
    through: MakeThrough, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    async with Upstream(serve(answer()), tls=certificate().server()) as up:
        gw = await through(up, bases=[up.url("", host="localhost")])
        r = await gw.chat()
        assert r.status_code == 502, r.text
        assert "connect" in r.json()["error"]["message"]
        assert gw.sent(up) == 0  # the handshake failed: nothing was ever sent


CREDENTIALS = [pytest.param(None, id="open"), pytest.param(("gw user", SECRET), id="auth")]


def userinfo(credentials: tuple[str, str] | None) -> str:
    if credentials is None:
        return ""
    return ":".join(quote(part, safe="") for part in credentials)


@pytest.mark.parametrize("credentials", CREDENTIALS)
async def test_https_upstream_through_a_connect_proxy(
    through: MakeThrough,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    credentials: tuple[str, str] | None,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate().ca))
    async with (
        ForwardProxy(credentials) as proxy,
        Upstream(serve(answer()), tls=certificate().server()) as up,
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.url(userinfo(credentials)))
        gw = await through(up, bases=[up.url("", host="localhost")])
        for _ in range(2):
            r = await gw.chat()
            assert r.status_code == 200, r.text
        assert proxy.tunnels == [b"localhost:%d" % up.port]  # one tunnel, kept alive
        assert gw.sent(up) == 2
        assert not any(b"proxy-authorization" in req.lower() for req in up.requests)
    assert f"via proxy http://127.0.0.1:{proxy.port} (from HTTPS_PROXY)" in caplog.text
    assert SECRET not in caplog.text


async def test_http_upstream_through_the_proxy_in_absolute_form(
    through: MakeThrough, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with ForwardProxy(("gw", SECRET)) as proxy, Upstream(serve(answer())) as up:
        monkeypatch.setenv("HTTP_PROXY", proxy.url(f"gw:{SECRET}"))
        gw = await through(up)
        assert (await gw.chat()).status_code == 200
        target = b"http://127.0.0.1:%d/v1/chat/completions" % up.port
        assert [h.split(b" ")[1] for h in proxy.heads] == [target]
        assert not any(b"proxy-authorization" in req.lower() for req in up.requests)


async def test_a_proxy_refusing_the_credentials_is_a_502_without_the_secret(
    through: MakeThrough, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate().ca))
    async with (
        ForwardProxy(("gw", "right")) as proxy,
        Upstream(serve(answer()), tls=certificate().server()) as up,
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.url(f"gw:{SECRET}"))
        gw = await through(up, bases=[up.url("", host="localhost")])
        r = await gw.chat()
        assert r.status_code == 502, r.text
        assert SECRET not in r.text
        assert gw.sent(up) == 0
        assert len(proxy.tunnels) == 1  # a 407 is not retried: the credentials are wrong
    assert SECRET not in caplog.text
