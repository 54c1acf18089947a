"""Why a domain fails, said where an operator and a client look: `/health/ready`,
`/admin/status`, the 503's message, and the same words as `tokengate check` (one
classification, `app.upstream.cause`). (A URL's credentials are never shown: unit tests.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.support.procs import UPSTREAM_KEY, Gateway, GatewaySpec, Sim, free_port, run_cli

Make = Callable[..., Gateway]
ADMIN = "admin-cause-e2e-0123456789"


def failed_state(gw: Gateway, timeout: float = 30) -> dict[str, Any]:
    """The domain's entry of `/health/ready` once a failure is recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        domain = httpx.get(f"{gw.url}/health/ready").json()["domains"]["domain-a"]
        if domain["last_failure"] is not None:
            return dict(domain)
        time.sleep(0.2)
    raise AssertionError("no failure recorded in time")


def test_a_refused_connection_is_named_with_its_address_everywhere(make_gateway: Make) -> None:
    dead = free_port()  # nothing listens there
    gw = make_gateway(GatewaySpec(settings={"admin_key": ADMIN}), f"http://127.0.0.1:{dead}")
    domain = failed_state(gw)
    said = f"connection refused at 127.0.0.1:{dead}"
    assert domain["state"] == "unhealthy"
    assert domain["last_failure"]["cause"] == "connection_refused"
    assert domain["last_failure"]["address"] == f"127.0.0.1:{dead}"
    assert domain["last_failure"]["summary"] == said
    assert domain["last_probe"]["detail"] == said  # not just "connect"
    status = httpx.get(f"{gw.url}/admin/status", headers={"authorization": f"Bearer {ADMIN}"})
    assert status.json()["domains"]["domain-a"]["last_failure"]["summary"] == said

    refused = httpx.post(
        f"{gw.url}/v1/chat/completions",
        headers=gw.headers(),
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert refused.status_code == 503
    message = refused.json()["error"]["message"]
    assert f"domain-a: unhealthy after {said}" in message

    typo = {"TOKENGATE_LOGGING_OUTPUT": "stdout"}  # a misspelt variable: named by check too
    check = run_cli("check", *gw.args, env={**gw.env, "PATH": "/usr/bin:/bin", **typo})
    assert check.returncode == 1 and said in check.stdout  # the same words, the same cause
    assert (
        "warning: TOKENGATE_LOGGING_OUTPUT is set, but tokengate reads no such variable "
        "(ignored); did you mean TOKENGATE_LOGGING__OUTPUT?"
    ) in check.stdout


def test_a_key_the_upstream_refuses_is_named_401_with_the_fix(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim(api_key="sk-not-the-gateways-key")
    assert UPSTREAM_KEY != sim.api_key
    gw = make_gateway(GatewaySpec(), sim.url)
    failure = failed_state(gw)["last_failure"]
    assert failure["cause"] == "unauthorized" and failure["status"] == 401
    assert failure["summary"] == f"401 from the upstream at 127.0.0.1:{sim.port}"
    assert "environment" in failure["fix"]
