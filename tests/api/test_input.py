"""Waiting for input (`ctx.ask`, `POST /executions/{id}/input`) in process, through httpx:
the status and its `input_request`, one answer per request, the schema's 422, timeouts,
cancellation and DELETE while waiting, the synchronous run's 202, the event, the metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agent_server import Settings
from tests.apps.input_app import make_agent

WAIT = 10.0


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=make_agent()), base_url="http://testserver"
    ) as client:
        yield client


async def start(client: httpx.AsyncClient, name: str, body: Any = None) -> str:
    response = await client.post(f"/reasoners/{name}/async", json=body or {})
    assert response.status_code == 202, response.text
    return str(response.json()["execution_id"])


async def poll(client: httpx.AsyncClient, execution_id: str) -> dict[str, Any]:
    response = await client.get(f"/executions/{execution_id}", params={"wait": WAIT})
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


async def ended(client: httpx.AsyncClient, execution_id: str) -> dict[str, Any]:
    """The execution once terminal: its event stream ends with `end` (a long-poll returns at
    `input_required` too, so it cannot wait past one)."""
    stream = await client.get(f"/executions/{execution_id}/events", timeout=WAIT)
    assert "event: end" in stream.text
    body: dict[str, Any] = (await client.get(f"/executions/{execution_id}")).json()
    return body


async def answer(client: httpx.AsyncClient, execution_id: str, body: Any) -> httpx.Response:
    return await client.post(f"/executions/{execution_id}/input", json=body)


async def metric(client: httpx.AsyncClient, line_start: str) -> float:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not exposed")


async def test_an_ask_waits_and_exactly_one_answer_goes_on(client: httpx.AsyncClient) -> None:
    execution_id = await start(client, "approve", {"amount": 7})
    waiting = await poll(client, execution_id)  # the long-poll returns at input_required
    assert waiting["status"] == "input_required"
    request = waiting["input_request"]
    assert request["request_id"] == 1
    assert request["prompt"] == {"question": "approve 7?"}
    assert request["schema"]["required"] == ["approved"]
    assert request["expires_at"] is None and request["asked_at"].endswith("Z")
    assert await metric(client, 'agent_server_executions_waiting{reasoner="approve"}') == 1

    refused = await answer(client, execution_id, {"value": {"approved": "perhaps"}})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "value", "approved"]
    assert (await client.get(f"/executions/{execution_id}")).json()["status"] == "input_required"

    taken = await answer(client, execution_id, {"request_id": 1, "value": {"approved": True}})
    assert taken.status_code == 202, taken.text
    assert taken.json()["status"] in ("running", "succeeded")
    assert taken.json()["input_request"] is None
    again = await answer(client, execution_id, {"request_id": 1, "value": {"approved": False}})
    assert again.status_code == 409

    ended = await poll(client, execution_id)
    assert ended["status"] == "succeeded"
    assert ended["result"] == {"approved": True, "note": "", "amount": 7}
    assert ended["input_request"] is None
    assert await metric(client, 'agent_server_executions_waiting{reasoner="approve"}') == 0
    assert await metric(client, 'agent_server_input_wait_seconds_count{reasoner="approve"}') == 1
    assert (await answer(client, execution_id, {"value": 1})).status_code == 409


async def test_request_ids_count_per_execution_and_a_wrong_one_is_409(
    client: httpx.AsyncClient,
) -> None:
    execution_id = await start(client, "twice")
    first = await poll(client, execution_id)
    assert first["input_request"]["request_id"] == 1
    assert first["input_request"]["schema"] is None
    assert (await answer(client, execution_id, {"request_id": 2, "value": 0})).status_code == 409
    assert (await answer(client, execution_id, {"value": "one"})).status_code == 202
    second = await poll(client, execution_id)
    assert second["status"] == "input_required"
    assert second["input_request"]["request_id"] == 2
    assert second["input_request"]["prompt"] == {"after": "one"}
    assert (await answer(client, execution_id, {"request_id": 1, "value": 0})).status_code == 409
    assert (await answer(client, execution_id, {"request_id": 2, "value": [2]})).status_code == 202
    assert (await poll(client, execution_id))["result"] == ["one", [2]]


@pytest.mark.parametrize(
    "body",
    [
        [1],
        "text",
        {},
        {"request_id": 1},
        {"value": 1, "other": 2},
        {"request_id": 0, "value": 1},
        {"request_id": "1", "value": 1},
        {"request_id": True, "value": 1},
    ],
)
async def test_a_malformed_body_is_422_and_changes_nothing(
    client: httpx.AsyncClient, body: Any
) -> None:
    execution_id = await start(client, "twice")
    await poll(client, execution_id)
    response = await answer(client, execution_id, body)
    assert response.status_code == 422, response.text
    assert "detail" in response.json()
    still = (await client.get(f"/executions/{execution_id}")).json()
    assert still["status"] == "input_required"
    await client.post(f"/executions/{execution_id}/cancel")


async def test_bad_json_is_400_and_an_unknown_execution_404(client: httpx.AsyncClient) -> None:
    unknown = await answer(client, "0" * 32, {"value": 1})
    assert unknown.status_code == 404
    execution_id = await start(client, "twice")
    await poll(client, execution_id)
    bad = await client.post(
        f"/executions/{execution_id}/input",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400
    await client.post(f"/executions/{execution_id}/cancel")


async def test_a_synchronous_run_answers_202_with_its_location_at_input_required(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/reasoners/approve", json={"amount": 3})
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status"] == "input_required"
    assert response.headers["location"] == f"/executions/{body['execution_id']}"
    taken = await answer(client, body["execution_id"], {"value": {"approved": False, "note": "no"}})
    assert taken.status_code == 202
    ended = await poll(client, body["execution_id"])
    assert ended["result"] == {"approved": False, "note": "no", "amount": 3}


async def test_no_answer_within_the_timeout_raises_input_timeout_in_the_reasoner(
    client: httpx.AsyncClient,
) -> None:
    execution_id = await start(client, "impatient", {"timeout": 0.2})
    waiting = await poll(client, execution_id)
    if waiting["status"] == "input_required":
        assert waiting["input_request"]["expires_at"] is not None
    done = await ended(client, execution_id)
    assert done["status"] == "succeeded"
    assert done["result"] == {"timed_out": True, "request_id": 1}
    assert (await answer(client, execution_id, {"value": 5})).status_code == 409
    assert await metric(client, 'agent_server_executions_waiting{reasoner="impatient"}') == 0


async def test_an_answer_within_the_timeout_is_validated_and_returned(
    client: httpx.AsyncClient,
) -> None:
    execution_id = await start(client, "impatient", {"timeout": 30})
    await poll(client, execution_id)
    assert (await answer(client, execution_id, {"value": "x"})).status_code == 422
    assert (await answer(client, execution_id, {"value": 41})).status_code == 202
    assert (await poll(client, execution_id))["result"] == {"timed_out": False, "answer": 41}


async def test_a_waiting_execution_is_cancelled_like_a_running_one_and_not_deleted(
    client: httpx.AsyncClient,
) -> None:
    execution_id = await start(client, "guarded")
    assert (await poll(client, execution_id))["status"] == "input_required"
    refused = await client.delete(f"/executions/{execution_id}")
    assert refused.status_code == 409
    assert "input_required" in refused.json()["detail"]
    cancelled = await client.post(f"/executions/{execution_id}/cancel")
    assert cancelled.status_code == 202
    done = await ended(client, execution_id)
    assert (done["status"], done["status_reason"]) == ("cancelled", "request")
    assert (await answer(client, execution_id, {"value": 1})).status_code == 409
    assert (await client.delete(f"/executions/{execution_id}")).status_code == 204


async def test_a_session_release_cancels_a_waiting_execution(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/reasoners/guarded/async", json={}, headers={"X-Session-ID": "chat-1"}
    )
    execution_id = response.json()["execution_id"]
    await poll(client, execution_id)
    released = await client.delete("/sessions/chat-1", params={"timeout": 5})
    assert released.status_code == 200
    assert released.json()["cancelled"] == 1
    assert (await client.get(f"/executions/{execution_id}")).status_code == 404


async def test_the_event_stream_carries_the_request(client: httpx.AsyncClient) -> None:
    execution_id = await start(client, "guarded")
    waiting = await poll(client, execution_id)
    await client.post(f"/executions/{execution_id}/cancel")
    await ended(client, execution_id)
    stream = await client.get(f"/executions/{execution_id}/events")
    frames = [f for f in stream.text.split("\n\n") if f.strip()]
    named = {}
    for frame in frames:
        fields = dict(
            line.split(": ", 1) for line in frame.splitlines() if ": " in line and line[0] != ":"
        )
        if "event" in fields:
            named[fields["event"]] = json.loads(fields["data"])
    assert named["input_required"] == waiting["input_request"]
    assert named["note"] == {"cancelled": True}
    assert named["end"]["status"] == "cancelled"


async def test_a_reasoner_cannot_emit_the_reserved_event_name() -> None:
    from agent_server.model.context import RESERVED_EVENTS

    assert "input_required" in RESERVED_EVENTS


async def test_the_openapi_document_has_the_route_and_the_schema(
    client: httpx.AsyncClient,
) -> None:
    document = (await client.get("/openapi.json")).json()
    route = document["paths"]["/executions/{execution_id}/input"]["post"]
    assert set(route["responses"]) >= {"202", "404", "409", "422"}
    execution = document["components"]["schemas"]["Execution"]
    assert "input_request" in execution["required"]
    assert "input_required" in execution["properties"]["status"]["enum"]
    assert "202" in document["paths"]["/reasoners/approve"]["post"]["responses"]


# -- one validation, whichever replica: the owner too reads JSON's own types ----------------


@pytest.mark.parametrize(
    "wrong", [{"approved": "true"}, {"approved": "false"}, {"approved": 1}, {"approved": None}]
)
async def test_the_owner_refuses_what_json_schema_refuses(
    client: httpx.AsyncClient, wrong: Any
) -> None:
    """pydantic's lax mode would read `"true"` as True on the owner, where another replica
    (JSON Schema) refuses it: every replica refuses it now, and nothing changes."""
    execution_id = await start(client, "approve")
    await poll(client, execution_id)
    refused = await answer(client, execution_id, {"request_id": 1, "value": wrong})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["type"] == "schema_type"
    assert (await client.get(f"/executions/{execution_id}")).json()["status"] == "input_required"
    taken = await answer(client, execution_id, {"request_id": 1, "value": {"approved": False}})
    assert taken.status_code == 202
    assert (await poll(client, execution_id))["result"]["approved"] is False


@pytest.mark.parametrize("key", ["", "k" * 257, 5])
async def test_a_key_that_is_not_a_short_string_is_a_value_error(key: Any) -> None:
    from agent_server import ExecutionContext

    context = ExecutionContext.__new__(ExecutionContext)
    with pytest.raises(ValueError, match="key must be"):
        await context.ask("?", key=key)


async def test_an_answer_over_max_answer_bytes_is_413() -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=make_agent(Settings(max_answer_bytes=100))),
        base_url="http://testserver",
    ) as client:
        execution_id = await start(client, "twice")
        await poll(client, execution_id)
        refused = await answer(client, execution_id, {"request_id": 1, "value": "x" * 99})
        assert refused.status_code == 413, refused.text
        assert "--max-answer-bytes" in refused.json()["detail"]
        assert (await client.get(f"/executions/{execution_id}")).json()["status"] == (
            "input_required"
        )
        assert (await answer(client, execution_id, {"value": "x" * 97})).status_code == 202


@pytest.mark.parametrize(
    ("reasoner", "body", "wrong", "right"),
    [
        # An integral float past what the owner's `int` reads from a float (2**63).
        ("impatient", {"timeout": 60}, 1e19, 7),
        ("impatient", {"timeout": 60}, -(2.0**63), -7),
        # A lone surrogate: JSON carries it, the owner's `str` refuses it.
        ("chat", {"turns": 1}, "\ud800", "hello"),
        ("email", {}, "me\udfff@example.com", "me@example.com"),
    ],
)
async def test_an_answer_the_owners_type_would_refuse_is_refused_here(
    client: httpx.AsyncClient, reasoner: str, body: Any, wrong: Any, right: Any
) -> None:
    """What JSON Schema alone would let through but the owner's type then refuses (which
    would fail an execution whose answer was taken, 202) is a 422 where it is answered, and
    the ask stays; a right answer then goes on."""
    execution_id = await start(client, reasoner, body)
    assert (await poll(client, execution_id))["status"] == "input_required"
    refused = await client.post(  # as JSON escapes (a lone surrogate is no UTF-8)
        f"/executions/{execution_id}/input",
        content=json.dumps({"request_id": 1, "value": wrong}).encode(),
        headers={"content-type": "application/json"},
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["type"].startswith("schema_"), refused.text
    assert (await client.get(f"/executions/{execution_id}")).json()["status"] == "input_required"
    taken = await answer(client, execution_id, {"request_id": 1, "value": right})
    assert taken.status_code == 202, taken.text
    assert (await ended(client, execution_id))["status"] == "succeeded"
