"""The agent card: one skill per reasoner, its schemas in a card extension, the interfaces
at the request's own URL (its host and root path, or `--public-url`), and what the server
offers (streaming, push notifications when webhooks are on, the bearer scheme when
authentication is on)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from starlette.requests import Request

from agent_server.http.a2a.tasks import string_field
from agent_server.model.reasoner import Reasoner

#: Where A2A's JSON-RPC is served, under the root path.
RPC_PATH = "/a2a"
#: Where the card is served (A2A's well-known path), without a token.
CARD_PATH = "/.well-known/agent-card.json"
#: The card extension whose params hold each skill's input and output JSON schemas
#: (`AgentSkill` has no schema field); `GET /reasoners` stays their full source.
SCHEMAS_EXTENSION = "urn:agent-server:a2a:skill-schemas:v1"
#: The security scheme's name in the card, when authentication is on.
BEARER = "bearer"
VERSION = "0.1.0"


def base_url(request: Request) -> str:
    """The server's URL as this request reached it: its scheme and host, and the root path
    a proxy strips (`--root-path`), so the card points where the client can reach."""
    return str(request.base_url).rstrip("/")


class CardMaker:
    """Makes the card for a request: the skills are fixed at start, the URL is the request's."""

    def __init__(
        self,
        name: str,
        reasoners: Iterable[Reasoner],
        *,
        push_notifications: bool,
        secured: bool,
        public_url: str | None = None,
    ) -> None:
        self.name = name
        #: `--public-url`: where clients reach the server, whatever a request's host says.
        self.public_url = public_url
        self.reasoners = list(reasoners)
        self.push_notifications = push_notifications
        self.secured = secured
        self.schemas: dict[str, Any] = {
            r.name: {"input_schema": r.input_schema(), "output_schema": r.output_schema()}
            for r in self.reasoners
        }

    def _skill(self, reasoner: Reasoner) -> AgentSkill:
        text = string_field(reasoner) is not None
        return AgentSkill(
            id=reasoner.name,
            name=reasoner.name,
            description=reasoner.description or f"the reasoner {reasoner.name}",
            tags=["reasoner"],
            input_modes=["application/json", "text/plain"] if text else ["application/json"],
            output_modes=["application/json"],
        )

    def card(self, request: Request) -> AgentCard:
        url = (self.public_url or base_url(request)) + RPC_PATH
        extension = AgentExtension(
            uri=SCHEMAS_EXTENSION,
            description="each skill's input and output JSON schemas, by skill id",
            required=False,
        )
        extension.params.update({"skills": self.schemas})
        card = AgentCard(
            name=self.name,
            description=f"agent-server agent {self.name!r}: one skill per reasoner",
            version=VERSION,
            supported_interfaces=[
                AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
                AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3"),
            ],
            capabilities=AgentCapabilities(
                streaming=True,
                push_notifications=self.push_notifications,
                extended_agent_card=True,
                extensions=[extension],
            ),
            default_input_modes=["application/json", "text/plain"],
            default_output_modes=["application/json"],
            skills=[self._skill(r) for r in self.reasoners],
        )
        if self.secured:
            card.security_schemes[BEARER].CopyFrom(
                SecurityScheme(
                    http_auth_security_scheme=HTTPAuthSecurityScheme(
                        scheme="Bearer",
                        description="the server's bearer token or JWT (docs/security.md)",
                    )
                )
            )
            card.security_requirements.append(SecurityRequirement(schemes={BEARER: StringList()}))
        return card
