"""The HTTP API in-process (httpx over ASGI): every route of docs/api.md, its status
codes, the execution JSON, and bad input that must never crash anything."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate as validate_openapi
from prometheus_client.parser import text_string_to_metric_families

from agent_server import Agent, Settings
from agent_server.http.api import ROUTE_STATUSES
from agent_server.model.execution import CancelReason
from tests.apps.tests_app import make_agent, reasoner_names
from tests.support.loop_reports import loop_reports

#: Bound for every wait on an event in this file.
WAIT = 5.0
EXECUTION_KEYS = {
    "execution_id",
    "reasoner",
    "session_id",
    "status",
    "status_reason",
    "result",
    "error",
    "created_at",
    "finished_at",
    "duration_seconds",
    "replica",
    "attempt",
    "input_request",
    "scheduled_at",
    "owner",
    "tenant",
    "schedule_id",
    "version",
}
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


class Gate:
    """A reasoner the test controls: it signals when it has started and waits to be let go."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def gated(self) -> str:
        self.entered.set()
        await self.release.wait()
        return "released"


def build(settings: Settings | None = None) -> tuple[Agent, Gate]:
    agent = make_agent(settings)
    gate = Gate()
    agent.reasoner(name="gated")(gate.gated)
    return agent, gate


def client_for(agent: Agent) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=agent), base_url="http://testserver")


@pytest.fixture
def built() -> tuple[Agent, Gate]:
    return build()


@pytest.fixture
def agent(built: tuple[Agent, Gate]) -> Agent:
    return built[0]


@pytest.fixture
def gate(built: tuple[Agent, Gate]) -> Gate:
    return built[1]


@pytest.fixture
async def client(agent: Agent) -> AsyncIterator[httpx.AsyncClient]:
    """The client; afterwards nothing the test started outlives it, and no task was lost."""
    async with loop_reports() as reports, client_for(agent) as http:
        yield http
        tasks = agent.registry.cancel_all(CancelReason.SHUTDOWN)
        assert await agent.registry.settle(tasks, time.monotonic() + WAIT) == []
    assert reports.unobserved() == []


def assert_execution(body: Any) -> dict[str, Any]:
    """The one execution shape: exact keys and types."""
    assert isinstance(body, dict)
    assert set(body) == EXECUTION_KEYS
    assert isinstance(body["execution_id"], str)
    assert re.fullmatch(r"[0-9a-f]{32}", body["execution_id"])
    assert isinstance(body["reasoner"], str)
    assert body["session_id"] is None or isinstance(body["session_id"], str)
    assert body["status"] in ("running", "succeeded", "failed", "cancelled")
    assert body["status_reason"] in (
        None,
        "request",
        "session_released",
        "shutdown",
        "client_disconnected",
    )
    assert TIMESTAMP.fullmatch(body["created_at"])
    assert body["input_request"] is None
    if body["status"] == "running":
        assert body["finished_at"] is None
        assert body["duration_seconds"] is None
        assert body["result"] is None and body["error"] is None
    else:
        assert TIMESTAMP.fullmatch(body["finished_at"])
        assert body["finished_at"] >= body["created_at"]
        assert isinstance(body["duration_seconds"], float)
        assert body["duration_seconds"] >= 0
    if body["status"] == "failed":
        assert set(body["error"]) == {"type", "message"}
        assert all(isinstance(v, str) for v in body["error"].values())
    else:
        assert body["error"] is None
    if body["status"] != "cancelled":
        assert body["status_reason"] is None
    return body


async def start_gated(client: httpx.AsyncClient, gate: Gate, **headers: str) -> dict[str, Any]:
    response = await client.post("/reasoners/gated/async", headers=headers)
    assert response.status_code == 202, response.text
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    return assert_execution(response.json())


async def sync_gated(
    client: httpx.AsyncClient, gate: Gate
) -> tuple[asyncio.Task[httpx.Response], str]:
    """A run-and-wait request in the background, once its reasoner has started; and its id."""
    request = asyncio.create_task(client.post("/reasoners/gated"))
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    listed = (await client.get("/executions", params={"reasoner": "gated"})).json()
    assert len(listed) == 1
    return request, listed[0]["execution_id"]


