"""JWT bearer tokens: verified with joserfc, then read as a principal.

The signature is checked first, with a key the token's `kid` names and only an algorithm
that key's type allows (`jwt_keys.py`); then the claims: `exp` is
required, `nbf` and `iat` honoured, `aud` must name `--jwt-audience` and `iss` equal
`--jwt-issuer` when given, each with `LEEWAY` seconds of clock skew. The identity is `sub`,
the tenant the `--jwt-tenant-claim` claim (the identity when absent), the scopes `scope` (a
space-separated string) and `scp` (a list, or a string as some providers send it).

Every refusal is `Unauthorized` whose message names the check that failed, never a claim's
value or the token.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

from joserfc import jwt
from joserfc.errors import ExpiredTokenError, JoseError
from joserfc.jws import CompactSignature, JWSRegistry, extract_compact, validate_compact

from agent_server.identity.jwks import KeySource
from agent_server.identity.jwt_keys import VerifyingKey
from agent_server.identity.principal import Principal, Unauthorized, check_name, check_tenant
from agent_server.model import jsoncodec

#: Seconds of clock skew allowed on exp, nbf and iat.
LEEWAY = 30
#: Longest token looked at; anything longer is refused unread.
MAX_TOKEN_BYTES = 16 * 1024
#: Seconds a verified token's principal is kept (never past its `exp`): a key the provider
#: withdraws stops opening the server within this, a caller's next requests skip the
#: signature meanwhile.
CACHE_SECONDS = 60.0
#: Verified tokens kept at most; past it the oldest goes.
MAX_CACHED = 10_000


def _scopes(value: object, claim: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise Unauthorized(f"claim {claim} is neither a string nor a list of strings")


class JwtBearer:
    """Verifies a JWT and reads its principal; a token that is not a JWT is not its own."""

    def __init__(
        self,
        keys: KeySource,
        *,
        audience: str,
        issuer: str | None = None,
        tenant_claim: str | None = None,
    ) -> None:
        self.keys = keys
        self.tenant_claim = tenant_claim
        options: dict[str, Any] = {
            "exp": {"essential": True},
            "aud": {"essential": True, "value": audience},
        }
        if issuer is not None:
            options["iss"] = {"essential": True, "value": issuer}
        self.claims_registry = jwt.JWTClaimsRegistry(leeway=LEEWAY, **options)
        #: Verified tokens by their SHA-256: when their principal stops being good, and it.
        self._verified: dict[bytes, tuple[float, Principal]] = {}

    @staticmethod
    def looks_like_one(token: str) -> bool:
        """Three dot-separated parts: the compact JWS form."""
        return token.count(".") == 2

    async def principal(self, token: str) -> Principal:
        """The principal of a verified token, or Unauthorized saying which check failed."""
        if len(token) > MAX_TOKEN_BYTES:
            raise Unauthorized("token too long")
        digest = hashlib.sha256(token.encode()).digest()
        cached = self._verified.get(digest)
        if cached is not None:
            if time.time() < cached[0]:
                return cached[1]
            del self._verified[digest]
        try:
            compact = extract_compact(token.encode("ascii"))
            header = compact.headers()
        except (JoseError, ValueError, TypeError, KeyError, UnicodeError):
            raise Unauthorized("malformed JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or (kid is not None and not isinstance(kid, str)):
            raise Unauthorized("malformed JWT header")
        keys = [key for key in await self.keys.candidates(kid) if alg in key.algorithms]
        if not keys:
            raise Unauthorized("no key for this kid and alg")
        claims = self._claims(compact, keys)
        principal = self._principal_of(claims)
        self._remember(digest, principal, claims["exp"])
        return principal

    def _claims(self, compact: CompactSignature, keys: list[VerifyingKey]) -> dict[str, Any]:
        """The claims of a token one of `keys` signed, checked."""
        if not any(self._signed_by(compact, key) for key in keys):
            raise Unauthorized("bad signature")
        try:
            # Strict JSON, as every body is read: no NaN or infinity (a time that never
            # passes for a comparison), nothing past the codec's depth or digits.
            claims = jsoncodec.loads(compact.payload)
            jsoncodec.check(claims, "the claims")
        except (ValueError, RecursionError):  # Unrecordable is a ValueError
            raise Unauthorized("claims are not JSON") from None
        if not isinstance(claims, dict):
            raise Unauthorized("claims are not a JSON object")
        try:
            self.claims_registry.validate(claims)
        except ExpiredTokenError:
            raise Unauthorized("expired") from None
        except JoseError as exc:
            # The error names the claim (aud, iss, nbf...), never its value.
            claim = getattr(exc, "claim", None) or type(exc).__name__
            raise Unauthorized(f"claim check failed: {claim}") from None
        except (ValueError, TypeError):
            raise Unauthorized("claims malformed") from None
        return claims

    @staticmethod
    def _signed_by(compact: CompactSignature, key: VerifyingKey) -> bool:
        """Whether `key` signed it, under one of the algorithms its type allows only."""
        allowed = list(key.algorithms)
        registry = JWSRegistry(algorithms=allowed, strict_check_header=False)
        try:
            return validate_compact(compact, key.key, allowed, registry)
        except (JoseError, ValueError, TypeError, KeyError):
            return False

    def _remember(self, digest: bytes, principal: Principal, exp: object) -> None:
        """Keep a verified token's principal until it expires, CACHE_SECONDS at most, so a
        caller's next requests skip the signature; the oldest entry goes past MAX_CACHED."""
        if not isinstance(exp, int | float):
            return
        until = min(exp, time.time() + CACHE_SECONDS)  # compared: an int past a float is far
        if len(self._verified) >= MAX_CACHED:
            del self._verified[next(iter(self._verified))]
        self._verified[digest] = (until, principal)

    def _principal_of(self, claims: Mapping[str, Any]) -> Principal:
        try:
            identity = check_name(claims.get("sub"), "sub")
            tenant = None
            if self.tenant_claim is not None and claims.get(self.tenant_claim) is not None:
                tenant = check_tenant(claims[self.tenant_claim], "the tenant claim")
        except ValueError as exc:
            raise Unauthorized(str(exc)) from None
        scopes = _scopes(claims.get("scope"), "scope") + _scopes(claims.get("scp"), "scp")
        return Principal(identity, tenant, frozenset(scopes), claims)
