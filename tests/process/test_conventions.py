"""uvicorn's flags on `agent-server run` (docs/settings.md), on real processes over
127.0.0.1: `--root-path`, `--proxy-headers` / `--forwarded-allow-ips`, TLS, `--app-dir`,
`--cors-allow-origin`, `--reload` (its worker still gets the whole shutdown sequence), and
the JSON access and start lines.

Every wait is bounded and synchronised on readiness, log lines, markers or the exit.
"""

from __future__ import annotations

import os
import ssl
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.process import APPS_DIR, agent_server_cli
from tests.support.served import Served, Start, launcher, run_command
from tests.support.shutdown import (
    CLIENT_TIMEOUT,
    FAST,
    finish,
    shutdown_report,
    start_async,
    wait_stderr,
)

TOKEN = "conventions-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGENT_SERVER_") or name == "FORWARDED_ALLOW_IPS":
            monkeypatch.delenv(name)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    yield from launcher(tmp_path)


cli = agent_server_cli


# -- --root-path ---------------------------------------------------------------------------


def test_root_path_puts_location_and_links_under_the_prefix(start: Start) -> None:
    """Behind a proxy that strips `/agent`: the server gets `/executions/...`, and every
    path it hands out must carry the prefix back. The probes stay open under a token."""
    server = start(
        run_command(
            "conventions_app:agent", "--port", "0", "--root-path", "/agent", "--api-token", TOKEN
        )
    )
    with server.client() as client:
        assert client.get("/healthz").status_code == 200  # no token: the kubelet has none
        assert client.get("/reasoners").status_code == 401
        ids = []
        for _ in range(2):
            started = client.post("/reasoners/sleep/async", json={"seconds": 0}, headers=AUTH)
            assert started.status_code == 202, started.text
            execution_id = started.json()["execution_id"]
            assert started.headers["location"] == f"/agent/executions/{execution_id}"
            ids.append(execution_id)
        # What the proxy forwards for that Location: the prefix stripped again.
        assert client.get(f"/executions/{ids[0]}", headers=AUTH).status_code == 200
        page = client.get("/executions", params={"limit": 1}, headers=AUTH)
        assert page.status_code == 200, page.text
        assert page.headers["link"].startswith("</agent/executions?"), page.headers
        openapi = client.get("/openapi.json", headers=AUTH).json()
        assert openapi["servers"] == [{"url": "/agent"}]
    server.signal()
    code, _ = finish(server, timeout=10)
    assert code == 0, server.stderr()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--root-path", "agent/"), "--root-path: root-path must start with '/'"),
        (("--cors-allow-origin", "https://app.example/"), "is not an origin"),
        (("--ssl-keyfile", "key.pem"), "ssl-keyfile and ssl-keyfile-password need ssl-certfile"),
    ],
    ids=["root-path", "origin", "keyfile-alone"],
)
def test_invalid_new_flags_exit_2_with_one_line(flags: tuple[str, ...], says: str) -> None:
    result = cli("run", "conventions_app:agent", *flags)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr


def test_the_environment_twins_of_the_new_flags(start: Start) -> None:
    """AGENT_SERVER_ROOT_PATH and a comma-separated AGENT_SERVER_CORS_ALLOW_ORIGIN."""
    server = start(
        run_command("conventions_app:agent", "--port", "0"),
        env={
            "AGENT_SERVER_ROOT_PATH": "/twin",
            "AGENT_SERVER_CORS_ALLOW_ORIGIN": "https://a.example, https://b.example:8443",
        },
    )
    with server.client() as client:
        for origin in ("https://a.example", "https://b.example:8443"):
            answer = client.post(
                "/reasoners/sleep/async", json={"seconds": 0}, headers={"Origin": origin}
            )
            assert answer.status_code == 202
            assert answer.headers["access-control-allow-origin"] == origin
            assert answer.headers["location"].startswith("/twin/executions/")
    server.signal()
    assert finish(server, timeout=10)[0] == 0, server.stderr()


# -- --cors-allow-origin -------------------------------------------------------------------


