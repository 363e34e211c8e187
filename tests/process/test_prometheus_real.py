"""The PromQL of docs/metrics.md and the Grafana dashboard, run by a real Prometheus.

Debian's `prometheus` scrapes a real `agent-server run` every second, with the `namespace`
and `pod` labels a Kubernetes scrape adds, and a real `prometheus-pushgateway` (with
`honor_labels`, and the gateway's own pod labels, as on a cluster) that receives the
shutdown push. The server serves traffic, drains with refusals, a finished, a cancelled and
an abandoned execution, and exits. Then every PromQL block of docs/metrics.md and every
expression of the dashboard must parse and show what it says it shows.

The server runs in its own UTS namespace with a pod-like hostname, because the pushed
`instance` is the hostname (the pod name on Kubernetes) and the dashboard derives the
rollout from it.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.process import ServerProcess, free_port, need
from tests.support.shutdown import assert_clean_stderr, shutdown_report

ROOT = Path(__file__).resolve().parents[2]
METRICS_DOC = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "agent-server.json"
NAMESPACE = "agents"
POD = "agent-server-5d8f7c9b4-x7k2p"
ROLLOUT = "agent-server-5d8f7c9b4"
PUSHED = 'job="agent-server-shutdown"'
#: Every wait on Prometheus is bounded by this many seconds.
SCRAPE_WAIT = 20.0

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(autouse=True)
def programs() -> None:
    """Real Prometheus and Pushgateway servers, and a pod's hostname through `unshare`."""
    need("prometheus", package="prometheus")
    need("prometheus-pushgateway", package="prometheus-pushgateway")
    need("unshare", package="util-linux")


Result = list[dict[str, Any]]


class PodServer(ServerProcess):
    """`agent-server run` whose hostname is a pod name, as on Kubernetes."""

    def command(self, args: list[str]) -> list[str]:
        script = 'hostname "$0" && exec "$@"'
        return ["unshare", "--uts", "sh", "-c", script, POD, *super().command(args)]


