"""Every YAML file under deploy/ parses, and the manifests agree with each other.

Kubernetes: probes, drain timing, resources, non-root, and that the HPA, PDB,
Service and ServiceMonitor all point at the Deployment's pods. Compose: the
two-replica trial with Redis, Prometheus and the simulated upstream.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from app.config.schema import ServerConfig
from tests.unit.deploy.files import (
    COMPOSE,
    DEPLOY,
    GUIDE,
    K8S,
    ROOT,
    compose,
    dockerfile_stages,
    documents,
    k8s_object,
    our_yaml_files,
)

LISTED = {
    "namespace.yaml",
    "configmap.yaml",
    "deployment.yaml",
    "service.yaml",
    "hpa.yaml",
    "pdb.yaml",
    "servicemonitor.yaml",
}
NOT_LISTED = {"secret.example.yaml", "hpa-queue-depth.yaml", "db-upgrade-job.yaml"}
DRAIN_TIMEOUT_DEFAULT = ServerConfig.model_fields["drain_timeout_sec"].default
DRAIN_DELAY_DEFAULT = ServerConfig.model_fields["drain_delay_sec"].default


def test_the_deploy_files_are_all_there() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in our_yaml_files()}
    expected = {"compose.yaml", "k8s/kustomization.yaml"} | {f"k8s/{n}" for n in LISTED}
    assert expected | {f"k8s/{n}" for n in NOT_LISTED} <= names


@pytest.mark.parametrize("path", our_yaml_files(), ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_yaml_parses(path: Path) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no document"
    assert all(isinstance(d, dict) for d in docs)
    if path.is_relative_to(K8S) and path.name != "kustomization.yaml":
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), path
            assert doc["metadata"].get("name"), path


# -- kustomize -------------------------------------------------------------------------------


def test_kustomization_lists_the_manifests_and_nothing_outside() -> None:
    (kust,) = documents(K8S / "kustomization.yaml")
    assert kust["kind"] == "Kustomization"
    resources = set(kust["resources"])
    assert resources == LISTED
    assert not resources & NOT_LISTED, "placeholders must never be applied over real Secrets"
    # kustomize's default load restrictor refuses files outside the kustomization root.
    assert "configMapGenerator" not in kust
    assert all(not r.startswith(("/", "..")) for r in resources)


def test_configmap_is_the_repo_config() -> None:
    cm = k8s_object("configmap.yaml", "ConfigMap")
    hint = (
        "deploy/k8s/configmap.yaml drifted from config/: regenerate it "
        "(see the command at the top of that file)"
    )
    for name in ("config.toml", "settings.json"):
        assert cm["data"][name] == (ROOT / "config" / name).read_text(encoding="utf-8"), hint


# -- the Deployment ------------------------------------------------------------------------


def _deployment() -> dict[str, Any]:
    return k8s_object("deployment.yaml", "Deployment")


def _pod() -> dict[str, Any]:
    spec: dict[str, Any] = _deployment()["spec"]["template"]["spec"]
    return spec


def _container() -> dict[str, Any]:
    (container,) = _pod()["containers"]
    assert isinstance(container, dict)
    return container


def _pod_labels() -> dict[str, str]:
    labels: dict[str, str] = _deployment()["spec"]["template"]["metadata"]["labels"]
    return labels


def _env() -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _container()["env"]}


def _env_value(name: str, default: float) -> float:
    entry = _env().get(name)
    return float(entry["value"]) if entry else float(default)


def test_deployment_selector_matches_its_pods() -> None:
    selector = _deployment()["spec"]["selector"]["matchLabels"]
    assert selector and selector.items() <= _pod_labels().items()


def test_probes() -> None:
    c = _container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8080}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # Liveness must not watch readiness: a draining or upstream-less pod is alive.
    assert c["startupProbe"]["httpGet"]["path"] == "/health"


def _prestop_seconds() -> float:
    command = _container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, command
    return float(command[1])


def test_grace_period_outlasts_prestop_and_drain() -> None:
    prestop = _prestop_seconds()
    assert prestop > 0
    drain = _env_value("TOKENGATE_SERVER__DRAIN_TIMEOUT_SEC", DRAIN_TIMEOUT_DEFAULT)
    delay = _env_value("TOKENGATE_SERVER__DRAIN_DELAY_SEC", DRAIN_DELAY_DEFAULT)
    grace = _pod()["terminationGracePeriodSeconds"]
    assert grace > prestop + delay + drain, (grace, prestop, delay, drain)


_UNITS = {"m": 1e-3, "": 1.0, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 1e3, "M": 1e6, "G": 1e9}


def _quantity(value: str | int | float) -> float:
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match and match.group(2) in _UNITS, value
    return float(match.group(1)) * _UNITS[match.group(2)]


def test_resources_requested_and_limited() -> None:
    res = _container()["resources"]
    for kind in ("cpu", "memory"):
        request, limit = _quantity(res["requests"][kind]), _quantity(res["limits"][kind])
        assert 0 < request <= limit, kind


def test_non_root_with_a_read_only_root_filesystem() -> None:
    pod_sc, sc = _pod()["securityContext"], _container()["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and sc["runAsNonRoot"] is True
    uid = dockerfile_stages()[-1].all("USER")[-1].args.split(":")[0]
    assert pod_sc["runAsUser"] == int(uid) != 0, "the pod runs as the image's user"
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]


def test_no_state_is_kept_in_the_pod() -> None:
    """The ledger, batches and live limits live in the shared PostgreSQL: a pod keeps
    nothing that its replacement would need, so /tmp is its only (scratch) emptyDir."""
    volumes = {v["name"]: v for v in _pod()["volumes"]}
    mounts = {m["mountPath"]: m for m in _container()["volumeMounts"]}
    scratch = [path for path, m in mounts.items() if "emptyDir" in volumes[m["name"]]]
    assert scratch == ["/tmp"], "uvicorn/prometheus_client need /tmp; nothing else"
    env = _env()
    assert "TOKENGATE_DATABASE_URL" in env and "TOKENGATE_DATABASE__PATH" not in env
    assert "TOKENGATE_LEDGER__PATH" not in env and "TOKENGATE_BATCH__PATH" not in env
    assert env["TOKENGATE_LOGGING__OUTPUT"]["value"] in {"stdout", "stderr"}


def test_the_db_upgrade_job_runs_the_deployments_image_on_its_database() -> None:
    job = k8s_object("db-upgrade-job.yaml", "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tokengate", "db", "upgrade"]
    assert container["image"] == _container()["image"]
    env = {e["name"]: e for e in container["env"]}
    for name in ("TOKENGATE_DATABASE_URL", "TAOTOKEN_API_KEY"):
        assert env[name]["valueFrom"] == _env()[name]["valueFrom"], name
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_config_comes_from_the_configmap() -> None:
    volumes = {v["name"]: v for v in _pod()["volumes"]}
    mounts = {m["mountPath"]: m for m in _container()["volumeMounts"]}
    cm = k8s_object("configmap.yaml", "ConfigMap")
    for var in ("TOKENGATE_CONFIG", "TOKENGATE_SETTINGS"):
        path = Path(_env()[var]["value"])
        mount = mounts[str(path.parent)]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
        assert path.name in cm["data"]


def test_secrets_come_from_secret_refs_the_example_defines() -> None:
    env = _env()
    example = {d["metadata"]["name"]: d for d in documents(K8S / "secret.example.yaml")}
    for name in (
        "TAOTOKEN_API_KEY",
        "TOKENGATE_KEYS",
        "TOKENGATE_REDIS_URL",
        "TOKENGATE_DATABASE_URL",
        "TOKENGATE_ADMIN_KEY",
        "TOKENGATE_REDIS__PASSWORD",
        "TOKENGATE_REDIS__SENTINEL_PASSWORD",
    ):
        assert "value" not in env[name], f"{name} must not be a literal in the manifest"
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["key"] in example[ref["name"]]["stringData"], name
    # More than one replica without Redis would multiply every per-key limit.
    assert not env["TOKENGATE_REDIS_URL"]["valueFrom"]["secretKeyRef"].get("optional", False)
    assert not env["TOKENGATE_DATABASE_URL"]["valueFrom"]["secretKeyRef"].get("optional", False)
    # While Redis is away each pod takes its share: assume at least the HPA's floor.
    hpa = k8s_object("hpa.yaml", "HorizontalPodAutoscaler")
    assert int(env["TOKENGATE_REDIS__ASSUMED_REPLICAS"]["value"]) == hpa["spec"]["minReplicas"]
    assert not env["TAOTOKEN_API_KEY"]["valueFrom"]["secretKeyRef"].get("optional", False)
    for secret in example.values():
        for key, value in secret["stringData"].items():
            assert "REPLACE_ME" in value, f"{key}: the example holds placeholders only"


def test_service_routes_to_the_pods() -> None:
    svc = k8s_object("service.yaml", "Service")
    assert svc["spec"]["selector"].items() <= _pod_labels().items()
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in _container()["ports"]}


def test_pdb_covers_the_pods_and_lets_a_drain_proceed() -> None:
    pdb = k8s_object("pdb.yaml", "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= _pod_labels().items()
    assert 0 < pdb["spec"]["minAvailable"] < _deployment()["spec"]["replicas"]


@pytest.mark.parametrize("filename", ["hpa.yaml", "hpa-queue-depth.yaml"])
def test_hpa_targets_the_deployment(filename: str) -> None:
    hpa = k8s_object(filename, "HorizontalPodAutoscaler")
    dep = _deployment()
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": dep["apiVersion"],
        "kind": "Deployment",
        "name": dep["metadata"]["name"],
    }
    spec = hpa["spec"]
    assert 2 <= spec["minReplicas"] <= spec["maxReplicas"]
    cpu = [m for m in spec["metrics"] if m["type"] == "Resource"]
    assert [m["resource"]["name"] for m in cpu] == ["cpu"]
    assert "cpu" in _container()["resources"]["requests"], "CPU utilization needs a request"


def test_queue_depth_hpa_uses_the_gateway_metric() -> None:
    from app.metrics import Metrics, new_registry

    hpa = k8s_object("hpa-queue-depth.yaml", "HorizontalPodAutoscaler")
    (pods,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    name = pods["metric"]["name"]
    assert name == "tokengate_queue_depth"
    metrics = Metrics(new_registry())
    metrics.set_queue_depth("domain-a", 3)
    assert f'{name}{{domain="domain-a"}} 3.0' in metrics.render().decode()


def test_service_monitor_scrapes_metrics() -> None:
    sm = k8s_object("servicemonitor.yaml", "ServiceMonitor")
    svc = k8s_object("service.yaml", "Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}


# -- compose -------------------------------------------------------------------------------

GATEWAYS = ("gateway-1", "gateway-2")


def _services() -> dict[str, Any]:
    services: dict[str, Any] = compose()["services"]
    return services


def test_compose_services() -> None:
    assert set(_services()) == {*GATEWAYS, "sim", "redis", "postgres", "prometheus", "grafana"}


def test_compose_keeps_durable_state_on_named_volumes() -> None:
    """PostgreSQL holds what must not be lost; Redis appends every write to its AOF."""
    services, volumes = _services(), compose()["volumes"]
    pg, redis = services["postgres"], services["redis"]
    pg_volume, pg_path = pg["volumes"][0].split(":")
    assert pg_volume in volumes and pg_path == "/var/lib/postgresql/data"
    assert "pg_isready" in pg["healthcheck"]["test"]
    args = redis["command"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert redis["volumes"][0].split(":")[0] in volumes


@pytest.mark.parametrize("name", GATEWAYS)
def test_compose_gateways_build_the_repo_image(name: str) -> None:
    svc = _services()[name]
    assert (COMPOSE.parent / svc["build"]["context"]).resolve() == ROOT
    assert svc["build"]["dockerfile"] == "Dockerfile"
    assert svc["image"] == _services()[GATEWAYS[0]]["image"]
    env = svc["environment"]
    assert env["TOKENGATE_REDIS_URL"] == "redis://redis:6379/0"
    assert env["TOKENGATE_API_ENDPOINT"] == "http://sim:9090"
    assert {p.split(":")[-1] for p in svc["ports"]} == {"8080"}
    assert svc["depends_on"]["sim"]["condition"] == "service_healthy"
    assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
    url = env["TOKENGATE_DATABASE_URL"]
    pg = _services()["postgres"]["environment"]
    assert url == (
        f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/"
        f"{pg['POSTGRES_DB']}"
    )


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)s", value)
    assert match, value
    return float(match.group(1))


@pytest.mark.parametrize("name", GATEWAYS)
def test_compose_stop_grace_outlasts_the_drain(name: str) -> None:
    svc = _services()[name]
    env = svc["environment"]
    drain = float(env.get("TOKENGATE_SERVER__DRAIN_TIMEOUT_SEC", DRAIN_TIMEOUT_DEFAULT))
    delay = float(env.get("TOKENGATE_SERVER__DRAIN_DELAY_SEC", DRAIN_DELAY_DEFAULT))
    assert _seconds(svc["stop_grace_period"]) > drain + delay


def test_compose_sim_accepts_the_gateways_upstream_key() -> None:
    sim = _services()["sim"]
    assert sim["entrypoint"] == ["tokengate", "sim"]
    args = sim["command"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--host"] == "0.0.0.0" and flags["--port"] == "9090"
    assert "ports" not in sim, "the sim's control routes have no auth: keep it unpublished"
    for name in GATEWAYS:
        assert _services()[name]["environment"]["TAOTOKEN_API_KEY"] == flags["--api-key"]


def test_compose_demo_key_is_the_documented_one() -> None:
    documented = re.findall(r"\btg-compose-trial-[A-Za-z0-9-]+", GUIDE.read_text())
    assert documented, "DEPLOYMENT.md must give the trial's demo key"
    digest = hashlib.sha256(documented[0].encode()).hexdigest()
    for name in GATEWAYS:
        keys = json.loads(_services()[name]["environment"]["TOKENGATE_KEYS"])
        assert [k["key_sha256"] for k in keys] == [digest]


def test_compose_prometheus_mounts_the_monitoring_files() -> None:
    prom = _services()["prometheus"]
    mounts = {}
    for volume in prom["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[(COMPOSE.parent / source).resolve()] = target
    config, rules = DEPLOY / "prometheus" / "prometheus.yml", DEPLOY / "prometheus" / "rules"
    assert mounts == {config: "/etc/prometheus/prometheus.yml", rules: "/etc/prometheus/rules"}
    assert config.is_file() and rules.is_dir()


def test_compose_prometheus_scrapes_compose_services() -> None:
    (scrape,) = documents(DEPLOY / "prometheus" / "prometheus.yml")
    targets = [
        target
        for job in scrape["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    ]
    assert {"gateway-1:8080", "gateway-2:8080"} <= set(targets)
    for target in targets:
        host, _, port = target.partition(":")
        assert host in _services(), f"{target}: no such compose service"
        assert port in {"8080", "9090", "6379"}, target


def test_compose_grafana_provisions_the_dashboard_on_the_prometheus_service() -> None:
    grafana = _services()["grafana"]
    mounts = {}
    for volume in grafana["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[target] = (COMPOSE.parent / source).resolve()
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = documents(provisioning / "datasources" / "prometheus.yaml")
    (source,) = datasource["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    host, _, port = source["url"].removeprefix("http://").partition(":")
    assert host in _services() and _services()[host]["ports"] == [f"{port}:{port}"]
    (dashboards,) = documents(provisioning / "dashboards" / "tokengate.yaml")
    (provider,) = dashboards["providers"]
    folder = provider["options"]["path"]
    (mounted,) = [src for target, src in mounts.items() if target.startswith(f"{folder}/")]
    assert mounted == DEPLOY / "grafana" / "tokengate-dashboard.json" and mounted.is_file()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in mounts and mounts[home] == mounted
    # the dashboard's datasource variable picks the default Prometheus datasource
    variables = {v["name"]: v for v in json.loads(mounted.read_text())["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert "prometheus" in grafana["depends_on"]
