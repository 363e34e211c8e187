"""The deployment files agree with the server: the rendered Kubernetes manifests (kustomize
base and the example overlay), the Dockerfile and the Grafana dashboard.

The manifests are rendered with `kubectl kustomize` (skipped when kubectl is absent: deploy/ci.sh
installs it). The shutdown budget is checked by the server's own `Settings`, built from the
environment the container would get.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from agent_server.metrics import Metrics
from agent_server.settings import SHUTDOWN_MARGIN, Settings

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "deploy" / "kubernetes"
EXAMPLE = ROOT / "deploy" / "examples" / "long-running"
DASHBOARD = ROOT / "deploy" / "grafana" / "agent-server.json"
ENV_PREFIX = "AGENT_SERVER_"
#: Environment variables the image reads that are not Settings fields.
NOT_SETTINGS = {"AGENT_SERVER_APP"}

Manifest = dict[str, Any]


def render(directory: Path) -> list[Manifest]:
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (deploy/ci.sh installs it); cannot render kustomize")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def base() -> list[Manifest]:
    return render(BASE)


@pytest.fixture(scope="module")
def example() -> list[Manifest]:
    return render(EXAMPLE)


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(manifests: list[Manifest]) -> Manifest:
    spec: Manifest = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def server_container(manifests: list[Manifest]) -> Manifest:
    containers = pod_spec(manifests)["containers"]
    found = [c for c in containers if c["name"] == "agent-server"]
    assert len(found) == 1, "no container named agent-server"
    container: Manifest = found[0]
    return container


def container_env(manifests: list[Manifest]) -> dict[str, str]:
    """The environment the container gets: envFrom ConfigMaps, then env (which wins)."""
    container = server_container(manifests)
    config_maps = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        assert ref in config_maps, f"envFrom names ConfigMap {ref!r}, which is not rendered"
        env.update(config_maps[ref].get("data", {}))
    for item in container.get("env", []):
        assert "value" in item, f"env {item['name']} is not a plain value"
        env[item["name"]] = item["value"]
    return env


def server_settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The server's own Settings (and so its own budget check) from the container's env."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    fields = {
        name.removeprefix(ENV_PREFIX).lower(): value
        for name, value in env.items()
        if name.startswith(ENV_PREFIX) and name not in NOT_SETTINGS
    }
    return Settings(**fields)


def settings_of(manifests: list[Manifest], monkeypatch: pytest.MonkeyPatch) -> Settings:
    return server_settings(container_env(manifests), monkeypatch)


# ---- the shutdown budget ---------------------------------------------------------------------


@pytest.mark.parametrize("which", ["base", "example"])
def test_grace_period_is_the_one_value_the_kubelet_and_the_server_share(
    which: str, request: pytest.FixtureRequest
) -> None:
    manifests = request.getfixturevalue(which)
    env = container_env(manifests)
    grace = pod_spec(manifests)["terminationGracePeriodSeconds"]
    assert isinstance(grace, int), "terminationGracePeriodSeconds must render as an integer"
    assert float(env["AGENT_SERVER_GRACE_PERIOD"]) == grace


def test_the_example_overlay_changes_the_grace_period_in_one_place(
    base: list[Manifest], example: list[Manifest]
) -> None:
    assert pod_spec(example)["terminationGracePeriodSeconds"] == 600
    assert pod_spec(base)["terminationGracePeriodSeconds"] != 600


@pytest.mark.parametrize("which", ["base", "example"])
def test_the_budget_passes_the_servers_own_check(
    which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = request.getfixturevalue(which)
    settings = settings_of(manifests, monkeypatch)  # raises if the budget does not fit
    drain = settings.effective_drain_timeout
    assert drain > 0, "nothing left for running work to finish in"
    total = (
        settings.unready_delay
        + drain
        + settings.cancel_timeout
        + settings.http_timeout
        + SHUTDOWN_MARGIN
    )
    assert total <= pod_spec(manifests)["terminationGracePeriodSeconds"]


def test_a_grace_period_too_short_for_the_budget_is_refused(
    base: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above is live: the same env with a grace period that cannot hold it fails."""
    env = container_env(base)
    settings = server_settings(env, monkeypatch)
    too_short = settings.unready_delay + settings.cancel_timeout + settings.http_timeout
    with pytest.raises(ValidationError, match="budget"):
        server_settings({**env, "AGENT_SERVER_GRACE_PERIOD": str(too_short)}, monkeypatch)


