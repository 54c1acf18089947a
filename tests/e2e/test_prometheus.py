"""deploy/prometheus and deploy/grafana against the real tools.

- `promtool` checks the shipped config (and the rule files it loads), the rules, and
  runs their unit tests; it lints a live scrape of a gateway that served traffic.
- A real `prometheus` server scrapes a real gateway (in front of `tokengate sim`)
  every second with the shipped rules loaded: it must count every request sent,
  evaluate every rule without error, raise exactly the alert the traffic provokes,
  and answer every dashboard query (Prometheus' own parser, not ours) with data.

Traffic goes in two phases because Prometheus sees a counter's increase only between
two scrapes: phase 1 creates every series, phase 2 (after a scrape) moves them.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.support.procs import (
    ROOT,
    Gateway,
    GatewaySpec,
    Sim,
    free_port,
    start_gateway,
    start_sim,
    stop,
    wait_http,
)
from tests.support.scrape import metric_sum
from tests.support.waiting import PATIENCE

PROM_DIR = ROOT / "deploy" / "prometheus"
RULES = PROM_DIR / "rules"
DASHBOARD = ROOT / "deploy" / "grafana" / "tokengate-dashboard.json"
PING = [{"role": "user", "content": "ping"}]
# Stand-ins for the dashboard's variables: what Grafana sends with "All" selected.
GRAFANA_VARS = {"job": "tokengate", "instance": ".*", "domain": ".*", "__rate_interval": "1m"}
# Series only failures this traffic does not cause produce (or, for Redis, only a
# gateway configured with Redis): their panels may be empty here.
# Series that exist only after their event: failed attempts, Redis configured, an upstream
# 429, a pace known (the dashboard hides the +Inf of an unbounded domain).
EVENT_ONLY = (
    "tokengate_failed_tokens_total",
    "tokengate_redis_up",
    "tokengate_upstream_throttled_total",
    "tokengate_domain_pace_requests_per_second",
    "tokengate_budget_exceeded_total",
    "tokengate_unpriced_requests_total",
)
# Bob may send one request a minute: his second and later requests get 429.
KEYS: dict[str, dict[str, Any]] = {
    "alice": {"budgets": [{"period": "month", "max_cost": 1000}]},
    "bob": {"requests_per_minute": 1},
}
# Every model the sim serves has a price: the cost panels have data, nothing is unpriced.
BILLING = {
    "prices": {
        m: {"input": 1, "output": 2} for m in ("claude-sonnet", "gpt-4o", "text-embedding-3-small")
    }
}
PHASE2_ALICE, PHASE2_BOB = 36, 4  # 10 % refused: TokengateHighRateLimitRatio's case


def tool(name: str) -> str:
    exe = shutil.which(name)
    assert exe, f"{name} is not installed (Debian package `prometheus`; make test installs it)"
    return exe


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )


def eventually(
    probe: Callable[[], Any], ok: Callable[[Any], bool], what: str, timeout: float = PATIENCE
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s, last {value!r}")
        time.sleep(0.25)


def exposed_requests(gateway: Gateway) -> float:
    """The gateway's own count, read from its /metrics exposition."""
    return metric_sum(gateway.metrics(), "tokengate_requests_total")


# -- static checks ----------------------------------------------------------------------


