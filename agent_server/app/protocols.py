"""The protocols an agent serves besides its API (docs/protocols.md): A2A with `--a2a` and
MCP with `--mcp`, each built only when turned on, its package (an extra) imported only then,
each given the narrow parts it uses."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from starlette.routing import Route

from agent_server.http.api import Api
from agent_server.model.reasoner import Reasoner
from agent_server.runtime.settings import Settings
from agent_server.service.use_cases import UseCases

if TYPE_CHECKING:
    from agent_server.http.mcp_server import McpEndpoint


#: The request headers A2A's clients send (the SDK's `VERSION_HEADER` and
#: `HTTP_EXTENSION_HEADER`): a page of an allowed origin may send them with `--a2a`.
A2A_REQUEST_HEADERS = ("A2A-Version", "A2A-Extensions")


def protocol_request_headers(settings: Settings) -> tuple[str, ...]:
    """What the protocols turned on add to the headers a page may send (CORS)."""
    from agent_server.http.mcp_tools import MCP_REQUEST_HEADERS

    return (
        *(A2A_REQUEST_HEADERS if settings.a2a else ()),
        *(MCP_REQUEST_HEADERS if settings.mcp else ()),
    )


class AgentSetupError(ValueError):
    """The agent cannot be served as configured (a protocol's extra missing, a default
    reasoner that is none): said in one line at start."""


#: The top-level packages each protocol's extra installs (what an ImportError names when
#: the extra is missing).
EXTRA_PACKAGES: dict[str, tuple[str, ...]] = {"a2a": ("a2a",), "mcp": ("mcp", "mcp_types")}


@contextlib.contextmanager
def _extra(protocol: str) -> Iterator[None]:
    """Import a protocol's front: a missing package of its extra (`--a2a`, `--mcp`) is an
    `AgentSetupError` naming the extra (one line, exit 2, at start); any other
    ImportError is the bug it is."""
    try:
        yield
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in EXTRA_PACKAGES[protocol]:
            raise
        raise AgentSetupError(
            f"--{protocol} needs the {protocol} extra: pip install 'agent-server[{protocol}]'"
        ) from None


def a2a_routes(
    settings: Settings,
    api: Api,
    name: str,
    reasoners: Mapping[str, Reasoner],
    default_reasoner: str | None,
    *,
    secured: bool,
) -> tuple[list[Route], frozenset[str]]:
    """A2A's routes (none without `--a2a`) and the paths they serve without a token."""
    if not settings.a2a:
        return [], frozenset()
    if default_reasoner is not None and default_reasoner not in reasoners:
        raise AgentSetupError(
            f"default_reasoner {default_reasoner!r} is not a reasoner of agent {name!r}"
        )
    with _extra("a2a"):
        from agent_server.http.a2a import A2AProtocol
    a2a = A2AProtocol(
        api.use_cases,
        api.reasoners,
        name,
        max_body_size=api.max_body_size,
        webhooks=api.webhooks,
        default_reasoner=default_reasoner,
        secured=secured,
        public_url=settings.public_url,
    )
    return a2a.routes(), a2a.public_paths


def mcp_endpoint(
    settings: Settings, name: str, reasoners: Mapping[str, Reasoner], use_cases: UseCases
) -> McpEndpoint | None:
    """`/mcp` with `--mcp` (None without)."""
    if not settings.mcp:
        return None
    with _extra("mcp"):
        from agent_server.http.mcp_server import McpEndpoint
    return McpEndpoint(
        name,
        reasoners,
        use_cases,
        result_ttl=settings.result_ttl,
        allowed_origins=settings.cors_allow_origin,
        max_body_size=settings.max_body_size,
        webhook_url=settings.webhook_url,
    )
