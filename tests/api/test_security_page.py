"""docs/security.md's `@agent.authenticate` example runs as written: its agent, taken from
the page, answers the page's two requests as the page says (the examples' harness reads a
page's agent without credentials, so it runs here instead)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import httpx

from agent_server.runtime.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def _example() -> types.ModuleType:
    found = re.search(r"```python\n(# gatewayed\.py\n.*?)```", PAGE.read_text(), re.S)
    assert found is not None, "docs/security.md lost its gatewayed.py example"
    module = types.ModuleType("gatewayed")
    exec(compile(found.group(1), str(PAGE), "exec"), module.__dict__)
    return module


async def test_the_gateway_example_answers_as_the_page_says() -> None:
    agent = _example().agent
    transport = httpx.ASGITransport(app=agent)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        greeted = await client.post(
            "/reasoners/greet",
            headers={"X-Gateway-Secret": "gw-demo-secret", "X-Forwarded-User": "ann"},
            json={"name": "ann"},
        )
        assert greeted.status_code == 200, greeted.text
        assert "hello ann" in greeted.text
        refused = await client.post(
            "/reasoners/greet", headers={"X-Forwarded-User": "ann"}, json={}
        )
        assert refused.status_code == 401
        assert refused.json() == {"detail": "unauthorized"}


def _tenants_example() -> types.ModuleType:
    found = re.search(r"```python\n(# tenants\.py\n.*?)```", PAGE.read_text(), re.S)
    assert found is not None, "docs/security.md lost its tenants.py example"
    module = types.ModuleType("tenants")
    exec(compile(found.group(1), str(PAGE), "exec"), module.__dict__)
    return module


async def test_the_authorize_example_narrows_as_the_page_says(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "tok-viewer-0a1b2c3d4e5f6071 vic acme viewer\n"
        "tok-member-8192a3b4c5d6e7f8 meg acme\n"
        "tok-other-f0e1d2c3b4a59687 max acme\n"
        "tok-lead-1234567890abcdef01 lea acme lead\n"
    )
    agent = _tenants_example().agent
    agent.configure(Settings(api_tokens_file=str(tokens)))

    def as_(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer tok-{token}"}

    viewer, member = as_("viewer-0a1b2c3d4e5f6071"), as_("member-8192a3b4c5d6e7f8")
    other, lead = as_("other-f0e1d2c3b4a59687"), as_("lead-1234567890abcdef01")
    transport = httpx.ASGITransport(app=agent)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        mine = await client.post("/reasoners/echo", headers=member, json={"text": "m"})
        theirs = await client.post("/reasoners/echo", headers=other, json={"text": "o"})
        assert mine.status_code == theirs.status_code == 200, (mine.text, theirs.text)
        execution_id = mine.json()["execution_id"]
        # The viewer reads its tenant's work, and does nothing else: 403 with a detail.
        assert (await client.get(f"/executions/{execution_id}", headers=viewer)).status_code == 200
        denied = await client.delete(f"/executions/{execution_id}", headers=viewer)
        assert denied.status_code == 403 and set(denied.json()) == {"detail"}
        started = await client.post("/reasoners/echo", headers=viewer, json={"text": "v"})
        assert started.status_code == 403
        # A member lists what it started; a lead, the tenant's.
        listed = await client.get("/executions", headers=member)
        assert [e["execution_id"] for e in listed.json()] == [execution_id]
        everyone = await client.get("/executions", headers=lead)
        assert len(everyone.json()) == 2
