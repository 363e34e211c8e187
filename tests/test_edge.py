"""The HTTP edge against one real process: 422 details that always encode, session ids
every route agrees on, uvicorn's own errors as JSON, and bounds on what one connection may
hold (its body's time, its unread answers, its pipelined requests)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from conftest import ServerProcess
from test_abuse import _exchange

from agent_server.names import is_session_id

#: Bound on every single exchange (seconds).
TIMEOUT = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("edge")
    process = ServerProcess(["tests_app:agent"], {}, folder)
    try:
        process.wait_ready()
        yield process
    finally:
        process.close()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        yield http


def _post(server: ServerProcess, path: str, body: bytes, *headers: bytes) -> tuple[int, bytes]:
    request = (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n".encode()
        + b"".join(header + b"\r\n" for header in headers)
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    status, headers_seen, answer = _exchange(server, request)
    assert headers_seen["content-type"] == "application/json", answer[:200]
    return status, answer


# -- 3: 422 details ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reasoner", "body"),
    [
        ("sleep", rb'{"seconds": "\ud800"}'),  # a float given a lone surrogate
        ("sleep", rb'{"\udfff": 1}'),  # an unknown key that is one
        ("sleep", rb'{"seconds": 0, "marker": ["\udbff\udbff"]}'),  # inside a list
        ("echo", rb'{"text": {"\ud800": "\udc00x"}}'),  # a nested key and value
        ("labelled", rb'{"label": {"name": "\ud83d"}}'),  # a pattern-constrained string
        ("labelled", rb'{"label": {"name": "ab", "kind": "\ud800"}, "note": "\udc01"}'),
        ("labelled", rb'{"label": "\ud800", "\ud800\ud800": null}'),  # extra key, bad model
    ],
)
def test_422_details_always_encode(server: ServerProcess, reasoner: str, body: bytes) -> None:
    """Lone surrogates are valid JSON escapes but not UTF-8: the detail echoes them escaped
    as text, in a body that is strict UTF-8 JSON, never a 500."""
    status, answer = _post(server, f"/reasoners/{reasoner}", body)
    assert status == 422, answer[:300]
    text = answer.decode("utf-8")  # strict: raises on anything UTF-8 cannot carry
    detail = json.loads(text)["detail"]
    assert detail and all({"type", "loc", "msg"} <= set(error) for error in detail)
    assert "\\\\u" in text  # the surrogate came back as the text of its escape


def test_422_detail_keeps_encodable_input_as_it_was(server: ServerProcess) -> None:
    status, answer = _post(server, "/reasoners/labelled", '{"label": {"name": "Été"}}'.encode())
    assert status == 422
    [error] = json.loads(answer)["detail"]
    assert error["loc"] == ["label", "name"] and error["input"] == "Été"


# -- 6: session ids ----------------------------------------------------------------------------

#: Refused wherever a session id is given: what a path segment cannot carry as it is.
BAD_SESSION_IDS = [
    "a/b",
    "café",
    "a b",
    "a%2Fb",
    "%41",
    "..",
    ".",
    "x" * 257,
    "a?b",
    "a#b",
    "a\\b",
    'a"b',
    "a<b>",
    "tab\there",
]
#: Accepted, and so releasable at /sessions/{id} and findable by ?session_id=.
GOOD_SESSION_IDS = [
    "s",
    "conv-7",
    "user:42@example.com",
    "a.b_c~d",
    "!$&'()*+,;=",
    "...",
    "x" * 256,
]


@pytest.mark.parametrize("session_id", BAD_SESSION_IDS)
def test_unaddressable_session_ids_are_400_everywhere(
    server: ServerProcess, client: httpx.Client, session_id: str
) -> None:
    """The header, the release route and the list filter refuse the same ids, so no work
    can be started under an id that could not be released or found."""
    header = b"X-Session-ID: " + session_id.encode()
    status, answer = _post(server, "/reasoners/echo/async", b'{"text": "x"}', header)
    assert status == 400 and b"session id is" in answer, answer[:300]
    path = quote(session_id, safe="")
    status, _, answer = _exchange(
        server, f"DELETE /sessions/{path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
    )
    assert status == 400 and b"session id is" in answer, (path, answer[:300])
    listed = client.get("/executions", params={"session_id": session_id})
    assert listed.status_code == 400 and "session id is" in listed.json()["detail"]


def test_a_slash_in_the_release_path_is_400_in_any_form(server: ServerProcess) -> None:
    """uvicorn decodes '%2F' in the path: both forms reach the release route and are
    refused as ids, not missed as routes."""
    for path in ["a/b", "a%2Fb", "a%2fb", "%2F", "a/", "%2E%2E", "a%252Fb"]:
        request = f"DELETE /sessions/{path} HTTP/1.1\r\nHost: t\r\n\r\n"
        status, _, answer = _exchange(server, request.encode())
        assert status == 400, (path, answer[:200])


@pytest.mark.parametrize("session_id", GOOD_SESSION_IDS)
def test_every_accepted_session_id_is_findable_and_releasable(
    client: httpx.Client, session_id: str
) -> None:
    assert is_session_id(session_id)
    started = client.post(
        "/reasoners/sleep/async", json={"seconds": 60}, headers={"X-Session-ID": session_id}
    )
    assert started.status_code == 202, started.text
    execution_id = started.json()["execution_id"]
    found = client.get("/executions", params={"session_id": session_id}).json()
    assert [e["execution_id"] for e in found] == [execution_id]
    # The id as the path segment, unencoded: every accepted character may stand there.
    released = client.delete(f"/sessions/{session_id}", params={"timeout": 5})
    assert released.status_code == 200, released.text
    assert released.json()["session_id"] == session_id
    assert released.json()["cancelled"] == 1
    assert client.get("/executions", params={"session_id": session_id}).json() == []
    assert client.get(f"/executions/{execution_id}").status_code == 404
