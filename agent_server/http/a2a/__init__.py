"""A2A (the Agent2Agent protocol, v1.0 and v0.3) on the server's own executions: the agent
card at `/.well-known/agent-card.json` and JSON-RPC at `/a2a` (docs/protocols.md).

The official SDK (`a2a-sdk`, the `a2a` extra) gives the protocol types and the JSON-RPC
dispatcher (v1.0's methods, and v0.3's names through its compatibility layer when
`A2A-Version` is missing or 0.3); `handler.py` implements its request handler on the
executions, `executions.py` reaches them through the calls the HTTP routes make, and
`body.py` answers first what protobuf, under the SDK, cannot carry. Imported only with
`--a2a`.
"""

from __future__ import annotations

from a2a.server.context import ServerCallContext
from a2a.server.routes.common import ServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive

from agent_server.http.a2a.body import implied_version, refusal
from agent_server.http.a2a.card import CARD_PATH, RPC_PATH, CardMaker
from agent_server.http.a2a.executions import A2AExecutions
from agent_server.http.a2a.handler import ExecutionsHandler, card_json
from agent_server.http.a2a.sdk_logs import quiet_sdk_logs
from agent_server.http.params import first_values, read_body
from agent_server.http.routing import ApiError, Endpoint, JSONResponse
from agent_server.model import jsoncodec
from agent_server.model.reasoner import Reasoner
from agent_server.service.use_cases import UseCases

__all__ = ["CARD_PATH", "RPC_PATH", "A2AProtocol"]

#: JSON-RPC's parse error, answered here for a body that is not strict JSON.
PARSE_ERROR = -32700


class _Context(ServerCallContextBuilder):
    """The SDK's call context, holding the request (its scope carries the principal)."""

    def build(self, request: Request) -> ServerCallContext:
        return ServerCallContext(
            state={"headers": dict(request.headers), "request": request},
        )


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body already read, then waits on the client (its
    disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class A2AProtocol:
    """The A2A routes of an agent: given the use cases, its reasoners, name and default
    reasoner."""

    def __init__(
        self,
        use_cases: UseCases,
        reasoners: dict[str, Reasoner],
        name: str,
        *,
        max_body_size: int,
        webhooks: bool,
        default_reasoner: str | None,
        secured: bool,
        public_url: str | None = None,
    ):
        self.max_body_size = max_body_size
        self.card = CardMaker(
            name,
            reasoners.values(),
            push_notifications=webhooks,
            secured=secured,
            public_url=public_url,
        )
        self.handler = ExecutionsHandler(
            A2AExecutions(use_cases), reasoners, default_reasoner, self.card, webhooks
        )
        self.dispatcher = JsonRpcDispatcher(
            self.handler, context_builder=_Context(), enable_v0_3_compat=True
        )
        quiet_sdk_logs()
        #: Served without a token: the card is for discovery.
        self.public_paths = frozenset({CARD_PATH})

    async def agent_card(self, request: Request) -> Response:
        return JSONResponse(card_json(self.card.card(request)))

    async def rpc(self, request: Request) -> Response:
        """JSON-RPC: the body read within `--max-body-size` (413 past it), a body that is
        not strict JSON a parse error, one protobuf cannot carry (`body.py`) the error
        JSON-RPC gives it; the rest is the SDK's dispatcher."""
        headers = first_values(request.scope["headers"])
        declared = headers.get(b"content-length")
        limit = self.max_body_size
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        body = await read_body(request.receive, limit)
        try:
            parsed = jsoncodec.loads(body)
            jsoncodec.check(parsed, "the body")
        except (ValueError, RecursionError, jsoncodec.Unrecordable) as exc:
            error = {"code": PARSE_ERROR, "message": f"parse error: {jsoncodec.short_error(exc)}"}
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error})
        refused = refusal(parsed, body, dict(request.headers))
        if refused is not None:
            return JSONResponse(refused)
        scope = request.scope
        implied = implied_version(parsed, dict(request.headers))
        if implied is not None:  # a 1.x method without A2A-Version: served as 1.0
            kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"a2a-version"]
            scope = {**scope, "headers": [*kept, (b"a2a-version", implied.encode())]}
        replayed = Request(scope, _replay(body, request.receive))
        response: Response = await self.dispatcher.handle_requests(replayed)
        return response

    def routes(self) -> list[Route]:
        return [
            Route(RPC_PATH, Endpoint(self.rpc), methods=["POST"]),
            Route(CARD_PATH, Endpoint(self.agent_card), methods=["GET"]),
        ]