def test_a_traced_page_may_send_its_trace_context_and_concurrency_header(start: Start) -> None:
    """A page with OpenTelemetry's browser instrumentation sends `traceparent`,
    `tracestate` and `baggage` with every request, and a reasoner limited per
    `header:X-Tenant` needs its page to send that header: the preflight allows each of them
    (Starlette answered 400 "Disallowed CORS headers", and the browser sent nothing), and the
    request that follows is served with them."""
    origin = "https://traced.example"
    server = start(
        run_command("scheduling_app:agent", "--port", "0", "--cors-allow-origin", origin)
    )
    asked = ["traceparent", "tracestate", "baggage", "x-tenant", "content-type"]
    with server.client() as client:
        preflight = client.options(
            "/reasoners/limited/async",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": ", ".join(asked),
            },
        )
        assert preflight.status_code == 200, preflight.text
        allowed = preflight.headers["access-control-allow-headers"].lower()
        assert set(asked) <= {header.strip() for header in allowed.split(",")}
        started = client.post(
            "/reasoners/limited/async",
            json={"tenant": "t", "seconds": 0},
            headers={
                "Origin": origin,
                "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
                "tracestate": "vendor=value",
                "baggage": "user=u1",
                "X-Tenant": "t",
            },
        )
        assert started.status_code == 202, started.text
        assert started.headers["access-control-allow-origin"] == origin
    server.signal()
    assert finish(server, timeout=10)[0] == 0, server.stderr()


def test_a_page_of_an_allowed_origin_runs_and_follows_events(start: Start) -> None:
    """The preflight a browser sends before a POST with a token and JSON, the POST whose
    Location the page must read, and the `EventSource` GET of the execution's events."""
    origin = "https://app.example"
    server = start(
        run_command(
            "conventions_app:agent",
            *("--port", "0", "--cors-allow-origin", origin),
            *("--cors-allow-origin", "http://localhost:3000", "--api-token", TOKEN),
        )
    )
    with server.client() as client:
        preflight = client.options(
            "/reasoners/sleep/async",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
            },
        )
        assert preflight.status_code == 200, preflight.text  # no token: browsers send none
        assert preflight.headers["access-control-allow-origin"] == origin
        allowed = preflight.headers["access-control-allow-headers"].lower()
        assert {"authorization", "content-type", "idempotency-key"} <= {
            header.strip() for header in allowed.split(",")
        }
        started = client.post(
            "/reasoners/sleep/async",
            json={"seconds": 0},
            headers={**AUTH, "Origin": origin},
        )
        assert started.status_code == 202
        assert started.headers["access-control-allow-origin"] == origin
        exposed = {
            h.strip().lower() for h in started.headers["access-control-expose-headers"].split(",")
        }
        assert {"location", "retry-after", "link"} <= exposed
        events_path = started.headers["location"] + "/events"
        # An EventSource: GET, Accept: text/event-stream, the page's Origin.
        with client.stream(
            "GET",
            events_path,
            headers={**AUTH, "Origin": origin, "Accept": "text/event-stream"},
        ) as stream:
            assert stream.status_code == 200
            assert stream.headers["access-control-allow-origin"] == origin
            assert stream.headers["content-type"].startswith("text/event-stream")
            text = "".join(stream.iter_text())
        assert "event: end" in text, text
        other = client.post(
            "/reasoners/sleep/async",
            json={"seconds": 0},
            headers={**AUTH, "Origin": "https://elsewhere.example"},
        )
        assert other.status_code == 202  # the browser, not the server, withholds the answer
        assert "access-control-allow-origin" not in other.headers
        # A preflight the server refuses says why in JSON, as every refusal does.
        refused = client.options(
            "/reasoners/sleep/async",
            headers={
                "Origin": "https://elsewhere.example",
                "Access-Control-Request-Method": "PUT",
                "Access-Control-Request-Headers": "x-not-read",
            },
        )
        assert refused.status_code == 400
        assert refused.headers["content-type"] == "application/json"
        assert refused.json() == {"detail": "Disallowed CORS origin, method, headers"}
    server.signal()
    assert finish(server, timeout=10)[0] == 0, server.stderr()


