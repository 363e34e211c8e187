"""deploy/examples/postgres: the replicas on one Postgres instead of the base's Redis.

What test_deploy_manifests.py checks of every overlay (the shutdown budget, strict schema
validation, several replicas only on a shared store, the replica id) covers this one too; here,
what only it has: the store URL from a Secret (no password in a plain value anywhere), the
`store migrate` initContainer, no Redis left, a connection budget that fits max_connections,
and the Postgres StatefulSet. Its init script, its readiness probe and the initContainer's
command then run for real against Debian's PostgreSQL (tests/support/postgres_server.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.process.test_deploy_manifests import (
    KUSTOMIZATIONS,
    POSTGRES,
    Manifest,
    container_env,
    container_port,
    one,
    pod_labels,
    pod_spec,
    render,
    secret_value,
    server_container,
    settings_of,
    statefulset_claims,
    workload,
)
from tests.support.postgres_server import PostgresServer, bindir

PG = "agent-server-postgres"
#: The image's entrypoint runs what is mounted here once, on an empty data directory.
INITDB_D = "/docker-entrypoint-initdb.d"


@pytest.fixture(scope="module")
def postgres() -> list[Manifest]:
    return render(POSTGRES)


def postgres_container(manifests: list[Manifest]) -> Manifest:
    containers = pod_spec(manifests, PG)["containers"]
    assert len(containers) == 1
    container: Manifest = containers[0]
    return container


def migrate_container(manifests: list[Manifest]) -> Manifest:
    found = [c for c in pod_spec(manifests).get("initContainers", []) if c["name"] == "migrate"]
    assert len(found) == 1, "no migrate initContainer"
    container: Manifest = found[0]
    return container


def all_containers(manifests: list[Manifest]) -> list[Manifest]:
    return [
        container
        for m in manifests
        if m["kind"] in ("Deployment", "StatefulSet")
        for key in ("initContainers", "containers")
        for container in m["spec"]["template"]["spec"].get(key, [])
    ]


def store_url(manifests: list[Manifest]) -> str:
    return container_env(manifests)["AGENT_SERVER_STORE"]


def init_script(manifests: list[Manifest]) -> str:
    mounts = {m["mountPath"]: m["name"] for m in postgres_container(manifests)["volumeMounts"]}
    assert INITDB_D in mounts, f"nothing mounted at {INITDB_D}"
    volume = next(v for v in pod_spec(manifests, PG)["volumes"] if v["name"] == mounts[INITDB_D])
    assert volume["configMap"]["defaultMode"] & 0o111, "sourced, not run: make it executable"
    data = one(manifests, "ConfigMap", volume["configMap"]["name"])["data"]
    assert len(data) == 1
    script: str = next(iter(data.values()))
    return script


# ---- no password in a plain value ------------------------------------------------------------


def plain_secrets(manifests: list[Manifest]) -> list[str]:
    """Plain values (env `value`, ConfigMap data, arguments) holding a URL with a password, or
    a *PASSWORD variable: they belong in a Secret."""
    found = []
    values: list[tuple[str, str]] = []
    for container in all_containers(manifests):
        for item in container.get("env", []):
            if "value" in item:
                values.append((f"env {item['name']}", str(item["value"])))
        for arg in [*container.get("command", []), *container.get("args", [])]:
            values.append(("argument", str(arg)))
    for config_map in (m for m in manifests if m["kind"] == "ConfigMap"):
        for key, value in config_map.get("data", {}).items():
            values.append((f"ConfigMap {key}", str(value)))
    for where, value in values:
        if "PASSWORD" in where.upper().split()[-1]:
            found.append(where)
        for url in re.findall(r"\b[a-z][a-z+]*://\S+", value):
            if urlsplit(url).password is not None:
                found.append(f"{where}: {urlsplit(url).scheme}:// with a password")
    return found


@pytest.mark.parametrize(
    "directory", list(KUSTOMIZATIONS.values()), ids=[d.name for d in KUSTOMIZATIONS.values()]
)
def test_no_password_in_a_plain_value(directory: Path) -> None:
    assert plain_secrets(render(directory)) == []


def test_the_plain_value_check_can_fail(postgres: list[Manifest]) -> None:
    """The check above is live: the Secret's URL in a plain env value, or a password in a
    plain POSTGRES_PASSWORD, is caught."""
    url = store_url(postgres)
    broken = json.loads(json.dumps(postgres))
    server_container(broken)["env"].append({"name": "AGENT_SERVER_STORE", "value": url})
    postgres_container(broken)["env"].append({"name": "POSTGRES_PASSWORD", "value": "x"})
    assert plain_secrets(broken) == [
        "env AGENT_SERVER_STORE: postgresql:// with a password",
        "env POSTGRES_PASSWORD",
    ]


def test_the_store_url_comes_from_a_secret_and_names_the_postgres_service(
    postgres: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    items = [e for e in server_container(postgres)["env"] if e["name"] == "AGENT_SERVER_STORE"]
    assert len(items) == 1
    ref = items[0]["valueFrom"]["secretKeyRef"]
    secret = one(postgres, "Secret", ref["name"])
    url = urlsplit(store_url(postgres))
    assert url.scheme == "postgresql"
    service = one(postgres, "Service", PG)
    assert url.hostname == service["metadata"]["name"]
    ports = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    assert len(ports) == 1, f"the Service has no port {url.port}"
    assert container_port(postgres_container(postgres), ports[0]["targetPort"]) == 5432
    assert service["spec"]["selector"].items() <= pod_labels(postgres, PG).items()
    # The ordinary role the init script makes, with the password it is given: never the
    # image's superuser.
    assert url.username == "agent" != "postgres"
    assert url.password == secret_value(
        postgres, {"name": secret["metadata"]["name"], "key": "password"}
    )
    assert url.path == "/agents"
    # The base's redis:// is gone from the ConfigMap, not merely shadowed by the env entry.
    (source,) = server_container(postgres)["envFrom"]
    config = one(postgres, "ConfigMap", source["configMapRef"]["name"])["data"]
    assert "AGENT_SERVER_STORE" not in config
    assert settings_of(postgres, monkeypatch).store_url == store_url(postgres)


def test_no_redis_in_the_postgres_variant(postgres: list[Manifest]) -> None:
    named = [f"{m['kind']} {m['metadata']['name']}" for m in postgres]
    assert not [n for n in named if "redis" in n.lower()], named
    images = [c["image"] for c in all_containers(postgres)]
    assert not [i for i in images if "redis" in i], images
    assert "redis" not in "".join(str(v) for v in container_env(postgres).values())
    kinds = sorted(m["kind"] for m in postgres)
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "Service",
        "StatefulSet",
    ]


# ---- the migration ---------------------------------------------------------------------------


def test_every_pod_migrates_before_its_server_starts(postgres: list[Manifest]) -> None:
    migrate = migrate_container(postgres)
    server = server_container(postgres)
    assert [*migrate["command"], *migrate["args"]] == ["agent-server", "store", "migrate"]
    assert migrate["image"] == server["image"], "the schema of another release"
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in migrate["env"] if "valueFrom" in e}
    server_ref = next(e for e in server["env"] if e["name"] == "AGENT_SERVER_STORE")
    assert refs["AGENT_SERVER_STORE"] == server_ref["valueFrom"]["secretKeyRef"]
    context = migrate["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(migrate["resources"]["limits"])


# ---- connections -----------------------------------------------------------------------------

#: Postgres's superuser_reserved_connections, left at its default.
RESERVED = 3


def postgres_setting(manifests: list[Manifest], name: str) -> str:
    args = postgres_container(manifests)["args"]
    assert args[0] == "postgres"
    settings = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-c")
    return settings[name]


def test_every_pods_pool_fits_max_connections_during_a_rollout(
    postgres: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = one(postgres, "Deployment", "agent-server")["spec"]
    pods = deployment["replicas"] + int(deployment["strategy"]["rollingUpdate"]["maxSurge"])
    settings = settings_of(postgres, monkeypatch)
    listener = 1 if settings.store_notify == "listen" else 0
    needed = pods * (settings.store_pool_size + listener) + RESERVED
    assert needed <= int(postgres_setting(postgres, "max_connections"))
    # The comment states the same sum.
    text = (POSTGRES / "kustomization.yaml").read_text()
    sum_said = f"{pods} pods x ({settings.store_pool_size} + {listener}) + {RESERVED} reserved"
    assert f"{sum_said} for superusers = {needed} <= " in text


# ---- the Postgres StatefulSet ----------------------------------------------------------------


def test_postgres_is_one_pinned_stateful_pod_on_its_own_volume(postgres: list[Manifest]) -> None:
    statefulset = workload(postgres, PG)
    spec = statefulset["spec"]
    assert statefulset["kind"] == "StatefulSet" and spec["replicas"] == 1
    assert spec["serviceName"] == one(postgres, "Service", PG)["metadata"]["name"]
    assert spec["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    container = postgres_container(postgres)
    assert re.fullmatch(r"postgres:\d+\.\d+", container["image"]), "pin the image's version"
    env = {e["name"]: e for e in container["env"]}
    for name in ("POSTGRES_PASSWORD", "AGENT_PASSWORD"):
        assert "secretKeyRef" in env[name]["valueFrom"], name
    pgdata = env["PGDATA"]["value"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = mounts[str(Path(pgdata).parent)]
    assert volume in statefulset_claims(statefulset), "PGDATA is not on a volumeClaimTemplate"
    assert pgdata != str(Path(pgdata).parent), "initdb wants a directory without lost+found"
    readiness = container["readinessProbe"]["exec"]["command"]
    assert readiness[0] == "pg_isready"
    assert "livenessProbe" not in container, "a restart during recovery starts it over"
    stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert stop[:2] == ["pg_ctl", "stop"] and "fast" in stop and pgdata in stop
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert isinstance(grace, int) and grace > int(stop[stop.index("--timeout") + 1])
    pod = pod_spec(postgres, PG)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Postgres writes its socket and temporary files: volumes, on a read-only root.
    assert {"/var/run/postgresql", "/tmp"} <= set(mounts)


def test_the_init_script_makes_the_role_of_the_url(postgres: list[Manifest]) -> None:
    script = init_script(postgres)
    url = urlsplit(store_url(postgres))
    assert f"CREATE ROLE {url.username} LOGIN" in script and "NOSUPERUSER" in script
    assert f"CREATE DATABASE {url.path.lstrip('/')} OWNER {url.username}" in script
    assert "$AGENT_PASSWORD" in script


# ---- for real, on Debian's PostgreSQL ---------------------------------------------------------


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_init_script_probe_and_migration_on_a_real_postgres(
    postgres: list[Manifest], postgres_server: Any, tmp_path: Path
) -> None:
    """On a server without the store's role: the init script (as the image's entrypoint runs
    it, as the superuser) makes it; `agent-server store migrate`, with the URL from
    AGENT_SERVER_STORE as in the initContainer, creates the schema as that role, then has
    nothing to do; the role is no superuser; the readiness probe passes, and fails once
    Postgres is gone."""
    server: PostgresServer = postgres_server
    if server.proc is None or not server.ready():
        server.start()
    server.admin("DROP DATABASE IF EXISTS agents WITH (FORCE)", "DROP ROLE IF EXISTS agent")
    script = tmp_path / "init-agent-role.sh"
    script.write_text(init_script(postgres))
    password = urlsplit(store_url(postgres)).password
    assert password is not None
    path = f"{bindir()}:{os.environ['PATH']}"
    as_entrypoint = {
        **os.environ,
        "PATH": path,
        "PGHOST": str(server.data),
        "PGPORT": str(server.port),
        "POSTGRES_USER": "postgres",
        "AGENT_PASSWORD": password,
    }
    done = run(["sh", str(script)], as_entrypoint)
    assert done.returncode == 0, done.stderr
    rows = server.admin(
        "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = 'agent'"
    )
    assert rows == [(False, False, False)]

    # The manifest's URL, pointed at this server's address.
    url = urlsplit(store_url(postgres))
    local = urlunsplit(url._replace(netloc=f"agent:{password}@127.0.0.1:{server.port}"))
    migrate = migrate_container(postgres)
    command = [sys.executable, "-m", "agent_server", *migrate["args"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_SERVER_", "PG"))}
    env["AGENT_SERVER_STORE"] = local
    first = run(command, env)
    assert first.returncode == 0, first.stderr
    assert "applied" in first.stdout and password not in first.stdout + first.stderr
    again = run(command, env)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    owners = server.admin(
        "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'", database="agents"
    )
    assert owners == [("agent",)]

    probe = [*postgres_container(postgres)["readinessProbe"]["exec"]["command"]]
    probe[probe.index("--port") + 1] = str(server.port)
    probe[0] = str(bindir() / "pg_isready")
    assert run(probe, {**os.environ, "PATH": path}).returncode == 0
    server.stop()
    assert run(probe, {**os.environ, "PATH": path}).returncode != 0