class Prometheus:
    """Client for Prometheus's HTTP API; every failure shows the query."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _get(self, path: str, params: dict[str, str]) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (params, body)
        return body["data"]

    def instant(self, expr: str, at: float | None = None) -> Result:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        assert data["resultType"] in ("vector", "scalar"), (expr, data)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: Result = data["result"]
        return result

    def range(self, expr: str, start: float, end: float) -> Result:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"}
        data = self._get("/api/v1/query_range", params)
        assert data["resultType"] == "matrix", (expr, data)
        result: Result = data["result"]
        return result

    def label_values(self, label: str, match: str) -> set[str]:
        values: list[str] = self._get(f"/api/v1/label/{label}/values", {"match[]": match})
        return set(values)

    def wait_for(self, expr: str, check: Callable[[Result], bool], what: str) -> Result:
        """Poll until `check` holds for the instant result of `expr`, within SCRAPE_WAIT."""
        deadline = time.monotonic() + SCRAPE_WAIT
        while True:
            result = self.instant(expr)
            if check(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not seen in {SCRAPE_WAIT}s; last {result}")
            time.sleep(0.2)


def values(result: Result) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


def range_values(result: Result) -> list[float]:
    return [float(v) for series in result for _, v in series["values"]]


def start_daemon(command: list[str], ready_url: str, log: Path) -> subprocess.Popen[bytes]:
    """Start a daemon and wait (bounded) until its readiness endpoint answers 200."""
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + SCRAPE_WAIT
    while True:
        try:
            if httpx.get(ready_url, timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{command[0]} not ready:\n{log.read_text(errors='replace')}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def prometheus_config(server_port: int, gateway_port: int) -> dict[str, Any]:
    """What a Kubernetes scrape gives: `namespace` and `pod` target labels on each job; the
    gateway (a pod of its own, elsewhere) with honor_labels so pushed job/instance stay."""

    def pod_labels(namespace: str, pod: str) -> list[dict[str, str]]:
        return [
            {"target_label": "namespace", "replacement": namespace},
            {"target_label": "pod", "replacement": pod},
        ]

    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "agent-server",
                "static_configs": [{"targets": [f"127.0.0.1:{server_port}"]}],
                "relabel_configs": pod_labels(NAMESPACE, POD),
            },
            {
                "job_name": "pushgateway",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}],
                "relabel_configs": pod_labels("monitoring", "pushgateway-7f9c6-q2w4e"),
            },
        ],
    }


def readme_queries() -> list[str]:
    blocks = re.findall(r"```promql\n(.*?)```", METRICS_DOC.read_text(), re.S)
    assert len(blocks) >= 5, "the example queries of docs/metrics.md are gone"
    return [" ".join(block.split()) for block in blocks]


def dashboard_targets() -> list[tuple[str, dict[str, Any]]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target)
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def dashboard_variables() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        v["name"]: v["definition"] for v in dashboard["templating"]["list"] if "definition" in v
    }


def substitute(expr: str, range_seconds: int) -> str:
    """Grafana's variables, as with this pod's namespace and pod picked and every reasoner."""
    for name, value in (
        ("$__rate_interval", "4s"),  # Grafana: max(interval + scrape, 4 * scrape)
        ("$__interval", "1s"),
        ("$__range", f"{range_seconds}s"),
        ("$namespace", NAMESPACE),
        ("$pod", POD),
        ("$reasoner", ".*"),
    ):
        expr = expr.replace(name, value)
    assert "$" not in expr.replace("$1", ""), expr
    return expr


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Debian's build persists to /var/lib/prometheus/pushgateway.data by default: a run
    # would start with the groups of the run before it. Memory only, one gateway a test.
    command = [
        "prometheus-pushgateway",
        f"--web.listen-address=127.0.0.1:{port}",
        "--persistence.file=",
    ]
    proc = start_daemon(command, f"{url}/-/ready", tmp_path / "pushgateway.log")
    yield url
    stop(proc)


def test_readme_and_dashboard_queries_on_a_real_prometheus(tmp_path: Path, gateway: str) -> None:
    marker_dir = tmp_path / "server"
    marker_dir.mkdir()
    server = PodServer(
        [
            "tests_app:agent",
            *("--grace-period", "12", "--unready-delay", "1", "--drain-timeout", "3"),
            *("--cancel-timeout", "1", "--pushgateway", gateway),
        ],
        {},
        marker_dir,
    )
    prometheus_proc: subprocess.Popen[bytes] | None = None
    try:
        server.wait_ready()
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps(prometheus_config(server.port, int(gateway.rsplit(":")[-1]))))
        port = free_port()
        prometheus_proc = start_daemon(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            f"http://127.0.0.1:{port}/-/ready",
            tmp_path / "prometheus.log",
        )
        prom = Prometheus(f"http://127.0.0.1:{port}")
        check_through_a_drain(prom, server)
    finally:
        server.close()
        if prometheus_proc is not None:
            stop(prometheus_proc)


def check_through_a_drain(prom: Prometheus, server: ServerProcess) -> None:
    began = time.time()
    # The series of the first POSTs exist at 0 before them, as scraped.
    zero = (
        'agent_server_http_requests_total{method="POST", route="/reasoners/{name}", status="503"}'
    )
    prom.wait_for(zero, lambda r: values(r) == [0.0], "POST 503 series at 0 before any request")

    url = server.url
    with httpx.Client(base_url=url, timeout=15) as client:
        for n in range(3):
            assert client.post("/reasoners/echo", json={"text": str(n)}).status_code == 200
        for body in ({"seconds": 60}, {"seconds": 2.5, "marker": "short"}):
            assert client.post("/reasoners/sleep/async", json=body).status_code == 202
        assert client.post("/reasoners/swallow/async", json={}).status_code == 202
        server.wait_marker("short")
    prom.wait_for(
        'agent_server_executions_started_total{reasoner="echo"}',
        lambda r: values(r) == [3.0],
        "the traffic, scraped",
    )

    server.signal(signal.SIGTERM)
    refused = accepted = 0  # the unready second still accepts work: each finishes at once
    deadline = time.monotonic() + 10
    while refused < 4:  # admission closes after the unready second: then 503s
        assert time.monotonic() < deadline, "no refusals within 10 s of SIGTERM"
        with httpx.Client(base_url=url, timeout=5) as client:
            status = client.post("/reasoners/echo", json={"text": "late"}).status_code
        assert status in (200, 503)
        refused += status == 503
        accepted += status == 200

    # While it drains, the live queries show this pod, and only it.
    live = readme_queries()[0]
    assert "shutdown_elapsed_seconds" in live
    during = prom.wait_for(live, lambda r: bool(r) and values(r)[0] > 1.0, "live drain")
    assert [s["metric"]["pod"] for s in during] == [POD]

    code, _ = server.wait_exit(15)
    assert_clean_stderr(server)
    assert code == 3, server.stderr()  # the swallowing execution was abandoned
    report = shutdown_report(server)
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (1 + accepted, 1, 1)
    assert report["rejected"] == refused

    # Until the pod's last scrape has failed and the push has been scraped.
    prom.wait_for('up{job="agent-server"}', lambda r: values(r) == [0.0], "pod gone")
    prom.wait_for(
        f"agent_server_shutdown_duration_seconds{{{PUSHED}}}", lambda r: len(r) == 1, "push seen"
    )
    now = time.time()
    check_readme(prom, report, refused)
    check_dashboard(prom, report, began, now)


def check_readme(prom: Prometheus, report: dict[str, Any], refused: int) -> None:
    """Each block of docs/metrics.md, with what its text says it answers."""
    for expr in readme_queries():
        result = prom.instant(expr)
        got = values(result)
        if "shutdown_elapsed_seconds" in expr:  # live: nothing once the pod has exited
            assert result == [], (expr, result)
        elif "shutdown_duration_seconds" in expr:
            assert got == pytest.approx([report["duration_seconds"]], abs=0.01), expr
        elif "shutdown_executions_total" in expr and PUSHED in expr:
            assert by_label(result, "outcome") == {
                "cancelled": report["cancelled"],
                "abandoned": report["abandoned"],
            }, expr
        elif "shutdown_executions_total" in expr:  # scraped: at most what the report says
            seen = by_label(result, "outcome")
            assert set(seen) == {"cancelled", "abandoned"}, (expr, result)
            assert all(seen[o] <= report[o] for o in seen), (expr, seen, report)
        elif "requests_rejected_total" in expr:
            assert len(got) == 1 and 0 < got[0] <= 1, (expr, result, refused)
        else:
            raise AssertionError(f"no check for the docs/metrics.md query {expr!r}")


def by_label(result: Result, label: str) -> dict[str, float]:
    return {s["metric"][label]: float(s["value"][1]) for s in result}


def check_dashboard(prom: Prometheus, report: dict[str, Any], began: float, now: float) -> None:
    """Every expression parses, over the test's window; the panels that make a claim keep it."""
    variables = dashboard_variables()
    for name, expected in (("namespace", {NAMESPACE}), ("pod", {POD})):
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variables[name])
        assert match is not None and match[2] == name, variables[name]
        offered = prom.label_values(name, substitute(match[1], 60))
        assert offered == expected, (name, offered)  # never the Pushgateway's own

    seconds = math.ceil(now - began) + 5
    checked: set[str] = set()
    for title, target in dashboard_targets():
        expr = substitute(target["expr"], seconds)
        if target.get("instant"):
            result = prom.instant(expr, at=now)
            checked |= check_table(title, target["refId"], result, report)
        else:
            over = prom.range(expr, began, now)
            current = prom.instant(expr, at=now)
            checked |= check_panel(title, target["refId"], over, current, report)
    assert checked == {
        "Pods draining",
        "Pods reporting",
        "Failed or abandoned",
        "HTTP requests by status",
        "Executions ended by shutdown",
        "Shutdown duration",
        "Shutdowns per rollout (Pushgateway)",
        "Shutdowns per rollout (scraped)",
        "Store up by pod",
        "Replicas alive",
        "Lost executions",
        "Fenced writes",
    }