def test_a_page_of_an_allowed_origin_changes_a_schedule(start: Start) -> None:
    """`PATCH /schedules/{id}` is the API's too (docs/schedules.md): its preflight was refused
    (methods GET, POST, DELETE only), so a page could make and delete a schedule but not
    disable it."""
    origin = "https://admin.example"
    server = start(
        run_command("scheduling_app:agent", "--port", "0", "--cors-allow-origin", origin)
    )
    with server.client() as client:
        made = client.post(
            "/schedules",
            json={"reasoner": "limited", "cron": "0 0 1 1 *", "input": {"tenant": "t"}},
            headers={"Origin": origin},
        )
        assert made.status_code == 201, made.text
        path = f"/schedules/{made.json()['schedule_id']}"
        preflight = client.options(
            path,
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "PATCH",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.status_code == 200, preflight.text
        methods = preflight.headers["access-control-allow-methods"].replace(" ", "").split(",")
        assert "PATCH" in methods, methods
        changed = client.patch(path, json={"enabled": False}, headers={"Origin": origin})
        assert changed.status_code == 200, changed.text
        assert changed.json()["enabled"] is False
        assert changed.headers["access-control-allow-origin"] == origin
    server.signal()
    assert finish(server, timeout=10)[0] == 0, server.stderr()


# -- --proxy-headers / --forwarded-allow-ips, and the JSON access line -------------------------


@pytest.mark.parametrize(
    ("flags", "client_host"),
    [
        ((), "203.0.113.7"),  # uvicorn's default: trust X-Forwarded-For from 127.0.0.1
        (("--forwarded-allow-ips", "192.0.2.1"), "127.0.0.1"),
        (("--no-proxy-headers",), "127.0.0.1"),
    ],
    ids=["trusted-peer", "untrusted-peer", "off"],
)
def test_proxy_headers_decide_the_client_of_the_json_access_line(
    start: Start, flags: tuple[str, ...], client_host: str
) -> None:
    server = start(
        run_command(
            "conventions_app:agent", "--port", "0", "--access-log", "--log-format", "json", *flags
        )
    )
    with server.client() as client:
        answer = client.get(
            "/reasoners", params={"x": "1"}, headers={"X-Forwarded-For": "203.0.113.7"}
        )
        assert answer.status_code == 200
    server.signal()
    assert finish(server, timeout=10)[0] == 0, server.stderr()
    access = [
        line
        for line in server.json_lines()
        if line["logger"] == "agent_server.access" and line.get("path") == "/reasoners"
    ]
    assert len(access) == 1, server.stderr()
    line = access[0]
    assert (line["method"], line["status"], line["query"]) == ("GET", 200, "x=1"), line
    duration_ms = line["duration_ms"]
    assert isinstance(duration_ms, float) and 0 <= duration_ms < CLIENT_TIMEOUT * 1000
    host = line["client"].rsplit(":", 1)[0] if client_host == "127.0.0.1" else line["client"]
    assert host == client_host, line


def test_the_json_start_line_names_agent_reasoners_and_store_without_its_password(
    start: Start, own_redis: Any
) -> None:
    password = "s3cr3t-Pa55"
    assert own_redis.command("CONFIG", "SET", "requirepass", password) == b"+OK\r\n"
    store = f"redis://:{password}@127.0.0.1:{own_redis.port}/0"
    server = start(
        run_command(
            "conventions_app:agent",
            *("--port", "0", "--log-format", "json"),
            *("--store", store, "--replica-id", "replica-a"),
        )
    )
    server.signal()
    assert finish(server, timeout=10)[0] == 0, server.stderr()
    assert password not in server.stderr()
    starts = [line for line in server.json_lines() if "reasoners" in line]
    assert len(starts) == 1, server.stderr()
    line = starts[0]
    assert line["agent"] == "conventions"
    assert line["reasoners"] == ["sleep", "tracked"]
    assert line["store"] == f"redis://127.0.0.1:{own_redis.port}/0"
    assert line["replica"] == "replica-a"


# -- TLS -------------------------------------------------------------------------------------


@pytest.fixture
def tls(tmp_path: Path) -> dict[str, Any]:
    """A CA the client trusts, and a certificate for 127.0.0.1 with its key encrypted."""
    trustme = pytest.importorskip("trustme")
    from cryptography.hazmat.primitives import serialization

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certfile = tmp_path / "cert.pem"
    cert.cert_chain_pems[0].write_to_path(certfile)
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    keyfile = tmp_path / "key.pem"
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"key-password"),
        )
    )
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return {"certfile": str(certfile), "keyfile": str(keyfile), "context": context}


