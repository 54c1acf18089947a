"""Spend alerts over real sockets: a real `tokengate serve`, the sim, and a real local HTTP
receiver. Thresholds of a key's budget and an unpriced model reach the webhook, signed;
a receiver that fails is retried; a replica killed mid-delivery leaves the alert to the
next replica on the same database; no secret, no start."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from tests.support.procs import Gateway, GatewaySpec, Sim, run_cli
from tests.support.receiver import Received, receiver

Make = Callable[..., Gateway]
SECRET = "webhook-secret-for-tests-0123456789"
PROMPT = [{"role": "user", "content": "Spend a little of the budget, please."}]


def spec(url: str, workdir_db: Path | None = None, **alerts: Any) -> GatewaySpec:
    settings: dict[str, Any] = {
        "billing": {"prices": {"gpt-4o": {"input": "2.5", "output": "10"}}},
        "alerts": {
            "webhooks": [{"url": url}],
            "thresholds": [50, 100],
            "check_interval_sec": 0.2,
            "backoff_ms": 100,
            "max_backoff_ms": 300,
            "lease_sec": 2,
            **alerts,
        },
    }
    if workdir_db is not None:
        settings["database"] = {"path": str(workdir_db)}
    keys = {"alice": {"budgets": [{"period": "day", "max_tokens": 150}]}}
    return GatewaySpec(keys=keys, settings=settings, env={"TOKENGATE_ALERTS_SECRET": SECRET})


def signed(post: Received) -> bool:
    mac = hmac.new(SECRET.encode(), post.raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(post.headers["x-tokengate-signature"], f"sha256={mac}")


def wait_for(check: Callable[[], Any], seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def spend_until_refused(gw: Gateway, model: str = "gpt-4o") -> None:
    with gw.openai("alice") as client:
        for _ in range(20):
            try:
                client.chat.completions.create(model=model, messages=PROMPT, max_tokens=8)
            except openai.RateLimitError:
                return
    raise AssertionError("the budget never ran out")


def test_thresholds_and_an_unpriced_model_reach_the_webhook_signed_and_retried(
    sim: Sim, make_gateway: Make
) -> None:
    with receiver() as hook:
        hook.fail_next = 2  # the first two posts get 500: retried with backoff
        gw = make_gateway(spec(hook.url), sim.url)
        with gw.openai("alice") as client:
            client.chat.completions.create(model="claude-sonnet", messages=PROMPT, max_tokens=4)
        spend_until_refused(gw)

        def delivered() -> dict[str, list[Received]]:
            by_id: dict[str, list[Received]] = {}
            for post in hook.delivered():
                by_id.setdefault(post.headers["x-tokengate-delivery"], []).append(post)
            # every alert, the two failed tries included (each retried until it got a 200)
            return by_id if len(by_id) >= 3 and len(hook.delivered()) >= 5 else {}

        by_id = wait_for(delivered)
        events = sorted(
            (posts[0].body["event"], posts[0].body.get("threshold_percent"))
            for posts in by_id.values()
        )
        assert events == [
            ("budget_threshold", 50),
            ("budget_threshold", 100),
            ("unpriced_model", None),
        ]
        assert all(signed(p) for posts in by_id.values() for p in posts)
        assert sum(len(posts) for posts in by_id.values()) == 5  # two failures were retried
        retried = [posts for posts in by_id.values() if len(posts) > 1]
        assert retried and all(p.raw == posts[0].raw for posts in retried for p in posts)
        threshold = next(p[0].body for p in by_id.values() if p[0].body.get("threshold_percent"))
        assert (threshold["scope"], threshold["name"], threshold["budget"]) == (
            "key",
            "alice",
            "day_tokens",
        )
        tampered = Received(hook.delivered()[0].headers, hook.delivered()[0].raw + b" ")
        assert not signed(tampered)
        time.sleep(1.0)  # more checks pass: nothing is sent twice
        assert {k: len(v) for k, v in delivered().items()} == {k: len(v) for k, v in by_id.items()}


def test_a_replica_killed_mid_delivery_leaves_the_alert_to_the_next(
    sim: Sim, make_gateway: Make, tmp_path: Path
) -> None:
    db = tmp_path / "shared.sqlite3"
    with receiver() as hook:
        hook.hold = threading.Event()  # the receiver keeps the first post unanswered
        first = make_gateway(spec(hook.url, db, thresholds=[50]), sim.url)
        spend_until_refused(first)
        assert wait_for(hook.delivered)
        first.proc.kill()  # kill -9 while its delivery is in flight
        first.proc.wait(10)
        hook.hold.set()
        second = make_gateway(spec(hook.url, db, thresholds=[50]), sim.url)
        posts = wait_for(lambda: hook.delivered() if len(hook.delivered()) >= 2 else None)
        ids = {p.headers["x-tokengate-delivery"] for p in posts}
        assert len(ids) == 1 and all(signed(p) for p in posts)  # the same alert, again
        time.sleep(1.0)
        assert len(hook.delivered()) == 2  # once delivered, never again
        second.stop()


def test_webhooks_without_a_secret_refuse_to_start(sim: Sim, make_gateway: Make) -> None:
    with receiver() as hook:
        bare = spec(hook.url)
        bare.env = {"TOKENGATE_ALERTS_SECRET": ""}
        gw = make_gateway(bare, sim.url, wait=False)
        assert gw.proc.wait(60) == 2
        env = {"PATH": "/usr/bin:/bin", "TAOTOKEN_API_KEY": sim.api_key}
        done = run_cli("check", *gw.args, env=env)
        assert done.returncode == 2
        assert "TOKENGATE_ALERTS_SECRET" in done.stdout + done.stderr
