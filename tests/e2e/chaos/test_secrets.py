"""Secrets: a full run, failures included, never shows a key anywhere a reader could look.

The run covers good calls and streams, wrong and missing keys, keys presented in every
header a client might use, the upstream failing (500, 429, a dropped stream, refusing the
gateway's own key), per-key 429s, oversized requests and admin probes. Afterwards the
gateway's log file, its stdout/stderr, `/metrics`, `/health`, `/health/ready`, every
response body and header, and the ledger file must hold none of: the upstream key, any
gateway key, the admin key.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable

import httpx

from app import auth
from app.api import admin as admin_api
from app.auth import KeyIndex
from tests.e2e.chaos._support import ADMIN, ADMIN_H, Make, chat, quiescent, stream_chat
from tests.support.procs import UPSTREAM_KEY, Gateway, GatewaySpec, Sim
from tests.support.scrape import label_values

CHAT = "/v1/chat/completions"
# Not shaped like a key (no sk-/tg- prefix), so only real care keeps it out of the logs.
PLAIN_KEY = "correct-horse-battery-staple-42"


class Recorder:
    """Every response of the run, headers and body, to search afterwards."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.statuses: set[int] = set()

    def keep(self, r: httpx.Response) -> httpx.Response:
        self.seen.append(f"{r.status_code} {dict(r.headers)!r}\n{r.text}")
        self.statuses.add(r.status_code)
        return r


def secrets_of(gw: Gateway) -> dict[str, str]:
    return {"upstream key": UPSTREAM_KEY, "admin key": ADMIN} | {
        f"gateway key {alias}": key for alias, key in gw.keys.items()
    }


def run_everything(gw: Gateway, sim: Sim, rec: Recorder) -> None:
    url = f"{gw.url}{CHAT}"
    with httpx.Client(timeout=30) as c:
        # good traffic, with every way a client may present its key
        rec.keep(c.post(url, json=chat(), headers=gw.headers()))
        rec.keep(c.post(url, json=stream_chat(), headers=gw.headers("plain")))
        rec.keep(c.post(url, json=chat(), headers={"x-api-key": gw.keys["plain"]}))
        rec.keep(c.get(f"{gw.url}/v1/models", headers=gw.headers()))
        # wrong, missing and misplaced keys
        for headers in (
            {},
            {"authorization": f"Bearer {gw.key}-wrong"},
            {"authorization": f"Bearer {UPSTREAM_KEY}"},
            {"authorization": f"Bearer {ADMIN}"},
            {"authorization": f"Basic {gw.keys['plain']}"},
            {"x-api-key": UPSTREAM_KEY},
        ):
            assert rec.keep(c.post(url, json=chat(), headers=headers)).status_code == 401
        # client errors: unknown model, missing messages
        rec.keep(c.post(url, json=chat(model="no-such-model"), headers=gw.headers()))
        rec.keep(c.post(url, json={"model": "gpt-4o"}, headers=gw.headers()))
        # per-key limits and too-large requests
        for _ in range(4):
            rec.keep(c.post(url, json=chat(), headers=gw.headers("tiny")))
        rec.keep(c.post(url, json=chat(max_tokens=10**9), headers=gw.headers()))
        # upstream failures: 500, a 429 storm, a dropped stream, a refused gateway key
        sim.faults(status=500, count=10)
        rec.keep(c.post(url, json=chat(), headers=gw.headers()))
        sim.faults(status=429, count=10, retry_after=0.05)
        rec.keep(c.post(url, json=chat(), headers=gw.headers()))
        sim.faults(drop_after=2)
        rec.keep(c.post(url, json=stream_chat(max_tokens=8), headers=gw.headers()))
        sim.faults(status=401, count=5)
        rec.keep(c.post(url, json=chat(), headers=gw.headers()))
        sim.faults(status=400, count=1)
        rec.keep(c.post(url, json=chat(), headers=gw.headers()))
        sim.faults()
        sim.balance(0)  # the upstream account's balance is empty
        rec.keep(c.post(url, json=chat(), headers=gw.headers()))
        sim.balance(None)
        # last, as it cools the domain down for longer than the queue wait: 503 at once
        sim.faults(status=429, count=1, retry_after=45)
        rec.keep(c.post(url, json=chat(), headers=gw.headers()))
        sim.faults()
        # admin probes: refused without the admin key, whatever else is presented
        for method, path in (
            ("GET", "/admin/status"),
            ("GET", "/admin/usage"),
            ("PUT", "/admin/keys/alice/limits"),
        ):
            for headers in (
                {},
                gw.headers(),
                {"authorization": f"Bearer {UPSTREAM_KEY}"},
                {"authorization": f"Bearer {ADMIN}x"},
                {"authorization": f"Bearer {ADMIN[:-1]}"},
                {"authorization": ADMIN},
                {"x-api-key": ADMIN},
                {"authorization": f"Basic {ADMIN}"},
            ):
                r = rec.keep(
                    c.request(
                        method, f"{gw.url}{path}", json={"requests_per_minute": 1}, headers=headers
                    )
                )
                assert r.status_code == 401, (method, path, headers, r.status_code)
                assert r.json()["error"]["code"] is not None or r.json()["error"]["message"]
        # the refused PUTs changed nothing
        status = rec.keep(c.get(f"{gw.url}/admin/status", headers=ADMIN_H)).json()
        alice = next(k for k in status["limits"]["keys"] if k["alias"] == "alice")
        assert alice["live_override"] is False
        rec.keep(c.get(f"{gw.url}/admin/usage", headers=ADMIN_H))
        for path in ("/health", "/health/ready", "/metrics", "/openapi.json"):
            rec.keep(c.get(f"{gw.url}{path}"))


