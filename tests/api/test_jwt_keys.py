"""JWT bearer tokens verified with keys from files (PEM, JWK, JWKS, an HMAC secret), in
process, and the authentication settings refused at start."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey, OKPKey, RSAKey
from pydantic import ValidationError
from starlette.routing import Route

from agent_server import Agent, Settings
from tests.apps.auth_app import whoami
from tests.support.identity import AUDIENCE, ISSUER, Provider, hs256

SECRET = b"hmac-secret-of-forty-bytes-0123456789abc"


def to_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode()


def claims(**overrides: Any) -> dict[str, Any]:
    return Provider.claims(**overrides)


async def whoami_with(settings: Settings, token: str) -> httpx.Response:
    agent = Agent("jwt-keys", settings, routes=[Route("/whoami", whoami)])
    transport = httpx.ASGITransport(app=agent)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return await client.get("/whoami", headers={"Authorization": f"Bearer {token}"})


# EdDSA's name is deprecated by RFC 9864 (Ed25519), and still taken: joserfc warns.
@pytest.mark.filterwarnings("ignore::joserfc.errors.SecurityWarning")
@pytest.mark.parametrize("kind", ["rsa-pem", "ec-pem", "ed25519-pem", "jwk", "jwks"])
async def test_a_public_key_file_verifies_its_own_type(tmp_path: Path, kind: str) -> None:
    if kind == "rsa-pem":
        key: Any = RSAKey.generate_key(2048)
        alg = "PS256"
    elif kind == "ec-pem":
        key, alg = ECKey.generate_key("P-384"), "ES384"
    elif kind == "ed25519-pem":
        key, alg = OKPKey.generate_key("Ed25519"), "EdDSA"
    else:
        key, alg = ECKey.generate_key("P-256", parameters={"kid": "k1"}), "ES256"
    path = tmp_path / "key"
    if kind.endswith("pem"):
        path.write_bytes(key.as_pem(private=False))
    elif kind == "jwk":
        path.write_text(json.dumps(key.as_dict(private=False)))
    else:
        path.write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
    settings = Settings(jwt_public_key_file=str(path), jwt_audience=AUDIENCE, jwt_issuer=ISSUER)
    header = {"alg": alg, "kid": "k1"}
    good = jwt.encode(header, claims(), key, algorithms=[alg])
    answer = await whoami_with(settings, good)
    assert answer.status_code == 200, answer.text
    assert answer.json()["identity"] == "user-7f3a"
    # The same public key as an HMAC secret (the key confusion), and no signature at all.
    public = key.as_pem(private=False) if kind.endswith("pem") else json.dumps(key.as_dict())
    confused = hs256({"alg": "HS256", "kid": "k1"}, claims(), to_bytes(public))
    for forged in (confused, Provider().unsigned("k1"), Provider().unsigned(None)):
        refused = await whoami_with(settings, forged)
        assert refused.status_code == 401, refused.text


async def test_a_secret_file_verifies_hmac_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    settings = Settings(jwt_secret_file=str(path), jwt_audience=AUDIENCE)
    secret = OctKey.import_key(SECRET)
    for alg in ("HS256", "HS512"):
        token = jwt.encode({"alg": alg}, claims(iss=None), secret, algorithms=[alg])
        answer = await whoami_with(settings, token)
        assert answer.status_code == 200, answer.text
    wrong = OctKey.import_key(b"another-secret-of-forty-bytes-012345678")
    forged = [
        jwt.encode({"alg": "HS256"}, claims(), wrong, algorithms=["HS256"]),
        jwt.encode({"alg": "HS256"}, claims(exp=int(time.time()) - 60), secret, ["HS256"]),
        jwt.encode({"alg": "HS256"}, claims(aud="elsewhere"), secret, algorithms=["HS256"]),
        Provider().unsigned(None),
    ]
    for token in forged:
        assert (await whoami_with(settings, token)).status_code == 401
    assert SECRET.decode() not in repr(settings)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jwt_audience": "a"}, "jwt-audience needs jwt-jwks-url"),
        ({"jwt_tenant_claim": "org"}, "jwt-tenant-claim needs"),
        ({"jwt_jwks_url": "https://idp.test/jwks"}, "jwt-audience is required"),
        (
            {
                "jwt_jwks_url": "https://i.test/j",
                "jwt_secret_file": "{secret}",
                "jwt_audience": "a",
            },
            "give one of",
        ),
        ({"jwt_jwks_url": "ftp://idp.test/jwks", "jwt_audience": "a"}, "http:// or https://"),
        ({"jwt_jwks_url": "https://idp.test:port/?t=1", "jwt_audience": "a"}, "malformed"),
        ({"jwt_secret_file": "{short}", "jwt_audience": "a"}, "at least 32 bytes"),
        ({"jwt_secret_file": "{missing}", "jwt_audience": "a"}, "cannot be read"),
        ({"jwt_public_key_file": "{private}", "jwt_audience": "a"}, "give the public key"),
        ({"jwt_public_key_file": "{secret}", "jwt_audience": "a"}, "holds no PEM public key"),
        ({"jwt_public_key_file": "{symmetric}", "jwt_audience": "a"}, "holds no key that"),
        ({"api_tokens_file": "{bad_tokens}"}, "line 2: repeats the token of line 1"),
        ({"api_tokens_file": "{missing}"}, "cannot be read"),
    ],
)
def test_unusable_authentication_settings_are_refused(
    tmp_path: Path, kwargs: dict[str, str], message: str
) -> None:
    paths = {
        "secret": tmp_path / "secret",
        "short": tmp_path / "short",
        "missing": tmp_path / "missing",
        "private": tmp_path / "private.pem",
        "symmetric": tmp_path / "symmetric.json",
        "bad_tokens": tmp_path / "tokens",
    }
    paths["secret"].write_bytes(SECRET)
    paths["short"].write_bytes(b"too-short\n")
    paths["private"].write_bytes(RSAKey.generate_key(2048).as_pem(private=True))
    paths["symmetric"].write_text(json.dumps(OctKey.import_key(SECRET).as_dict()))
    paths["bad_tokens"].write_text("tok-0123456789 alice\ntok-0123456789 bob\n")
    given = {
        name: value.format(**{k: str(v) for k, v in paths.items()})
        for name, value in kwargs.items()
    }
    with pytest.raises(ValidationError) as refused:
        Settings(**given)
    assert message in str(refused.value)
    assert "tok-0123456789" not in str(refused.value)
    assert SECRET.decode() not in str(refused.value)


async def test_an_agent_without_authentication_puts_no_principal(tmp_path: Path) -> None:
    """No flag, no `@agent.authenticate`: nothing is required and no principal is set."""
    seen: list[bool] = []

    async def look(request: Any) -> Any:
        seen.append(hasattr(request.state, "principal"))
        return await whoami_plain(request)

    async def whoami_plain(request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({})

    agent = Agent("open", Settings(), routes=[Route("/look", look)])
    transport = httpx.ASGITransport(app=agent)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        assert (await client.get("/look")).status_code == 200
    assert seen == [False]


def _signed(payload: bytes) -> str:
    """A compact HS256 token over `payload` exactly as given (JSON no encoder would write)."""
    from joserfc import jws

    return jws.serialize_compact({"alg": "HS256"}, payload, OctKey.import_key(SECRET))


async def test_claims_no_strict_json_reader_takes_are_refused_not_obeyed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A signed token whose times are NaN or infinite (which never expire nor start for a
    plain comparison) or whose claims nest past any parser's depth is a 401, and says
    nothing at ERROR; a time past a float's range is only far away."""
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    settings = Settings(jwt_secret_file=str(path), jwt_audience=AUDIENCE)
    now = int(time.time())
    base = f'"sub":"user-7f3a","aud":"{AUDIENCE}","iat":{now}'
    deep = '{"a":' * 3000 + "1" + "}" * 3000
    for payload in (
        f'{{{base},"exp":NaN}}',
        f'{{{base},"exp":Infinity}}',
        f'{{{base},"exp":1e400}}',
        f'{{{base},"exp":{now + 600},"nbf":NaN}}',
        f'{{{base},"exp":{now + 600},"x":{deep}}}',
    ):
        refused = await whoami_with(settings, _signed(payload.encode()))
        assert refused.status_code == 401, (payload[:80], refused.text)
    far = await whoami_with(settings, _signed(f'{{{base},"exp":{10**400}}}'.encode()))
    assert far.status_code == 200, far.text
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.text