# -- GET /reasoners ----------------------------------------------------------------------------


async def test_list_reasoners_with_schemas(client: httpx.AsyncClient) -> None:
    response = await client.get("/reasoners")
    assert response.status_code == 200
    reasoners = {r["name"]: r for r in response.json()}
    assert set(reasoners) == reasoner_names() | {"gated"}
    for described in reasoners.values():
        assert set(described) == {"name", "description", "input_schema", "output_schema"}
        assert isinstance(described["input_schema"], dict)
        assert isinstance(described["output_schema"], dict)
    sleep = reasoners["sleep"]["input_schema"]
    assert set(sleep["properties"]) == {"seconds", "marker"}
    assert sleep["properties"]["seconds"]["type"] == "number"
    assert sleep["properties"]["seconds"]["default"] == 1.0
    assert "required" not in sleep
    assert sleep["additionalProperties"] is False
    echo = reasoners["echo"]
    assert echo["input_schema"]["required"] == ["text"]
    assert echo["output_schema"]["properties"]["text"]["type"] == "string"
    assert (
        reasoners["report"]["description"]
        == "Serialised by its annotation: the datetime and tuple become JSON."
    )
    assert reasoners["echo"]["description"] is None


# -- POST /reasoners/{name}: run and wait ------------------------------------------------------


