"""Authenticators: a request's headers in, a `Principal` out, or `Unauthorized`.

The built-in one reads the bearer token of `Authorization` and tries, in order, the shared
`--api-token` (one principal, `api-token`, with the `admin` scope: it opens everything, as
it always has), the `--api-tokens-file` and a JWT verified against the configured key. The
user's `@agent.authenticate` replaces it: an async function of the headers (a
case-insensitive mapping) that returns a `Principal` or raises `Unauthorized`.

Built from the settings by `agent_server/http/auth.py` (`authenticator_from`); nothing here
reads a setting or an HTTP type, only a mapping of headers.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping

from agent_server.identity.jwt_bearer import JwtBearer
from agent_server.identity.principal import Principal, Unauthorized
from agent_server.identity.tokens_file import TokensFile, token_digest

logger = logging.getLogger("agent_server.auth")

#: What authenticates a request: its headers (case-insensitive) in, a principal out.
Authenticator = Callable[[Mapping[str, str]], Awaitable[Principal]]
#: The principal of the shared `--api-token`: one caller, reaching everything.
SHARED_TOKEN_PRINCIPAL = Principal("api-token", None, frozenset({"admin"}))


def bearer_token(headers: Mapping[str, str]) -> str:
    """The credentials of the one `Authorization: Bearer` header, or Unauthorized. Two
    headers are refused rather than one of them picked."""
    getlist = getattr(headers, "getlist", None)
    values = getlist("authorization") if getlist is not None else [headers.get("authorization")]
    if len(values) != 1 or values[0] is None:
        raise Unauthorized("no single Authorization header")
    scheme, _, credentials = values[0].strip().partition(" ")
    token = credentials.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("not a bearer token")
    return token


class SharedToken:
    """`--api-token`: compared in constant time over digests, so not even its length leaks."""

    def __init__(self, token: str) -> None:
        self._expected = token_digest(token.encode("ascii"))

    def find(self, token: bytes) -> Principal | None:
        if hmac.compare_digest(token_digest(token), self._expected):
            return SHARED_TOKEN_PRINCIPAL
        return None


class BearerAuthenticator:
    """The flags' authenticator: the static tokens first (a lookup), then the JWT."""

    def __init__(
        self, static: list[SharedToken | TokensFile], jwt: JwtBearer | None = None
    ) -> None:
        self.static = static
        self.jwt = jwt

    async def __call__(self, headers: Mapping[str, str]) -> Principal:
        try:
            return await self._principal(headers)
        except Unauthorized as exc:
            # Why, for whoever sets the flags up: the check that failed, never a value.
            logger.debug("bearer token refused: %s", exc)
            raise

    async def _principal(self, headers: Mapping[str, str]) -> Principal:
        token = bearer_token(headers)
        try:
            raw = token.encode("ascii")
        except UnicodeEncodeError:
            raise Unauthorized("token is not ASCII") from None
        for source in self.static:
            found = source.find(raw)
            if found is not None:
                return found
        if self.jwt is not None and JwtBearer.looks_like_one(token):
            return await self.jwt.principal(token)
        raise Unauthorized("unknown token")