@pytest.mark.parametrize("which", ["base", "example"])
def test_every_agent_server_variable_is_a_known_setting(
    which: str, request: pytest.FixtureRequest
) -> None:
    """A misspelt AGENT_SERVER_* name would be ignored by the server: catch it here."""
    env = container_env(request.getfixturevalue(which))
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields} | NOT_SETTINGS
    unknown = sorted(name for name in env if name.startswith(ENV_PREFIX) and name not in known)
    assert not unknown, f"not settings of the server: {unknown}"


def test_service_links_cannot_shadow_the_settings(base: list[Manifest]) -> None:
    """A Service named agent-server would inject AGENT_SERVER_PORT=tcp://... into its pods."""
    assert pod_spec(base)["enableServiceLinks"] is False


# ---- probes, ports, metrics ------------------------------------------------------------------


def container_port(container: Manifest, port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container["ports"] if "name" in p}
    assert port in named, f"port {port!r} is not a named container port"
    return int(named[port])


def test_probes_hit_readyz_and_healthz_on_the_servers_port(
    base: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    container = server_container(base)
    settings = settings_of(base, monkeypatch)
    assert settings.host == "0.0.0.0"
    readiness = container["readinessProbe"]["httpGet"]
    liveness = container["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/readyz"
    assert liveness["path"] == "/healthz"
    assert container_port(container, readiness["port"]) == settings.port
    assert container_port(container, liveness["port"]) == settings.port


def test_prometheus_annotations_point_at_metrics(
    base: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    annotations = one(base, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == settings_of(base, monkeypatch).port


def test_security_context(base: list[Manifest]) -> None:
    pod = pod_spec(base)
    container = server_container(base)
    assert pod["securityContext"]["runAsNonRoot"] is True
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    # With a read-only root filesystem, /tmp is a volume.
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])


def test_service_and_disruption_budget_select_the_pods(base: list[Manifest]) -> None:
    labels = one(base, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = one(base, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    target = service["spec"]["ports"][0]["targetPort"]
    assert container_port(server_container(base), target) == 8000
    budget = one(base, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_servicemonitor_component_scrapes_the_service_instead_of_the_pods(
    example: list[Manifest],
) -> None:
    """kubernetes-validate has no schema for the ServiceMonitor CRD: check it against the
    Service it must select."""
    monitor = one(example, "ServiceMonitor")
    service = one(example, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
    annotations = one(example, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "false", "scraped twice"


# ---- the image -------------------------------------------------------------------------------


def test_dockerfile_agrees_with_the_manifests(base: list[Manifest]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    assert user is not None, "the Dockerfile has no numeric USER uid:gid"
    context = pod_spec(base)["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (int(user[1]), int(user[2]))
    assert re.search(r"^EXPOSE 8000$", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["agent-server", "run"\]$', dockerfile, re.M)
    assert re.search(r"^STOPSIGNAL SIGTERM$", dockerfile, re.M)
    assert "AGENT_SERVER_HOST=0.0.0.0" in dockerfile


# ---- the Grafana dashboard -------------------------------------------------------------------


def exposed_metric_names() -> set[str]:
    metrics = Metrics()
    metrics.add_reasoner("example")
    metrics.http_request("GET", "/readyz", 200, 0.001)  # HTTP series exist once observed
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


def dashboard_exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in dashboard_exprs(value)]
    if isinstance(node, list):
        return [e for item in node for e in dashboard_exprs(item)]
    return []


def test_dashboard_queries_only_metrics_the_server_exposes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard)
    used = {name for expr in exprs for name in re.findall(r"\bagent_server_\w+", expr)}
    missing = sorted(used - exposed_metric_names())
    assert not missing, f"the dashboard queries metrics the server does not expose: {missing}"
    for required in (
        "agent_server_executions_inflight",
        "agent_server_executions_finished_total",
        "agent_server_execution_duration_seconds_bucket",
        "agent_server_requests_rejected_total",
        "agent_server_shutdown_duration_seconds",
        "agent_server_shutdown_executions_total",
    ):
        assert required in used, f"no panel shows {required}"
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert any(title.startswith("Shutdown") for title in titles)
