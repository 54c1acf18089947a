"""Reading HTTPS_PROXY / HTTP_PROXY / NO_PROXY: pure, no sockets."""

from __future__ import annotations

import pytest

from app.upstream.proxyenv import Proxies, parse_proxy


def test_scheme_picks_the_variable_and_lower_case_wins() -> None:
    p = Proxies({"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2"})
    route = p.route("https", "api.example", 443)
    assert route is not None and (route.host, route.port) == ("lower", 2)
    assert p.route("http", "api.example", 80) is None


@pytest.mark.parametrize(
    ("no_proxy", "host", "bypass"),
    [
        ("api.example", "api.example", True),
        (".example", "api.example", True),
        ("example", "api.example", True),
        ("other.example", "api.example", False),
        ("*", "anything", True),
        ("api.example:8443", "api.example", True),
        ("api.example:9999", "api.example", False),
        ("::1", "::1", True),
        ("", "api.example", False),
    ],
)
def test_no_proxy(no_proxy: str, host: str, bypass: bool) -> None:
    p = Proxies({"https_proxy": "http://proxy:3128", "NO_PROXY": no_proxy})
    assert (p.route("https", host, 8443) is None) is bypass


def test_credentials_become_a_basic_header_and_never_show() -> None:
    route = parse_proxy("http://us%20er:p%40ss@proxy.internal:3128", source="HTTPS_PROXY")
    assert route.authorization == "Basic dXMgZXI6cEBzcw=="  # "us er:p@ss"
    assert "p@ss" not in route.shown and "p%40ss" not in repr(route)
    assert route.shown == "http://proxy.internal:3128 (from HTTPS_PROXY)"


def test_bare_host_port_means_http() -> None:
    route = parse_proxy("proxy:8080", source="http_proxy")
    assert (route.scheme, route.host, route.port, route.authorization) == (
        "http",
        "proxy",
        8080,
        None,
    )


def test_bad_port_names_the_variable() -> None:
    with pytest.raises(ValueError, match="HTTPS_PROXY"):
        parse_proxy("http://proxy:port", source="HTTPS_PROXY")


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ("http://u:p@[::1]:3128", "http://[::1]:3128"),
        ("[fd00::5]:8080", "http://[fd00::5]:8080"),
        ("https://proxy.internal", "https://proxy.internal:443"),
        ("http://10.0.0.7", "http://10.0.0.7:80"),
    ],
)
def test_the_url_both_clients_dial_brackets_ipv6_and_never_holds_credentials(
    value: str, url: str
) -> None:
    route = parse_proxy(value, source="HTTPS_PROXY")
    assert route.url == url
    assert route.shown == f"{url} (from HTTPS_PROXY)"
    if "@" in value:
        assert route.headers == {"Proxy-Authorization": "Basic dTpw"}  # "u:p"
    else:
        assert route.headers is None
