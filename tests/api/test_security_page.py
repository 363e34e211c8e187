"""docs/security.md's `@agent.authenticate` example runs as written: its agent, taken from
the page, answers the page's two requests as the page says (the examples' harness reads a
page's agent without credentials, so it runs here instead)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import httpx

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