def test_no_secret_in_logs_metrics_health_or_error_bodies(
    make_sim: Callable[..., Sim], make_gateway: Make
) -> None:
    sim = make_sim()
    gw = make_gateway(
        GatewaySpec(
            settings={
                "admin_key": ADMIN,
                "model_route": {"fallback": None},
                "retry_policy": {"max_attempts": 2, "backoff_ms": 10},
                # debug logging is where secrets usually slip in
                "logging": {"level": "debug"},
            },
            keys={"alice": {}, "plain": {}, "tiny": {"requests_per_minute": 2}},
            secrets={"plain": PLAIN_KEY},
        ),
        sim.url,
    )
    rec = Recorder()
    run_everything(gw, sim, rec)
    assert {200, 400, 401, 404, 429, 502, 503} <= rec.statuses, rec.statuses  # errors ran
    quiescent(gw, sim)
    gw.stop()  # flush and close everything the process writes

    places = {
        "gateway log": gw.log_path.read_text(errors="replace"),
        "stdout/stderr": (gw.workdir / "stdout.log").read_text(errors="replace"),
        "database file": (gw.workdir / "tokengate.sqlite3").read_bytes().decode("latin-1"),
        "responses": "\n".join(rec.seen),
    }
    assert places["gateway log"].count('"tokengate.access"') >= 12  # the run was logged
    leaks = [
        f"{what} in the {where}"
        for where, text in places.items()
        for what, secret in secrets_of(gw).items()
        if secret in text
    ]
    assert leaks == []
    # the upstream saw only its own key, never a client's or the admin's
    for record in sim.records():
        auth = record["headers"].get("authorization")
        assert auth in (None, f"Bearer {UPSTREAM_KEY}"), auth
        flat = repr(record)
        assert not [name for name, s in secrets_of(gw).items() if s in flat and s != UPSTREAM_KEY]


def test_metrics_and_health_expose_nothing_secret(gateway: Gateway) -> None:
    httpx.post(f"{gateway.url}{CHAT}", json=chat(), headers=gateway.headers())
    for path in ("/metrics", "/health", "/health/ready"):
        text = httpx.get(f"{gateway.url}{path}").text
        for secret in (UPSTREAM_KEY, *gateway.keys.values()):
            assert secret not in text, path
        assert "sk-" not in text and "tg-" not in text, path
    # `key` labels are aliases
    assert label_values(gateway.metrics(), "key") <= set(gateway.keys)


# -- constant-time comparison of secrets (source level: a timing test would be flaky) --------------
def _function_ast(fn: object) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]


def _compare_digest_calls(tree: ast.AST) -> int:
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "compare_digest"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("hmac", "secrets")
    )


def _secret_equality(tree: ast.AST, names: set[str]) -> list[str]:
    """`==` / `!=` comparisons whose operands mention a secret-bearing name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, ast.Eq | ast.NotEq) for op in node.ops
        ):
            mentioned = {
                n.id if isinstance(n, ast.Name) else n.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Name | ast.Attribute)
            }
            if mentioned & names:
                found.append(ast.unparse(node))
    return found


def test_key_checks_are_constant_time() -> None:
    secretish = {"presented", "wanted", "digests", "get_secret_value", "admin_key"}
    gateway_keys = _function_ast(KeyIndex.authenticate)
    assert _compare_digest_calls(gateway_keys) >= 1
    assert _secret_equality(gateway_keys, secretish) == []
    admin = _function_ast(admin_api._admin)
    # the admin check goes through the one bearer comparison, which is constant-time
    assert "bearer_matches(" in inspect.getsource(admin_api._admin)
    assert _secret_equality(admin, secretish) == []
    bearer = _function_ast(auth.bearer_matches)
    assert _compare_digest_calls(bearer) >= 1
    assert _secret_equality(bearer, secretish | {"secret"}) == []
    # a client's key is looked up by its digest, never by the key itself
    source = inspect.getsource(KeyIndex.authenticate)
    assert "digest(presented)" in source