def test_https_with_an_encrypted_key(start: Start, tls: dict[str, Any]) -> None:
    server = start(
        run_command(
            "conventions_app:agent",
            *("--port", "0", *FAST),
            *("--ssl-certfile", tls["certfile"], "--ssl-keyfile", tls["keyfile"]),
            *("--ssl-keyfile-password", "key-password"),
        ),
        verify=tls["context"],
    )
    assert "running on https://127.0.0.1:" in server.stderr()
    with server.client() as client:
        execution_id = client.post("/reasoners/sleep/async", json={"seconds": 600}).json()[
            "execution_id"
        ]
        assert client.get(f"/executions/{execution_id}").json()["status"] == "running"
    with pytest.raises(httpx.TransportError):  # plain HTTP on the TLS port
        httpx.get(f"http://127.0.0.1:{server.port}/readyz", timeout=CLIENT_TIMEOUT)
    server.signal()
    code, _ = finish(server, timeout=15)
    assert code == 0, server.stderr()
    assert shutdown_report(server)["cancelled"] == 1


def test_a_wrong_key_password_exits_2_without_echoing_it(tls: dict[str, Any]) -> None:
    result = cli(
        "run",
        "conventions_app:agent",
        *("--ssl-certfile", tls["certfile"], "--ssl-keyfile", tls["keyfile"]),
        *("--ssl-keyfile-password", "not-the-password"),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "cannot be loaded" in result.stderr and "not-the-password" not in result.stderr
    # Without a password the key is refused too, and nothing asks for one on a terminal.
    unasked = cli("run", "conventions_app:agent", "--ssl-certfile", tls["certfile"])
    assert unasked.returncode == 2 and "cannot be loaded" in unasked.stderr, unasked.stderr


# -- --app-dir -------------------------------------------------------------------------------


def _agent_module(folder: Path, agent_name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "placed_app.py").write_text(
        textwrap.dedent(
            f"""
            from agent_server import Agent

            agent = Agent({agent_name!r})

            @agent.reasoner()
            async def where() -> str:
                return {agent_name!r}
            """
        )
    )


def test_app_dir_comes_first_on_the_module_path(start: Start, tmp_path: Path) -> None:
    """A module of the same name elsewhere on the Python path loses to the one in
    --app-dir."""
    _agent_module(tmp_path / "chosen", "chosen")
    _agent_module(tmp_path / "elsewhere", "elsewhere")
    server = start(
        run_command("placed_app:agent", "--port", "0", "--app-dir", str(tmp_path / "chosen")),
        env={"PYTHONPATH": str(tmp_path / "elsewhere")},
    )
    with server.client() as client:
        assert client.post("/reasoners/where").json()["result"] == "chosen"
    server.signal()
    assert finish(server, timeout=10)[0] == 0, server.stderr()


@pytest.mark.parametrize("with_app_dir", [False, True])
def test_a_module_not_found_says_where_modules_are_looked_up(
    tmp_path: Path, with_app_dir: bool
) -> None:
    args = ("--app-dir", str(tmp_path)) if with_app_dir else ()
    result = cli("run", "nowhere_to_be_found:agent", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    line = result.stderr.strip()
    assert line.startswith("agent-server: cannot import 'nowhere_to_be_found'"), line
    if with_app_dir:
        assert f"looked up in --app-dir ({tmp_path})" in line, line
    else:
        assert f"looked up in the current directory ({APPS_DIR})" in line, line
        assert "--app-dir" in line, line


# -- --reload --------------------------------------------------------------------------------

RELOAD_APP = """
import tests_app
from agent_server import Agent

agent = Agent("reloaded")
for func in tests_app.REASONERS:
    agent.reasoner()(func)

@agent.reasoner()
async def version() -> int:
    return {version}
"""


@pytest.fixture
def reload_dir(tmp_path: Path) -> Path:
    """The working directory `--reload` watches: the app alone (tests/ is edited by others
    while the tests run, and would restart the worker)."""
    folder = tmp_path / "watched"
    folder.mkdir()
    (folder / "reload_app.py").write_text(RELOAD_APP.format(version=1))
    return folder


def start_reloading(start: Start, folder: Path) -> Served:
    return start(
        run_command("reload_app:agent", "--port", "0", "--reload", *FAST),
        env={"PYTHONPATH": str(APPS_DIR)},
        cwd=folder,
    )


def test_reload_worker_runs_the_whole_shutdown_on_sigterm(start: Start, reload_dir: Path) -> None:
    server = start_reloading(start, reload_dir)
    start_async(server, "sleep", {"seconds": 600, "marker": "held"})
    start_async(server, "cooperative", {"seconds": 600})
    server.wait_marker("held")
    server.signal()  # to the supervisor, which passes one SIGTERM on to its worker
    code, elapsed = finish(server, timeout=15)
    assert code == 0, server.stderr()
    report = shutdown_report(server)
    assert report["signal"] == "SIGTERM"
    # The cooperative one returns as the drain begins; the sleep is cancelled at 1 s.
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (1, 1, 0)
    assert report["phases"]["cancelling"] >= 0.95, report
    assert elapsed < 1.0 + 2.5, elapsed
    assert "Stopping reloader process" in server.stderr()


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_under_reload_counts_once_per_press(
    start: Start, reload_dir: Path, presses: int
) -> None:
    """Ctrl+C reaches the supervisor and its worker alike: one press is one signal (the
    drain runs to its deadline), a second press cancels at once."""
    server = start_reloading(start, reload_dir)
    start_async(server, "sleep", {"seconds": 600, "marker": "held"})
    server.wait_marker("held")
    server.press_ctrl_c()
    if presses == 2:
        wait_stderr(server, "shutdown began")
        server.press_ctrl_c()
    code, _ = finish(server, timeout=15)
    assert code == 0, server.stderr()
    report = shutdown_report(server)
    assert report["cancelled"] == 1, report
    if presses == 1:
        assert report["phases"]["cancelling"] >= 0.95, report
        assert "second signal" not in server.stderr()
    else:
        assert report["phases"]["cancelling"] < 0.9, report
        assert "second signal: cancelling running work now" in server.stderr()


def test_reload_restarts_the_worker_through_its_shutdown(start: Start, reload_dir: Path) -> None:
    server = start_reloading(start, reload_dir)
    with server.client() as client:
        assert client.post("/reasoners/version").json()["result"] == 1
        start_async(server, "sleep", {"seconds": 600, "marker": "held"})
        server.wait_marker("held")
        (reload_dir / "reload_app.py").write_text(RELOAD_APP.format(version=2))
        wait_stderr(server, "detected changes in 'reload_app.py'", timeout=CLIENT_TIMEOUT)
        wait_stderr(server, "shutdown report", timeout=CLIENT_TIMEOUT)
        assert shutdown_report(server)["cancelled"] == 1  # the old worker drained, then cancelled
        # The listener is the supervisor's: the new worker answers on the same port.
        deadline = time.monotonic() + CLIENT_TIMEOUT
        while True:
            try:  # the old worker refuses (503) until its listener closes
                answer = client.post("/reasoners/version")
                if answer.status_code == 200 and answer.json()["result"] == 2:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, server.stderr()
            time.sleep(0.05)
    server.signal()
    assert finish(server, timeout=15)[0] == 0, server.stderr()
    assert server.stderr().count("shutdown report") == 2
