"""The Prometheus rules, their promtool tests, the runbook and the Grafana dashboard agree
with each other and with `app/metrics/`: no process, no network (the real tools run in
tests/e2e/test_prometheus.py).

Metric names are taken from a fresh `Metrics` registry, so a renamed instrument breaks
this test rather than a dashboard panel nobody looks at until the incident.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from app.config.schema import Settings
from app.metrics import Metrics, new_registry
from app.state.redis_engine import RedisState

ROOT = Path(__file__).resolve().parents[3]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules" / "tokengate.rules.yml"
RULE_TESTS = PROM / "tests" / "tokengate.rules.test.yml"
RUNBOOK = PROM / "RUNBOOK.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "tokengate-dashboard.json"
METRIC = re.compile(r"\btokengate_[a-z0-9_]+\b")
# What docs/contract.md "Metrics" promises; the dashboard must show each of them.
CONTRACT = {
    "tokengate_requests_total",
    "tokengate_tokens_total",
    "tokengate_request_duration_seconds",
    "tokengate_time_to_first_token_seconds",
    "tokengate_queue_depth",
    "tokengate_queue_wait_seconds",
    "tokengate_inflight",
    "tokengate_batch_size",
    "tokengate_upstream_retries_total",
    "tokengate_rate_limited_total",
    "tokengate_upstream_up",
}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


def exposed_names() -> dict[str, str]:
    """Every series name `app/metrics/` can expose -> the family it belongs to."""
    names: dict[str, str] = {}
    metrics = Metrics(new_registry())
    # the Redis gauges exist only with Redis configured; make sure they are listed
    metrics.record_redis_state(RedisState(up=True, degraded=False, misconfigured=False, replicas=1))
    for family in metrics.registry.collect():
        base = family.name
        if family.type == "counter":
            names[f"{base}_total"] = f"{base}_total"
        elif family.type == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[base + suffix] = base
        else:
            names[base] = base
    return names


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(dash) for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces -> '-'."""
    anchors = set()
    for line in markdown.splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_exposed_names_cover_the_contract() -> None:
    # Guards the helper itself: if it returned nothing, every check below would pass.
    assert set(exposed_names().values()) >= CONTRACT


def test_rules_reference_only_exposed_metrics() -> None:
    names = exposed_names()
    for rule in alerts():
        text = rule["expr"] + " ".join(rule["annotations"].values())
        unknown = set(METRIC.findall(text)) - set(names)
        assert not unknown, f"{rule['alert']} uses metrics app/metrics/ does not define"


def test_dashboard_references_only_exposed_metrics_and_shows_the_contract() -> None:
    names = exposed_names()
    used = {m for expr in dashboard_exprs(dashboard()) for m in METRIC.findall(expr)}
    assert used <= set(names), f"unknown metrics: {sorted(used - set(names))}"
    assert {names[m] for m in used} >= CONTRACT | {"tokengate_circuit_open"}
    # Only tokengate metrics: `up` and friends depend on the scrape job's name.
    for expr in dashboard_exprs(dashboard()):
        assert not re.search(r"\bup\{", expr), expr


def test_every_alert_has_severity_for_and_annotations_linking_the_runbook() -> None:
    anchors = heading_anchors(RUNBOOK.read_text())
    found = alerts()
    assert len(found) >= 6
    for rule in found:
        name = rule["alert"]
        assert name.startswith("Tokengate")
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert re.fullmatch(r"\d+[smh]", rule["for"]) and rule["for"] != "0s", name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert notes["runbook_url"] == f"deploy/prometheus/RUNBOOK.md#{name.lower()}", name
        assert name.lower() in anchors, f"RUNBOOK.md has no section for {name}"


def test_the_alerts_the_issue_asks_for_exist() -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in alerts()}
    wanted = {
        "TokengateUpstreamDown": "tokengate_upstream_up",
        "TokengateCircuitOpen": "tokengate_circuit_open",
        "TokengateHighRateLimitRatio": "tokengate_rate_limited_total",
        "TokengateQueueSaturation": "tokengate_queue_depth",
        "TokengateHighLatencyP99": "tokengate_request_duration_seconds_bucket",
        "TokengateRedisDown": "tokengate_redis_up",
        "TokengateQueueFull": "tokengate_queue_full_total",
        "TokengateHighServerErrorRatio": 'tokengate_requests_total{status=~"5.."}',
    }
    for alert, metric in wanted.items():
        assert metric in exprs.get(alert, ""), alert


def test_the_queue_alert_follows_the_configured_capacity() -> None:
    expr = {rule["alert"]: rule["expr"] for rule in alerts()}["TokengateQueueSaturation"]
    assert "tokengate_queue_depth / tokengate_queue_capacity" in expr
    # a fraction of the capacity, never a depth hard-coded for one queue_capacity
    assert all(float(n) <= 1 for n in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", expr)), expr


def test_the_dashboard_domain_filter_keeps_refusals_counted_under_none() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["domain"]["allValue"] == ".*"


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - fires == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a not-firing case"


def test_runbook_env_vars_name_real_settings() -> None:
    documented = {"TOKENGATE_REDIS_URL", "TOKENGATE_ADMIN_KEY", "TOKENGATE_API_KEY"}
    found = set(re.findall(r"\bTOKENGATE_[A-Z0-9_]+\b", RUNBOOK.read_text()))
    assert "TOKENGATE_TOKEN_SCHEDULER__BATCH_SIZE" in found
    assert "TOKENGATE_RATE_LIMIT__REQUESTS_PER_MINUTE" in found
    for var in sorted(found - documented):
        section, _, field = var.removeprefix("TOKENGATE_").lower().partition("__")
        assert section in Settings.model_fields, var
        model = Settings.model_fields[section].annotation
        assert field in model.model_fields, var  # type: ignore[union-attr]


def test_dashboard_is_importable_and_uses_the_datasource_variable() -> None:
    dash = dashboard()
    assert dash["schemaVersion"] == 39 and dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in panels(dash):
        assert 0 <= panel["gridPos"]["x"] and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for ds in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
            assert ds == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]


def test_dashboard_variables_are_defined() -> None:
    dash = dashboard()
    defined = {v["name"] for v in dash["templating"]["list"]} | GRAFANA_BUILTINS
    for expr in dashboard_exprs(dash):
        used = set(re.findall(r"\$\{?(\w+)", expr))
        assert used <= defined, f"undefined variables {sorted(used - defined)} in {expr}"


def test_dashboard_panels_do_not_overlap() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]
