"""Bearer-token authentication: in-process for every route, and against real processes for
the flag, the environment twin and the mounted-secret file."""

from __future__ import annotations

import itertools
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from agent_server import Settings
from tests.apps.tests_app import make_agent

TOKEN = "s3cret-Token_value.42"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
UNAUTHORIZED = {"detail": "unauthorized"}
OPEN_ROUTES = ["/healthz", "/readyz"]
#: (method, path) for every protected route, plus paths that do not exist at all.
PROTECTED = [
    ("GET", "/reasoners"),
    ("POST", "/reasoners/echo"),
    ("POST", "/reasoners/echo/async"),
    ("GET", "/executions"),
    ("GET", "/executions/0123456789abcdef0123456789abcdef"),
    ("DELETE", "/executions/0123456789abcdef0123456789abcdef"),
    ("POST", "/executions/0123456789abcdef0123456789abcdef/cancel"),
    ("DELETE", "/sessions/s1"),
    ("GET", "/openapi.json"),
    ("GET", "/no-such-route"),
    ("GET", "/healthz/../reasoners"),
    ("POST", "/metrics/../reasoners/echo"),
]


@pytest.fixture
async def secured() -> AsyncIterator[httpx.AsyncClient]:
    agent = make_agent(Settings(api_token=TOKEN))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as client:
        yield client


def _assert_unauthorized(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.json() == UNAUTHORIZED
    assert response.headers["www-authenticate"] == "Bearer"


# -- in-process ------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), PROTECTED)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"X-Api-Token": TOKEN},
    ],
    ids=["none", "longer", "shorter", "empty", "basic", "no-scheme", "other-header"],
)
async def test_protected_routes_refuse_without_the_token(
    secured: httpx.AsyncClient, method: str, path: str, headers: dict[str, str]
) -> None:
    response = await secured.request(method, path, headers=headers, json={"text": "x"})
    _assert_unauthorized(response)


async def test_refusals_are_identical_whatever_was_wrong(secured: httpx.AsyncClient) -> None:
    """No oracle: a missing token, a wrong one and an unknown path answer byte for byte alike."""
    answers = [
        await secured.get("/reasoners"),
        await secured.get("/reasoners", headers={"Authorization": "Bearer nope"}),
        await secured.get("/executions/does-not-exist"),
        await secured.post("/reasoners/no-such-reasoner", json={}),
    ]
    shapes = {(r.status_code, r.content, tuple(sorted(r.headers.items()))) for r in answers}
    assert len(shapes) == 1


async def test_two_authorization_headers_are_refused(secured: httpx.AsyncClient) -> None:
    headers = [("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer other")]
    _assert_unauthorized(await secured.get("/reasoners", headers=headers))


@pytest.mark.parametrize("path", OPEN_ROUTES)
async def test_probes_stay_open(secured: httpx.AsyncClient, path: str) -> None:
    assert (await secured.get(path)).status_code == 200


async def test_metrics_need_the_token_unless_opened(secured: httpx.AsyncClient) -> None:
    """Its series are pre-created for every reasoner: open, it would tell a client without
    the token which reasoners exist."""
    _assert_unauthorized(await secured.get("/metrics"))
    scraped = await secured.get("/metrics", headers=GOOD)
    assert scraped.status_code == 200
    assert 'reasoner="echo"' in scraped.text
    agent = make_agent(Settings(api_token=TOKEN, metrics_open=True))
    transport = httpx.ASGITransport(app=agent)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as opened:
        assert (await opened.get("/metrics")).status_code == 200
        _assert_unauthorized(await opened.get("/reasoners"))


async def test_the_token_opens_every_route(secured: httpx.AsyncClient) -> None:
    run = await secured.post("/reasoners/echo", json={"text": "hi"}, headers=GOOD)
    assert run.status_code == 200
    assert run.json()["result"] == {"text": "hi"}
    lower = {"Authorization": f"bearer {TOKEN}"}  # the scheme is case-insensitive (RFC 7235)
    started = await secured.post("/reasoners/sleep/async", json={"seconds": 30}, headers=lower)
    assert started.status_code == 202
    location = started.headers["location"]
    assert (await secured.get(location, headers=GOOD)).json()["status"] == "running"
    assert (await secured.post(f"{location}/cancel", headers=GOOD)).status_code == 202
    polled = await secured.get(f"{location}?wait=5", headers=GOOD)
    assert polled.json()["status"] == "cancelled"
    assert (await secured.delete(location, headers=GOOD)).status_code == 204
    listed = (await secured.get("/executions", headers=GOOD)).json()
    assert [e["reasoner"] for e in listed] == ["echo"]
    assert (await secured.get("/reasoners", headers=GOOD)).status_code == 200
    assert (await secured.delete("/sessions/s1", headers=GOOD)).status_code == 200


