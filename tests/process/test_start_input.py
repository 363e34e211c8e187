"""`GET /executions/{id}/input`: the JSON body an execution was started with, on every store.

The invariants: what a start sent is answered back as the same JSON value (exact integers
past 64 bits, every character), whether the execution is running, queued, finished, or its
reasoner takes no input (`null`); it is handed out exactly as the record is: another
tenant's id answers the very 404 of an unknown one, a caller `@agent.authorize` refuses
`read` gets 403, an admin reads any tenant's, and a forgotten record is unknown; no other
read carries it (the record, a list).

A real `agent-server run tenancy_app:agent --api-tokens-file ...` on the memory store, Redis
and Postgres, driven by httpx. docs/api.md, docs/security.md#what-each-call-asks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.process.test_tenancy import ALICE, BLIND, BOB, READER, ROOT, UNKNOWN_ID, tokens_file
from tests.support.process import ServerProcess

WAIT = 20.0
APP = "tenancy_app:agent"
#: A body whose every part must come back as it was sent: an integer past 64 bits, markup,
#: a character outside the BMP, a line separator, an escaped quote.
TEXT = '<b>"quoted"</b> \U0001f600 \u2028 end'


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis), "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    flags = ["--api-tokens-file", str(tokens_file(tmp_path))]
    if request.param != "memory":
        flags += ["--store", request.getfixturevalue(f"{request.param}_url")]
    marker = tmp_path / "server"
    marker.mkdir()
    process = ServerProcess([APP, *flags], {}, marker)
    try:
        process.wait_ready()
        yield process
    finally:
        process.close()


def call(
    server: ServerProcess, token: str | None, method: str, path: str, **kwargs: Any
) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    headers.update(kwargs.pop("headers", {}))
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=WAIT, **kwargs)


def started(server: ServerProcess, reasoner: str, body: Any, **params: Any) -> str:
    """An execution alice (tenant acme) started in the background, by its id; `body` sent as
    the exact text given when it is a string."""
    sent = {"content": body} if isinstance(body, str) else {"json": body}
    response = call(
        server,
        ALICE,
        "POST",
        f"/reasoners/{reasoner}/async",
        params=params,
        headers={"Content-Type": "application/json"},
        **sent,
    )
    assert response.status_code == 202, response.text
    execution_id: str = response.json()["execution_id"]
    return execution_id


def input_of(server: ServerProcess, execution_id: str, token: str | None = ALICE) -> Any:
    response = call(server, token, "GET", f"/executions/{execution_id}/input")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return json.loads(response.text)


def test_the_input_is_answered_as_it_was_sent_in_every_state(server: ServerProcess) -> None:
    # Sent as text: 2**70 comes back exact only if nothing on the way made it a float (the
    # run itself fails: no string is that long).
    big = 2**70
    sized = started(server, "sized", f'{{"size": {big}}}')
    text = started(server, "echo", {"text": TEXT})
    held = started(server, "hold", {"seconds": 60})
    queued = started(server, "hold", {"seconds": 0.5}, delay=600)
    bare = started(server, "secret", "")  # no body at all
    null = started(server, "secret", "null")
    ended = call(server, ALICE, "GET", f"/executions/{text}", params={"wait": 15}).json()
    assert ended["status"] == "succeeded" and ended["result"] == {"text": TEXT}
    assert input_of(server, text) == {"text": TEXT}
    assert call(server, ALICE, "GET", f"/executions/{held}").json()["status"] == "running"
    assert input_of(server, held) == {"seconds": 60}
    assert call(server, ALICE, "GET", f"/executions/{queued}").json()["status"] == "queued"
    assert input_of(server, queued) == {"seconds": 0.5}
    assert input_of(server, bare) is None and input_of(server, null) is None
    answer = call(server, ALICE, "GET", f"/executions/{sized}/input")
    assert answer.status_code == 200 and answer.text == f'{{"size":{big}}}'
    # A sync run's too.
    run = call(server, ALICE, "POST", "/reasoners/echo", json={"text": "sync"})
    assert run.status_code == 200, run.text
    assert input_of(server, run.json()["execution_id"]) == {"text": "sync"}
    # Read apart: neither the record nor a list carries it.
    for execution_id in (text, held):
        assert "body" not in call(server, ALICE, "GET", f"/executions/{execution_id}").json()
    listed = call(server, ALICE, "GET", "/executions").json()
    assert listed and all("body" not in record and "input" not in record for record in listed)
    for execution_id in (held, queued):
        assert call(server, ALICE, "POST", f"/executions/{execution_id}/cancel").status_code in (
            200,
            202,
        )


def test_the_input_is_handed_out_as_the_record_is(server: ServerProcess) -> None:
    mine = started(server, "echo", {"text": TEXT})
    assert call(server, ALICE, "GET", f"/executions/{mine}", params={"wait": 15}).status_code == 200
    unknown = call(server, BOB, "GET", f"/executions/{UNKNOWN_ID}/input")
    foreign = call(server, BOB, "GET", f"/executions/{mine}/input")
    # Another tenant's: the very bytes of an unknown id, nothing of the input.
    assert (foreign.status_code, foreign.content) == (unknown.status_code, unknown.content)
    assert foreign.status_code == 404 and "quoted" not in foreign.text
    # `read` is asked: refused, 403 and nothing of it; a read-only caller of the tenant reads.
    refused = call(server, BLIND, "GET", f"/executions/{mine}/input")
    assert refused.status_code == 403 and "quoted" not in refused.text
    assert refused.json() == {"detail": "not allowed to read"}
    assert input_of(server, mine, READER) == {"text": TEXT}
    assert input_of(server, mine, ROOT) == {"text": TEXT}  # the admin reads every tenant's
    assert call(server, None, "GET", f"/executions/{mine}/input").status_code == 401
    # Forgotten: unknown.
    assert call(server, ALICE, "DELETE", f"/executions/{mine}").status_code == 204
    gone = call(server, ALICE, "GET", f"/executions/{mine}/input")
    assert (gone.status_code, gone.content) == (unknown.status_code, unknown.content)
    # One route, two methods: a 405 names both.
    other = call(server, ALICE, "PUT", f"/executions/{UNKNOWN_ID}/input")
    assert other.status_code == 405
    assert {"GET", "POST"} <= {m.strip() for m in other.headers["allow"].split(",")}


def test_the_history_is_handed_out_as_the_record_is(server: ServerProcess) -> None:
    """`GET /executions/{id}/history` asks what the record's read asks: another tenant's id
    answers the very 404 of an unknown one, `read` refused is 403, the admin reads any
    tenant's, no token is 401, a forgotten one is unknown."""
    mine = started(server, "echo", {"text": TEXT})
    assert call(server, ALICE, "GET", f"/executions/{mine}", params={"wait": 15}).status_code == 200
    path = f"/executions/{mine}/history"
    unknown = call(server, BOB, "GET", f"/executions/{UNKNOWN_ID}/history")
    foreign = call(server, BOB, "GET", path)
    assert (foreign.status_code, foreign.content) == (unknown.status_code, unknown.content)
    assert foreign.status_code == 404
    refused = call(server, BLIND, "GET", path)
    assert refused.status_code == 403 and refused.json() == {"detail": "not allowed to read"}
    for token in (ALICE, READER, ROOT):
        answer = call(server, token, "GET", path)
        assert (answer.status_code, answer.json()) == (200, []), answer.text  # run once
    assert call(server, None, "GET", path).status_code == 401
    assert call(server, ALICE, "DELETE", f"/executions/{mine}").status_code == 204
    gone = call(server, ALICE, "GET", path)
    assert (gone.status_code, gone.content) == (unknown.status_code, unknown.content)
