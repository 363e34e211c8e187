"""The app of the authentication tests: `agent-server run auth_app:agent`, whose `/whoami`
route answers the principal the request was authenticated as; `custom` authenticates with
`@agent.authenticate` instead of the flags."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agent_server import Agent, Principal, Unauthorized


async def whoami(request: Request) -> JSONResponse:
    principal: Principal = request.state.principal
    return JSONResponse(
        {
            "identity": principal.identity,
            "tenant": principal.tenant,
            "scopes": sorted(principal.scopes),
            "admin": principal.is_admin,
        }
    )


agent = Agent("auth-tests", routes=[Route("/whoami", whoami)])


@agent.reasoner()
async def echo(text: str) -> dict[str, str]:
    return {"text": text}


custom = Agent("auth-custom", routes=[Route("/whoami", whoami)])


@custom.authenticate
async def from_gateway(headers: Mapping[str, str]) -> Principal:
    """A gateway in front has authenticated the caller and says who it is."""
    user = headers.get("x-gateway-user")
    if headers.get("x-gateway-secret") != "gw-s3cret" or not user:
        raise Unauthorized("not from the gateway")
    if user == "crash":
        raise RuntimeError(f"gateway header {headers.get('x-gateway-secret')} broke it")
    if user == "nobody":
        return "nobody"  # type: ignore[return-value] - a wrong answer, on purpose
    return Principal(user, headers.get("x-gateway-org"), {"admin"} if user == "root" else ())


@custom.reasoner()
async def echo_custom(text: str) -> dict[str, str]:
    return {"text": text}