def test_promtool_check_config_accepts_the_config_and_its_rule_files() -> None:
    done = promtool("check", "config", "deploy/prometheus/prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    # check config also checks the rule files, resolved relative to the config file
    assert "SUCCESS: 1 rule files found" in done.stdout, done.stdout
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "tokengate"
    assert job["static_configs"][0]["targets"] == ["gateway-1:8080", "gateway-2:8080"]
    assert config["global"]["scrape_interval"] == "15s"


def test_promtool_check_rules_accepts_every_rule_file() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in RULES.glob("*.yml"))
    assert files
    done = promtool("check", "rules", *files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_rule_unit_tests_pass() -> None:
    done = promtool("test", "rules", "deploy/prometheus/tests/tokengate.rules.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def send_every_kind_of_request(gateway: Gateway, sim: Sim) -> int:
    """One of each: plain, streamed (TTFT), embeddings, retried, refused. Returns the count."""
    alice, bob = gateway.openai("alice"), gateway.openai("bob")
    alice.chat.completions.create(model="claude-sonnet", messages=PING, max_tokens=4)
    stream = alice.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=4, stream=True)
    assert [c for c in stream if c.choices and c.choices[0].delta.content]
    alice.embeddings.create(model="text-embedding-3-small", input=["ping"])
    sim.faults(status=502, count=1, paths=["/v1/chat/completions"])
    alice.chat.completions.create(model="claude-sonnet", messages=PING, max_tokens=4)
    bob.chat.completions.create(model="claude-sonnet", messages=PING, max_tokens=4)
    with pytest.raises(openai.RateLimitError):
        bob.chat.completions.create(model="claude-sonnet", messages=PING, max_tokens=4)
    return 6


# -- a live scrape ----------------------------------------------------------------------


def test_live_scrape_passes_promtool_check_metrics(
    sim: Sim, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(GatewaySpec(keys=KEYS, settings={"billing": BILLING}), sim.url)
    send_every_kind_of_request(gateway, sim)
    scrape = gateway.metrics()
    for series in (
        'tokengate_requests_total{domain="domain-a",model="claude-sonnet",status="200"}',
        'tokengate_rate_limited_total{key="bob",limit="requests"}',
        'tokengate_upstream_retries_total{domain="domain-a",reason="status_502"}',
        'tokengate_upstream_resends_total{domain="domain-a",reason="status_502"} 1.0',
        'tokengate_upstream_up{domain="domain-a"} 1.0',
        "tokengate_time_to_first_token_seconds_bucket{",
    ):
        assert series in scrape
    done = promtool("check", "metrics", stdin=scrape)
    # rc 0 with no output: parseable exposition and no lint finding (naming, help, units)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


# -- a live Prometheus ------------------------------------------------------------------


@dataclass
class Stack:
    sim: Sim
    gateway: Gateway
    prometheus: subprocess.Popen[bytes]
    url: str
    sent: int
    refused: int = 1  # bob's second request in phase 1

    def answer(self, expr: str) -> dict[str, Any]:
        """Prometheus' answer to an instant query: a parse error is a 400 `bad_data`."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        return dict(r.json())

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.answer(expr)
        assert body["status"] == "success", (expr, body.get("error"))
        return list(body["data"]["result"])

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def api(self, path: str) -> Any:
        r = httpx.get(f"{self.url}/api/v1/{path}", timeout=5)
        r.raise_for_status()
        return r.json()["data"]


def prometheus_config(tmp: Path, target: str) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / "*.yml")],
        "scrape_configs": [{"job_name": "tokengate", "static_configs": [{"targets": [target]}]}],
    }
    path = tmp / "prometheus.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def start_prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen[bytes], str]:
    port, log = free_port(), tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={prometheus_config(tmp, target)}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/-/ready", proc=proc)
    except (TimeoutError, RuntimeError) as exc:
        stop(proc)
        raise RuntimeError(f"prometheus did not start:\n{log.read_text()[-2000:]}") from exc
    return proc, url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """sim -> gateway <- prometheus (shipped rules, 1 s scrapes), after both traffic phases."""
    tmp = tmp_path_factory.mktemp("prometheus")
    with contextlib.ExitStack() as cleanup:
        sim = start_sim()
        cleanup.callback(sim.stop)
        spec = GatewaySpec(keys=KEYS, settings={"billing": BILLING})
        gateway = start_gateway(tmp / "gw", spec, sim.url)
        cleanup.callback(gateway.stop)
        prometheus, url = start_prometheus(tmp, f"127.0.0.1:{gateway.port}")
        cleanup.callback(stop, prometheus)
        s = Stack(sim, gateway, prometheus, url, 0)
        eventually(lambda: s.scalar('up{job="tokengate"}'), lambda v: v == 1, "target up")
        s.sent = sent = send_every_kind_of_request(gateway, sim)
        eventually(lambda: s.scalar("sum(tokengate_requests_total)"), lambda v: v == sent, "p1")
        alice, bob = gateway.openai("alice"), gateway.openai("bob")
        for _ in range(PHASE2_ALICE):
            alice.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=2)
        # bob's one request a minute was spent in phase 1: refused, unless a slow machine
        # took a minute to get here (then counted as what it was, not assumed)
        for _ in range(PHASE2_BOB):
            try:
                bob.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=2)
            except openai.RateLimitError:
                s.refused += 1
        s.sent += PHASE2_ALICE + PHASE2_BOB
        yield s


@pytest.mark.slow
def test_prometheus_scrapes_the_gateway_and_counts_every_request(stack: Stack) -> None:
    assert exposed_requests(stack.gateway) == stack.sent
    total = eventually(
        lambda: stack.scalar('sum(tokengate_requests_total{job="tokengate"})'),
        lambda v: v == stack.sent,
        "Prometheus' count of the requests sent",
    )
    assert total == stack.sent
    by_status = {
        r["metric"]["status"]: float(r["value"][1])
        for r in stack.query("sum by (status) (tokengate_requests_total)")
    }
    assert stack.refused >= PHASE2_BOB  # phase 2 was refused (3 of 4 at the least)
    assert by_status == {"200": stack.sent - stack.refused, "429": stack.refused}
    assert stack.scalar("sum(tokengate_rate_limited_total)") == stack.refused


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable, variables substituted."""
    dash = json.loads(DASHBOARD.read_text())

    def substitute(expr: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: GRAFANA_VARS[m.group(1)], expr)

    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", substitute(target["expr"])))
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            # Grafana's label_values(selector, label) is "which values has label": that is
            # `group by (label) (selector)` in PromQL.
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
            assert m, var["definition"]
            out.append((f"variable {var['name']}", f"group by ({m[2]}) ({substitute(m[1])})"))
    return out


@pytest.mark.slow
def test_every_dashboard_query_parses_and_returns_data(stack: Stack) -> None:
    queries = dashboard_queries()
    assert len(queries) > 20
    # rate() needs two samples of a series: wait until those of phase 1 have them.
    rate_of_retries = "sum(rate(tokengate_upstream_retries_total[1m]))"
    eventually(lambda: stack.scalar(rate_of_retries), lambda v: v is not None, "rate")
    broken, empty = [], []
    for where, expr in queries:
        body = stack.answer(expr)
        if body["status"] != "success":
            broken.append(f"{where}: {body.get('error')}")
        elif not body["data"]["result"] and not any(m in expr for m in EVENT_ONLY):
            empty.append(where)
    assert (broken, empty) == ([], []), "(rejected by Prometheus, without data after traffic)"


def alert_names() -> set[str]:
    doc = yaml.safe_load((RULES / "tokengate.rules.yml").read_text())
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


@pytest.mark.slow
def test_shipped_rules_evaluate_on_live_data_and_only_the_provoked_alert_is_active(
    stack: Stack,
) -> None:
    def rules() -> list[dict[str, Any]]:
        return [r for g in stack.api("rules")["groups"] for r in g["rules"]]

    loaded = eventually(
        rules, lambda rs: rs and all(r["health"] == "ok" for r in rs), "rules healthy"
    )
    assert {r["name"] for r in loaded if r["type"] == "alerting"} == alert_names()
    # Phase 2 refused 10 % of 40 requests: the 429-ratio alert must go pending (its
    # `for` is 10m) on real metrics, and nothing else may: the gateway is healthy.
    active = eventually(
        lambda: {a["labels"]["alertname"] for a in stack.api("alerts")["alerts"]},
        lambda names: "TokengateHighRateLimitRatio" in names,
        "TokengateHighRateLimitRatio active",
    )
    assert active == {"TokengateHighRateLimitRatio"}


# -- what the alerts and the dashboard rely on ------------------------------------------


@pytest.mark.slow
def test_redis_up_is_not_exposed_without_redis(stack: Stack) -> None:
    # app/metrics/durable.py documents tokengate_redis_up as "absent without Redis": a 0 there
    # would page TokengateRedisDown on every deployment that runs without Redis.
    samples = [
        ln for ln in stack.gateway.metrics().splitlines() if ln.startswith("tokengate_redis_up")
    ]
    assert samples == []


@pytest.mark.slow
def test_time_to_first_token_is_labelled_with_the_served_model(stack: Stack) -> None:
    # The dashboard's "TTFT p99 by model" panel groups by this label.
    models = {
        r["metric"]["model"] for r in stack.query("tokengate_time_to_first_token_seconds_count")
    }
    assert models == {"gpt-4o"}