async def test_openapi_documents_the_scheme_and_the_open_routes(
    secured: httpx.AsyncClient,
) -> None:
    document = (await secured.get("/openapi.json", headers=GOOD)).json()
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
    }
    assert document["security"] == [{"bearer": []}]
    for path in OPEN_ROUTES:
        assert document["paths"][path]["get"]["security"] == []
    assert "401" in document["paths"]["/reasoners/echo"]["post"]["responses"]
    # What @agent.authorize may refuse is documented as a 403; the probes and /metrics not.
    for path, method in (
        ("/reasoners/echo", "post"),
        ("/executions/{execution_id}", "get"),
        ("/executions/{execution_id}/cancel", "post"),
        ("/executions", "get"),
        ("/sessions/{session_id}", "delete"),
    ):
        assert "403" in document["paths"][path][method]["responses"], (path, method)
    assert "403" not in document["paths"]["/metrics"]["get"]["responses"]


async def test_without_a_token_nothing_is_required(app_client: httpx.AsyncClient) -> None:
    assert (await app_client.get("/reasoners")).status_code == 200
    document = (await app_client.get("/openapi.json")).json()
    assert "security" not in document
    assert "securitySchemes" not in document["components"]


# -- settings --------------------------------------------------------------------------------


def test_token_file_is_read_once_with_its_trailing_newline_stripped(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    settings = Settings(api_token_file=str(secret))
    secret.write_text("changed later")
    assert settings.bearer_token == TOKEN
    assert TOKEN not in repr(settings)
    assert TOKEN not in repr(Settings(api_token=TOKEN))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"api_token": TOKEN, "api_token_file": "/dev/null"}, "not both"),
        ({"api_token": ""}, "1 to 4096 characters"),
        ({"api_token": "two words"}, "without spaces"),
        ({"api_token": "caf\u00e9"}, "printable ASCII"),
        ({"api_token_file": "/nonexistent/token"}, "cannot be read"),
        ({"api_token_file": "/"}, "cannot be read"),
    ],
)
def test_invalid_token_settings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**kwargs)


def test_empty_token_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("\n")
    with pytest.raises(ValidationError, match="is empty"):
        Settings(api_token_file=str(secret))


# -- real processes --------------------------------------------------------------------------


def test_token_file_guards_a_real_process(server_factory: Any, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    server = server_factory("tests_app:agent", "--api-token-file", str(secret))
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for path in OPEN_ROUTES:
            assert client.get(path).status_code == 200
        refused = client.post("/reasoners/echo", json={"text": "x"})
        _assert_unauthorized(refused)
        big = client.post("/reasoners/echo", content=b"x" * 4_000_000)  # never read
        _assert_unauthorized(big)
        wrong = client.get("/openapi.json", headers={"Authorization": "Bearer wrong"})
        _assert_unauthorized(wrong)
        ok = client.post("/reasoners/echo", json={"text": "x"}, headers=GOOD)
        assert ok.status_code == 200
        assert ok.json()["result"] == {"text": "x"}
    server.signal(signal.SIGTERM)
    code, _ = server.wait_exit(timeout=10)
    assert code == 0, server.stderr()
    assert TOKEN not in server.stderr()


def test_environment_twin_guards_a_real_process(server_factory: Any) -> None:
    server = server_factory("tests_app:agent", env={"AGENT_SERVER_API_TOKEN": TOKEN})
    with httpx.Client(base_url=server.url, timeout=5) as client:
        _assert_unauthorized(client.get("/reasoners"))
        assert client.get("/reasoners", headers=GOOD).status_code == 200
        assert client.get("/readyz").status_code == 200
    server.signal(signal.SIGTERM)
    assert server.wait_exit(timeout=10)[0] == 0


@pytest.mark.parametrize(
    ("args", "content"),
    [
        (["--api-token-file", "{missing}"], None),
        (["--api-token-file", "{file}"], "\n"),
        (["--api-token-file", "{file}", "--api-token", TOKEN], TOKEN),
        (["--api-token", "has space"], None),
    ],
    ids=["missing-file", "empty-file", "both", "bad-token"],
)
def test_unusable_token_settings_exit_2(
    server_factory: Any, tmp_path: Path, args: list[str], content: str | None
) -> None:
    secret = tmp_path / "token"
    if content is not None:
        secret.write_text(content)
    paths = {"missing": str(tmp_path / "missing"), "file": str(secret)}
    server = server_factory("tests_app:agent", *(a.format(**paths) for a in args), ready=False)
    code, _ = server.wait_exit(timeout=15)
    assert code == 2, server.stderr()
    assert "invalid settings" in server.stderr()
    assert TOKEN not in server.stderr()


# -- execution ids ---------------------------------------------------------------------------


async def test_execution_ids_are_random_and_unguessable(app_client: httpx.AsyncClient) -> None:
    """128 random bits (UUID 4): no sequence, no clock, nothing an attacker could predict."""
    ids = [
        (await app_client.post("/reasoners/echo", json={"text": "x"})).json()["execution_id"]
        for _ in range(200)
    ]
    assert len(set(ids)) == len(ids)
    for value in ids:
        parsed = uuid.UUID(hex=value)
        assert value == parsed.hex and parsed.version == 4
    # Consecutive ids share no more leading characters than chance would give.
    # (Seven or more shared leading hex digits: about 1 in 1,300,000 runs of 200 random ids.)
    shared = [
        next(i for i, (x, y) in enumerate(zip(a + "!", b + "?", strict=True)) if x != y)
        for a, b in itertools.pairwise(ids)
    ]
    assert max(shared) <= 6