def check_panel(
    title: str, ref: str, over: Result, current: Result, report: dict[str, Any]
) -> set[str]:
    seen = range_values(over)
    if title == "Pods draining":
        assert max(seen) == 1 and current == [], (title, over, current)
    elif title == "Pods reporting":
        assert set(seen) == {1.0} and current == [], (title, over, current)  # one pod, then none
    elif title == "Failed or abandoned":
        assert seen and all(0 <= v <= 1 for v in seen), (title, over)
    elif title == "HTTP requests by status":
        refusals = [s for s in over if s["metric"].get("status") == "503"]
        assert refusals and max(range_values(refusals)) > 0, (title, over)
    elif title == "Executions ended by shutdown":
        assert {s["metric"]["outcome"] for s in over if max(range_values([s])) > 0} >= {
            "finished"
        }, (title, over)
    elif title == "Store up by pod":  # the memory store: always up, one pod
        assert set(seen) == {1.0} and [s["metric"]["pod"] for s in over] == [POD], (title, over)
    elif title == "Replicas alive":  # the memory store counts only itself
        assert set(seen) == {1.0}, (title, over)
    elif title in ("Lost executions", "Fenced writes"):  # one replica: nothing lost or fenced
        assert seen and set(seen) == {0.0}, (title, over)
    elif title == "Shutdown duration" and ref == "A":  # scraped: the drain as it went
        assert seen and 1 < max(seen) <= report["duration_seconds"] + 1, (title, over)
        assert current == [], (title, current)
    elif title == "Shutdown duration" and ref == "B":  # pushed: the whole shutdown
        assert values(current) == pytest.approx([report["duration_seconds"]], abs=0.01)
        assert current[0]["metric"]["instance"] == POD
    else:
        return set()
    return {title}


def check_table(title: str, ref: str, result: Result, report: dict[str, Any]) -> set[str]:
    if not title.startswith("Shutdowns per rollout"):
        return set()
    assert [s["metric"].get("rollout") for s in result] == [ROLLOUT], (title, ref, result)
    value = values(result)[0]
    column = {"C": "finished", "D": "cancelled", "E": "abandoned"}
    if ref == "A":
        assert value == 1, (title, result)  # one pod shut down
    elif ref == "B" and "Pushgateway" in title:
        assert value == pytest.approx(report["duration_seconds"], abs=0.01)
    elif ref == "B":
        assert 1 < value <= report["duration_seconds"] + 1, (title, result)
    elif "Pushgateway" in title:
        assert value == report[column[ref]], (title, ref, result)
    else:
        assert 0 <= value <= report[column[ref]], (title, ref, result)
    return {title}