async def test_run_and_wait_succeeded_is_200(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/echo", json={"text": "hi"})
    assert response.status_code == 200
    body = assert_execution(response.json())
    assert body["reasoner"] == "echo"
    assert body["status"] == "succeeded"
    assert body["result"] == {"text": "hi"}
    assert body["session_id"] is None
    # The record is kept and reads the same afterwards.
    again = await client.get(f"/executions/{body['execution_id']}")
    assert again.json() == body


async def test_run_and_wait_failed_is_500_without_traceback(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    response = await client.post("/reasoners/fail", json={"message": "kaput"})
    assert response.status_code == 500
    body = assert_execution(response.json())
    assert body["status"] == "failed"
    assert body["error"] == {"type": "ValueError", "message": "kaput"}
    assert "Traceback" not in response.text
    assert "tests_app.py" not in response.text
    assert "Traceback" in caplog.text  # the operator gets it in the log


async def test_run_and_wait_cancelled_by_shutdown_is_503(
    agent: Agent, gate: Gate, client: httpx.AsyncClient
) -> None:
    request, _ = await sync_gated(client, gate)
    registry = agent.registry
    registry.begin_drain()
    registry.close_admission()
    registry.cancel_all(CancelReason.SHUTDOWN)
    response = await asyncio.wait_for(request, WAIT)
    assert response.status_code == 503
    assert response.headers["retry-after"].isdigit()
    assert response.headers["connection"] == "close"
    body = assert_execution(response.json())
    assert (body["status"], body["status_reason"]) == ("cancelled", "shutdown")


async def test_run_and_wait_cancelled_by_request_is_409(
    gate: Gate, client: httpx.AsyncClient
) -> None:
    request, execution_id = await sync_gated(client, gate)
    cancel = await client.post(f"/executions/{execution_id}/cancel")
    assert cancel.status_code == 202
    assert assert_execution(cancel.json())["execution_id"] == execution_id
    response = await asyncio.wait_for(request, WAIT)
    assert response.status_code == 409
    body = assert_execution(response.json())
    assert (body["status"], body["status_reason"]) == ("cancelled", "request")
    # Cancelling what has already ended is 200 and changes nothing.
    again = await client.post(f"/executions/{execution_id}/cancel")
    assert again.status_code == 200
    assert again.json() == body


async def test_run_and_wait_def_reasoner(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/thread_sleep", json={"seconds": 0.01})
    assert response.status_code == 200
    assert response.json()["result"] == 0.01


# -- POST /reasoners/{name}/async, GET /executions/{id}?wait= --------------------------------


async def test_async_start_is_202_with_location(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/sleep/async", json={"seconds": 0.05})
    assert response.status_code == 202
    body = assert_execution(response.json())
    assert body["status"] == "running"
    assert response.headers["location"] == f"/executions/{body['execution_id']}"
    began = time.monotonic()
    done = await client.get(response.headers["location"], params={"wait": 10})
    elapsed = time.monotonic() - began
    assert done.status_code == 200
    finished = assert_execution(done.json())
    assert finished["status"] == "succeeded"
    assert finished["result"] == {"slept": 0.05}
    assert elapsed < 3.0  # returned when it ended, far before the 10 s bound


async def test_long_poll_returns_as_soon_as_terminal(gate: Gate, client: httpx.AsyncClient) -> None:
    started = await start_gated(client, gate)
    poll = asyncio.create_task(
        client.get(f"/executions/{started['execution_id']}", params={"wait": 30})
    )
    await asyncio.sleep(0.05)
    assert not poll.done()  # still waiting: the execution is running
    let_go = time.monotonic()
    gate.release.set()
    response = await asyncio.wait_for(poll, WAIT)
    assert time.monotonic() - let_go < 2.0
    assert assert_execution(response.json())["status"] == "succeeded"


async def test_long_poll_on_running_returns_running_after_the_wait(
    gate: Gate, client: httpx.AsyncClient
) -> None:
    started = await start_gated(client, gate)
    url = f"/executions/{started['execution_id']}"
    began = time.monotonic()
    response = await client.get(url, params={"wait": 0.2})
    elapsed = time.monotonic() - began
    assert response.status_code == 200
    assert assert_execution(response.json())["status"] == "running"
    assert 0.18 < elapsed < 2.0
    began = time.monotonic()
    for query in ({}, {"wait": 0}):
        response = await client.get(url, params=query)
        assert response.json()["status"] == "running"
    assert time.monotonic() - began < 1.0


async def test_long_poll_over_the_cap_is_accepted(client: httpx.AsyncClient) -> None:
    """A wait above the 60 s cap is capped, not refused; a finished one answers at once."""
    done = (await client.post("/reasoners/echo", json={"text": "x"})).json()
    began = time.monotonic()
    response = await client.get(f"/executions/{done['execution_id']}", params={"wait": 1000})
    assert response.status_code == 200
    assert response.json() == done
    assert time.monotonic() - began < 1.0


@pytest.mark.parametrize("wait", ["x", "-1", "nan", "inf"])
async def test_long_poll_bad_wait_is_422(gate: Gate, client: httpx.AsyncClient, wait: str) -> None:
    started = await start_gated(client, gate)
    response = await client.get(f"/executions/{started['execution_id']}", params={"wait": wait})
    assert response.status_code == 422
    assert "wait" in response.json()["detail"]


async def test_unknown_execution_is_404_on_every_route(client: httpx.AsyncClient) -> None:
    unknown = "0123456789abcdef0123456789abcdef"
    for method, path in (
        ("GET", f"/executions/{unknown}"),
        ("POST", f"/executions/{unknown}/cancel"),
        ("DELETE", f"/executions/{unknown}"),
    ):
        response = await client.request(method, path)
        assert response.status_code == 404, (method, path)
        assert set(response.json()) == {"detail"}


# -- cancel and delete --------------------------------------------------------------------------


async def test_cancel_async_execution_202_then_cancelled(
    gate: Gate, client: httpx.AsyncClient
) -> None:
    started = await start_gated(client, gate)
    url = f"/executions/{started['execution_id']}"
    cancel = await client.post(f"{url}/cancel")
    assert cancel.status_code == 202
    done = (await client.get(url, params={"wait": WAIT})).json()
    assert (done["status"], done["status_reason"]) == ("cancelled", "request")
    assert (await client.post(f"{url}/cancel")).status_code == 200


async def test_delete_running_409_finished_204_then_404(
    gate: Gate, client: httpx.AsyncClient
) -> None:
    started = await start_gated(client, gate)
    url = f"/executions/{started['execution_id']}"
    refused = await client.delete(url)
    assert refused.status_code == 409
    assert "detail" in refused.json()
    assert (await client.get(url)).json()["status"] == "running"  # unchanged
    gate.release.set()
    assert (await client.get(url, params={"wait": WAIT})).json()["status"] == "succeeded"
    deleted = await client.delete(url)
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert (await client.get(url)).status_code == 404
    assert (await client.delete(url)).status_code == 404


# -- GET /executions -----------------------------------------------------------------------------


async def test_list_with_filters(gate: Gate, client: httpx.AsyncClient) -> None:
    ids: list[str] = []
    for text in ("a", "b"):
        ids.append(
            (await client.post("/reasoners/echo", json={"text": text})).json()["execution_id"]
        )
    failed = (await client.post("/reasoners/fail", json={})).json()["execution_id"]
    running = (await start_gated(client, gate, **{"X-Session-ID": "s-list"}))["execution_id"]

    async def listed(**params: Any) -> list[dict[str, Any]]:
        response = await client.get("/executions", params=params)
        assert response.status_code == 200
        return [assert_execution(e) for e in response.json()]

    everything = await listed()
    assert [e["execution_id"] for e in everything] == [running, failed, *reversed(ids)]
    created = [e["created_at"] for e in everything]
    assert created == sorted(created, reverse=True)  # newest first
    assert [e["execution_id"] for e in await listed(status="succeeded")] == list(reversed(ids))
    assert [e["execution_id"] for e in await listed(status="running")] == [running]
    assert [e["execution_id"] for e in await listed(reasoner="fail")] == [failed]
    assert [e["execution_id"] for e in await listed(session_id="s-list")] == [running]
    assert await listed(session_id="nobody") == []
    assert await listed(reasoner="nothing-by-that-name") == []
    assert [e["execution_id"] for e in await listed(limit=2)] == [running, failed]
    assert [e["execution_id"] for e in await listed(status="succeeded", limit=1)] == [ids[1]]
    assert await listed(status="running", reasoner="echo") == []
    assert len(await listed(status="running", reasoner="gated", session_id="s-list")) == 1


async def test_pages_past_the_limit_follow_link_next_with_the_same_filters(
    agent: Agent, client: httpx.AsyncClient
) -> None:
    """RFC 8288 `Link: <...>; rel="next"` reaches every page, keeps the filters (repeated
    `status` or a comma list: any of them) and the mount prefix; a cursor no Link gave is a
    400."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    made = [
        (await client.post(f"/reasoners/{name}", json=body)).json()["execution_id"]
        for name, body in [("echo", {"text": "x"}), ("fail", {})] * 3 + [("echo", {"text": "y"})]
    ]

    async def pages(http: httpx.AsyncClient, url: str) -> tuple[list[str], list[str]]:
        seen: list[str] = []
        links: list[str] = []
        for _ in range(20):  # bounded: seven records
            response = await http.get(url)
            assert response.status_code == 200, response.text
            seen += [e["execution_id"] for e in response.json()]
            if "next" not in response.links:
                return seen, links
            url = response.links["next"]["url"]
            links.append(url)
        raise AssertionError("the pages never ended")

    newest_first = made[::-1]
    assert (await pages(client, "/executions?limit=2"))[0] == newest_first
    assert (await pages(client, "/executions?limit=100"))[0] == newest_first
    failed = [i for i, name in zip(made, ["echo", "fail"] * 4, strict=False) if name == "fail"]
    both, links = await pages(client, "/executions?status=failed&status=succeeded&limit=3")
    assert both == newest_first
    assert links and all("status=failed" in u and "status=succeeded" in u for u in links)
    assert (await pages(client, "/executions?status=failed,cancelled&limit=1"))[0] == failed[::-1]
    assert (await pages(client, "/executions?status=failed&reasoner=echo&limit=1"))[0] == []
    refused = await client.get("/executions", params={"cursor": "not-one"})
    assert refused.status_code == 400 and "cursor" in refused.json()["detail"]
    outer = Starlette(routes=[Mount("/agent", app=agent)])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=outer), base_url="http://testserver"
    ) as mounted:
        seen, links = await pages(mounted, "/agent/executions?limit=3")
        assert seen == newest_first
        assert links and all(u.startswith("/agent/executions?") for u in links)


@pytest.mark.parametrize(
    "params",
    [{"status": "done"}, {"status": ""}, {"limit": "0"}, {"limit": "1001"}, {"limit": "ten"}],
)
async def test_list_bad_filter_is_422(client: httpx.AsyncClient, params: dict[str, str]) -> None:
    response = await client.get("/executions", params=params)
    assert response.status_code == 422
    assert set(response.json()) == {"detail"}


# -- health, readiness, metrics, schema ------------------------------------------------------


async def test_readyz_turns_503_on_drain_and_healthz_stays_200(
    agent: Agent, client: httpx.AsyncClient
) -> None:
    assert (await client.get("/readyz")).status_code == 200
    assert (await client.get("/healthz")).status_code == 200
    agent.registry.begin_drain()
    ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["status"] == "draining"
    assert (await client.get("/healthz")).status_code == 200
    # Still accepting work until admission closes; then 503 + Retry-After + Connection: close.
    assert (await client.post("/reasoners/echo", json={"text": "x"})).status_code == 200
    agent.registry.close_admission()
    for path in ("/reasoners/echo", "/reasoners/echo/async"):
        refused = await client.post(path, json={"text": "x"})
        assert refused.status_code == 503
        assert refused.headers["retry-after"].isdigit()
        assert refused.headers["connection"] == "close"
        assert set(refused.json()) == {"detail"}
    # Status, list and metrics are still served while draining.
    assert (await client.get("/executions")).status_code == 200
    assert (await client.get("/metrics")).status_code == 200


async def test_metrics_parse_and_count(client: httpx.AsyncClient) -> None:
    assert (await client.post("/reasoners/echo", json={"text": "x"})).status_code == 200
    assert (await client.post("/reasoners/fail", json={})).status_code == 500
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families.values()
        for s in family.samples
    }
    assert samples[("agent_server_executions_started_total", (("reasoner", "echo"),))] == 1
    finished = "agent_server_executions_finished_total"
    assert samples[(finished, (("reasoner", "echo"), ("status", "succeeded")))] == 1
    assert samples[(finished, (("reasoner", "fail"), ("status", "failed")))] == 1
    assert samples[("agent_server_executions_inflight", (("reasoner", "echo"),))] == 0
    assert "agent_server_draining" in families
    routes = {
        s.labels["route"]
        for s in families["agent_server_http_requests"].samples
        if s.name.endswith("_total")
    }
    assert "/reasoners/{name}" in routes
    assert not any("echo" in route for route in routes)  # templates, never raw paths


async def test_openapi_document_is_valid_and_has_every_reasoner(
    agent: Agent, client: httpx.AsyncClient
) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"] == "3.1.0"
    validate_openapi(document)
    paths = document["paths"]
    for path in (
        "/reasoners",
        "/executions",
        "/executions/{execution_id}",
        "/executions/{execution_id}/cancel",
        "/sessions/{session_id}",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ):
        assert path in paths, path
    assert set(paths["/executions/{execution_id}"]) == {"get", "delete"}
    for name, reasoner in agent.reasoners.items():
        for path in (f"/reasoners/{name}", f"/reasoners/{name}/async"):
            assert path in paths, path
            schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
            expected = reasoner.input_schema("#/components/schemas/{model}")
            expected.pop("$defs", None)
            assert schema == expected, name
    assert set(paths["/reasoners/sleep"]["post"]["responses"]) >= {
        "200", "400", "409", "413", "422", "429", "500", "503",
    }  # fmt: skip


async def test_openapi_document_has_every_mounted_route_and_its_statuses(
    agent: Agent, client: httpx.AsyncClient
) -> None:
    """Every route the server mounts (the schedules' included) is in the document with
    each method it answers; the schedule routes document every status they answer in
    ordinary operation (ROUTE_STATUSES) and their body errors, and a POST's body is one
    object per reasoner whose `input` is that reasoner's input schema."""
    document = (await client.get("/openapi.json")).json()
    paths = document["paths"]
    mounted = {
        (method.lower(), route.path)
        for route in agent.api().routes()
        for method in route.methods or ()
        # A reasoner's routes are documented per reasoner (checked above).
        if method != "HEAD"
        and not route.path.startswith(("/docs", "/console", "/mcp", "/reasoners/{"))
    }
    documented = {(method, path) for path, item in paths.items() for method in item}
    assert mounted <= documented, mounted - documented
    for (method, path), statuses in ROUTE_STATUSES.items():
        if path.startswith("/schedules"):
            answers = set(paths[path][method.lower()]["responses"])
            assert {str(status) for status in statuses} <= answers, (method, path)
            if (method, path) in (("POST", "/schedules"), ("PATCH", "/schedules/{schedule_id}")):
                assert {"400", "413", "415", "422"} <= answers, (method, path)
    create = paths["/schedules"]["post"]["requestBody"]["content"]["application/json"]
    by_reasoner = {
        item["properties"]["reasoner"]["const"]: item for item in create["schema"]["oneOf"]
    }
    assert set(by_reasoner) == set(agent.reasoners)
    for name, reasoner in agent.reasoners.items():
        expected = reasoner.input_schema("#/components/schemas/{model}")
        expected.pop("$defs", None)
        assert by_reasoner[name]["properties"]["input"] == {**expected, "default": {}}
    listing = {p["name"] for p in paths["/executions"]["get"]["parameters"]}
    assert "schedule_id" in listing


# -- bad input ------------------------------------------------------------------------------------


async def test_unknown_reasoner_is_404(client: httpx.AsyncClient) -> None:
    for path in ("/reasoners/nope", "/reasoners/nope/async"):
        response = await client.post(path, json={})
        assert response.status_code == 404
        assert "nope" in response.json()["detail"]


@pytest.mark.parametrize(
    "content", [b"{", b'{"text": "a",}', b"\xff\xfe{}", b'{"text": "\xc3\x28"}', b"[" * 100_000]
)
async def test_malformed_body_is_400(client: httpx.AsyncClient, content: bytes) -> None:
    response = await client.post(
        "/reasoners/echo", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "malformed JSON" in response.json()["detail"]


async def test_wrong_types_are_422_with_pydantics_error_list(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/sleep", json={"seconds": "soon"})
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert isinstance(errors, list) and len(errors) == 1
    assert errors[0]["loc"] == ["seconds"]
    assert errors[0]["type"] == "float_parsing"
    assert {"loc", "msg", "type", "input"} <= set(errors[0])
    assert "url" not in errors[0]
    missing = await client.post("/reasoners/echo", json={})
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["type"] == "missing"
    not_object = await client.post("/reasoners/sleep", json=[1, 2])
    assert not_object.status_code == 422
    assert (await client.get("/executions")).json() == []  # no execution was created


async def test_wrong_content_type_is_415(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/reasoners/echo", content=b'{"text": "x"}', headers={"content-type": "text/plain"}
    )
    assert response.status_code == 415
    vendor = await client.post(
        "/reasoners/echo",
        content=b'{"text": "x"}',
        headers={"content-type": "application/vnd.example+json; charset=utf-8"},
    )
    assert vendor.status_code == 200


async def test_body_over_the_limit_is_413() -> None:
    agent, _ = build(Settings(max_body_size=64))
    async with client_for(agent) as client:
        small = await client.post("/reasoners/echo", json={"text": "x" * 40})
        assert small.status_code == 200
        declared = await client.post("/reasoners/echo", json={"text": "x" * 100})
        assert declared.status_code == 413
        assert "64" in declared.json()["detail"]

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"text": "'
            for _ in range(10):
                yield b"x" * 10
            yield b'"}'

        streamed = await client.post(
            "/reasoners/echo", content=chunks(), headers={"content-type": "application/json"}
        )
        assert "content-length" not in streamed.request.headers
        assert streamed.status_code == 413
        assert (await client.get("/executions")).json()[0]["result"] == {"text": "x" * 40}


async def test_over_max_inflight_is_429_with_retry_after() -> None:
    agent, gate = build(Settings(max_inflight=1))
    async with client_for(agent) as client:
        await start_gated(client, gate)
        for path in ("/reasoners/echo", "/reasoners/echo/async"):
            refused = await client.post(path, json={"text": "x"})
            assert refused.status_code == 429
            assert refused.headers["retry-after"].isdigit()
            assert set(refused.json()) == {"detail"}
        gate.release.set()
        assert await agent.registry.wait_idle(time.monotonic() + WAIT)
        assert (await client.post("/reasoners/echo", json={"text": "x"})).status_code == 200


@pytest.mark.parametrize("session", ["", "x" * 257, "tab\there"])
async def test_bad_session_header_is_400(client: httpx.AsyncClient, session: str) -> None:
    response = await client.post(
        "/reasoners/echo", json={"text": "x"}, headers={"X-Session-ID": session}
    )
    assert response.status_code == 400
    assert "X-Session-ID" in response.json()["detail"]


async def test_session_header_sets_the_executions_session(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/reasoners/echo", json={"text": "x"}, headers={"X-Session-ID": "s" * 256}
    )
    assert response.status_code == 200
    assert response.json()["session_id"] == "s" * 256


async def test_unknown_route_and_method_are_json_errors(client: httpx.AsyncClient) -> None:
    assert (await client.get("/nowhere")).status_code == 404
    wrong_method = await client.get("/reasoners/echo")
    assert wrong_method.status_code == 405
    assert set(wrong_method.json()) == {"detail"}


ROUTING_CASES = [
    ("POST", "/reasoners/echo", {"text": "x"}),
    ("POST", "/reasoners/echo/async", {"text": "x"}),
    ("POST", "/reasoners/nowhere", {}),
    ("GET", "/reasoners/echo", None),
    ("PUT", "/reasoners/echo", None),
    ("POST", "/reasoners/echo/", {"text": "x"}),
    ("POST", "/reasoners/", {}),
    ("GET", "/reasoners", None),
    ("GET", "/reasoners/", None),
    ("GET", "/executions/0123", None),
    ("DELETE", "/executions/0123", None),
    ("PATCH", "/executions/0123", None),
    ("POST", "/executions/0123/cancel", None),
    ("GET", "/executions/0123/cancel", None),
    ("GET", "/executions?limit=1", None),
    ("GET", "/executions/", None),
    ("HEAD", "/healthz", None),
    ("BREW", "/healthz", None),
    ("GET", "/healthz/", None),
    ("GET", "/nowhere", None),
    ("DELETE", "/sessions/s1", None),
    ("GET", "/sessions/s1", None),
]


async def _routed(app: Any, method: str, path: str, body: Any) -> tuple[Any, ...]:
    """What a client can see of one answer, ids and times left out."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        response = await client.request(method, path, json=body)
    content: Any = response.json() if response.content else None
    if isinstance(content, dict):
        content = content if "detail" in content else sorted(content)
    elif isinstance(content, list):
        content = len(content)
    headers = {k: response.headers.get(k) for k in ("allow", "location", "content-type")}
    if headers["location"] is not None and "/executions/" in headers["location"]:
        headers["location"] = "/executions/{id}"
    return response.status_code, headers, content


@pytest.mark.parametrize(("method", "path", "body"), ROUTING_CASES)
async def test_router_shortcut_answers_as_starlettes_router(
    method: str, path: str, body: Any
) -> None:
    """The shortcut for full matches (ApiRouter) changes no answer: each request is sent to
    an agent routed by it and to one routed by Starlette's Router alone."""
    from starlette.routing import Router

    from agent_server.http.front import HttpApp
    from agent_server.http.routing import ApiRouter

    answers = []
    for router_class in (ApiRouter, Router):
        agent = make_agent()
        router = router_class(routes=agent.api().routes(), lifespan=agent.lifespan)
        app = HttpApp(router, agent.registry, agent.metrics)
        answers.append(await _routed(app, method, path, body))
    assert answers[0] == answers[1]
    assert answers[0][0] != 500


async def test_replicas_answers_this_replica_as_its_document_says(
    agent: Agent, client: httpx.AsyncClient
) -> None:
    """`GET /replicas` with the memory store: this replica only, serving, its running work
    counted, in the shape the OpenAPI document gives."""
    import jsonschema

    document = (await client.get("/openapi.json")).json()
    schema = document["components"]["schemas"]["Replica"]
    started = await client.post("/reasoners/sleep/async", json={"seconds": 30})
    answer = await client.get("/replicas")
    assert answer.status_code == 200
    [replica] = answer.json()
    jsonschema.validate(replica, schema)
    assert replica == {
        "replica_id": agent.store.replica_id,
        "versions": [None],
        "admitting": True,
        "draining": False,
        "in_flight": 1,
        "phase": "serving",
        "deadline_seconds": None,
        "answering": True,
    }
    await client.post(f"/executions/{started.json()['execution_id']}/cancel")
