"""Authentication on real `agent-server run` processes over loopback: a tokens file rotated
under a running server, JWT bearer tokens verified against a real JWKS endpoint (rotated, then
taken down) with every forgery refused, and `@agent.authenticate`. Each server runs at debug
level and its whole output is searched: no token and no claim value may be in any line."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.identity import AUDIENCE, ISSUER, TENANT_CLAIM, JwksServer, Provider
from tests.support.process import ServerProcess, server_errors

UNAUTHORIZED = {"detail": "unauthorized"}
#: Bound of every wait for a change to take effect (the contract says within 10 s).
WAIT = 20.0


def until(check: Callable[[], bool], timeout: float = WAIT, what: str = "") -> float:
    """Seconds until `check()` holds, polled; fails after `timeout`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def refused(response: httpx.Response) -> bool:
    """The one 401: same body, same challenge, whatever was wrong."""
    if response.status_code != 401:
        assert response.status_code < 500, response.text
        return False
    assert response.json() == UNAUTHORIZED
    assert response.headers["www-authenticate"] == "Bearer"
    return True


def stop(server: ServerProcess) -> str:
    """SIGTERM, exit 0, and the process's whole output."""
    server.signal(signal.SIGTERM)
    code, _ = server.wait_exit(timeout=15)
    output = server.stderr()
    assert code == 0, output
    return output


def assert_nothing_secret(output: str, secrets: list[str]) -> None:
    leaked = [secret[:12] + "..." for secret in secrets if secret in output]
    assert not leaked, f"found in the server's output: {leaked}"


# -- the tokens file -------------------------------------------------------------------------


TOKEN_A = "tokA-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
TOKEN_B = "tokB-0a1b2c3d4e5f60718293a4b5c6d7e8f9"
TOKEN_C = "tokC-ffeeddccbbaa99887766554433221100"
TOKEN_D = "tokD-00112233445566778899aabbccddeeff"


def replace_atomically(path: Path, text: str) -> None:
    """As the kubelet updates a mounted Secret: the new content appears whole."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


def test_a_tokens_file_rotates_without_a_restart(server_factory: Any, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"# machines\n{TOKEN_A} alice team-1 notes:read,notes:write\n\n  {TOKEN_B}\tbob - admin\n"
    )
    server = server_factory(
        "auth_app:agent", "--api-tokens-file", str(tokens), "--log-level", "debug"
    )
    with httpx.Client(base_url=server.url, timeout=5) as client:

        def whoami(token: str) -> httpx.Response:
            return client.get("/whoami", headers=bearer(token))

        assert whoami(TOKEN_A).json() == {
            "identity": "alice",
            "tenant": "team-1",
            "scopes": ["notes:read", "notes:write"],
            "admin": False,
        }
        assert whoami(TOKEN_B).json() == {
            "identity": "bob",
            "tenant": "~bob",
            "scopes": ["admin"],
            "admin": True,
        }
        assert refused(whoami(TOKEN_C))
        assert client.post("/reasoners/echo", json={"text": "hi"}, headers=bearer(TOKEN_A)).json()[
            "result"
        ] == {"text": "hi"}

        # Rotated: A revoked, C added, B kept.
        replace_atomically(tokens, f"{TOKEN_C} carol team-2\n{TOKEN_B} bob\n")
        took = until(
            lambda: refused(whoami(TOKEN_A)) and whoami(TOKEN_C).status_code == 200,
            what="the rotated tokens file in force",
        )
        assert took < 10.0
        assert whoami(TOKEN_C).json()["tenant"] == "team-2"
        assert whoami(TOKEN_B).json()["scopes"] == []

        # A broken file keeps the tokens read last, and says why without a token.
        tokens.write_text(f"{TOKEN_D} dave\n{TOKEN_C} carol\n{TOKEN_D} erin\n")
        # The file is looked at when a request comes (a stat at most every second).
        until(
            lambda: (
                whoami(TOKEN_C).status_code == 200
                and "line 3: repeats the token of line 1" in server.stderr()
            ),
            what="the warning",
        )
        assert whoami(TOKEN_C).status_code == 200
        assert refused(whoami(TOKEN_D))
        # Repaired in place (truncated and written, not replaced).
        tokens.write_text(f"{TOKEN_D} dave - metrics\n")
        until(lambda: whoami(TOKEN_D).status_code == 200, what="the repaired file")
        assert refused(whoami(TOKEN_C))
        scraped = client.get("/metrics", headers=bearer(TOKEN_D))
        assert scraped.status_code == 200, scraped.text
        assert server_errors(scraped.text) == {}
    output = stop(server)
    warnings = [line for line in output.splitlines() if "repeats the token" in line]
    assert warnings and all("WARNING" in line for line in warnings), output
    assert_nothing_secret(output, [TOKEN_A, TOKEN_B, TOKEN_C, TOKEN_D])


# -- JWT against a real JWKS -----------------------------------------------------------------


def test_jwt_from_a_real_jwks_and_every_forgery_refused(server_factory: Any) -> None:
    provider = Provider()
    now = int(time.time())
    with JwksServer(provider.jwks("rsa-1", "ec-1")) as idp:
        server = server_factory(
            "auth_app:agent",
            *("--jwt-jwks-url", idp.url, "--jwt-audience", AUDIENCE),
            *("--jwt-issuer", ISSUER, "--jwt-tenant-claim", TENANT_CLAIM),
            *("--log-level", "debug"),
        )
        shown: list[str] = []  # every token sent, none of which may be logged

        with httpx.Client(base_url=server.url, timeout=10) as client:

            def whoami(token: str) -> httpx.Response:
                shown.append(token)
                return client.get("/whoami", headers=bearer(token))

            assert whoami(provider.token()).json() == {
                "identity": "user-7f3a",
                "tenant": "org-5c1e",
                "scopes": ["read", "write"],
                "admin": False,
            }
            ec = provider.token("ec-1", scope=None, scp=["agent-server:admin"], sub="svc-e1")
            assert whoami(ec).json() == {
                "identity": "svc-e1",
                "tenant": "org-5c1e",
                "scopes": ["agent-server:admin"],
                "admin": True,
            }
            own = whoami(provider.token(**{TENANT_CLAIM: None})).json()
            assert (own["identity"], own["tenant"]) == ("user-7f3a", "~user-7f3a")
            # A subject named like a tenant, without the claim, is not that tenant's.
            namesake = whoami(provider.token(**{TENANT_CLAIM: None, "sub": "org-5c1e"})).json()
            assert namesake["tenant"] == "~org-5c1e"
            marked = provider.token(**{TENANT_CLAIM: "~user-7f3a"})
            assert whoami(marked).status_code == 401  # no token names an identity's own

            forged = {
                "expired": provider.token(exp=now - 120, iat=now - 900),
                "not yet valid": provider.token(nbf=now + 3600),
                "no exp": provider.token(exp=None),
                "wrong audience": provider.token(aud="another-service"),
                "audience list without ours": provider.token(aud=["a", "b"]),
                "wrong issuer": provider.token(iss="https://evil.example.test"),
                "no sub": provider.token(sub=None),
                "tenant not a string": provider.token(**{TENANT_CLAIM: ["x"]}),
                "scope not strings": provider.token(scope=None, scp=[1, 2]),
                "bad signature": provider.signed_by_another("rsa-1"),
                "alg none": provider.unsigned("rsa-1"),
                "alg none, no kid": provider.unsigned(None),
                "HS256 with the public key": provider.hmac_with_public_key("rsa-1"),
                "ES256 under an RSA kid": provider.signed_as(
                    {"alg": "ES256", "kid": "rsa-1"}, "ec-1"
                ),
                "HS256 under an RSA kid, no key": provider.signed_as(
                    {"alg": "RS512", "kid": "ec-1"}, "rsa-1"
                ),
                "three garbage parts": "a.b.c",
                "payload not JSON": provider.token().split(".")[0] + ".bm90IGpzb24.sig",
            }
            for name, token in forged.items():
                assert refused(whoami(token)), name

            # An unknown kid: refused while the provider's set lacks it, accepted once a
            # rotated set has it (fetched again at once, at most every 10 s).
            provider.add("rsa-2")
            rotated = provider.token("rsa-2", sub="user-rot")
            assert refused(whoami(rotated))
            idp.document = provider.jwks("rsa-1", "ec-1", "rsa-2")
            fetches_before = idp.fetches
            took = until(
                lambda: whoami(rotated).status_code == 200, what="the rotated key accepted"
            )
            assert took < 12.0
            assert idp.fetches - fetches_before <= 2, "a refresh per request"
            assert whoami(rotated).json()["identity"] == "user-rot"

            # The provider down: a new kid is refused (401, not 500) with a WARNING line;
            # the keys fetched before still verify.
            idp.down = True
            provider.add("rsa-3")
            lost = provider.token("rsa-3")
            until(
                lambda: refused(whoami(lost)) and "could not be fetched" in server.stderr(),
                what="the failed fetch said",
            )
            assert whoami(provider.token()).status_code == 200
            assert server_errors(client.get("/metrics", headers=bearer(ec)).text) == {}
        output = stop(server)
    warning = [line for line in output.splitlines() if "could not be fetched" in line]
    assert warning and all("WARNING" in line for line in warning), output
    claim_values = ["user-7f3a", "org-5c1e", "svc-e1", "user-rot", "another-service"]
    assert_nothing_secret(output, [*shown, *claim_values])
    assert ".well-known" not in output  # the URL's path is not shown either


# -- @agent.authenticate ---------------------------------------------------------------------


def test_agent_authenticate_replaces_the_flags(server_factory: Any) -> None:
    server = server_factory("auth_app:custom", "--api-token", TOKEN_A, "--log-level", "debug")
    gateway = {"X-Gateway-Secret": "gw-s3cret"}
    with httpx.Client(base_url=server.url, timeout=5) as client:
        assert refused(client.get("/whoami"))
        assert refused(client.get("/whoami", headers=bearer(TOKEN_A)))  # the flag is replaced
        assert refused(client.get("/whoami", headers={"X-Gateway-User": "ann"}))
        # Headers are a case-insensitive mapping.
        answer = client.get(
            "/whoami", headers={"x-GATEWAY-secret": "gw-s3cret", "X-Gateway-User": "ann"}
        )
        assert answer.json() == {"identity": "ann", "tenant": "~ann", "scopes": [], "admin": False}
        root = client.get(
            "/whoami", headers={**gateway, "X-Gateway-User": "root", "X-Gateway-Org": "acme"}
        )
        assert root.json() == {
            "identity": "root",
            "tenant": "acme",
            "scopes": ["admin"],
            "admin": True,
        }
        # A function that raises, or answers something else, is a 401 too, never a 500.
        assert refused(client.get("/whoami", headers={**gateway, "X-Gateway-User": "crash"}))
        assert refused(client.get("/whoami", headers={**gateway, "X-Gateway-User": "nobody"}))
        run = client.post(
            "/reasoners/echo_custom", json={"text": "x"}, headers={**gateway, "X-Gateway-User": "a"}
        )
        assert run.json()["result"] == {"text": "x"}
        assert client.get("/healthz").status_code == 200
        document = client.get("/openapi.json", headers={**gateway, "X-Gateway-User": "a"}).json()
        assert document["security"] == [{"bearer": []}]
    output = stop(server)
    assert "the authenticator raised RuntimeError at" in output
    assert "the authenticator returned str, not a Principal" in output
    assert_nothing_secret(output, ["gw-s3cret", TOKEN_A])


# -- settings refused at start -----------------------------------------------------------------


def test_unusable_authentication_flags_exit_2_quoting_no_token(
    server_factory: Any, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A} alice\n{TOKEN_B} bob team extra,scopes field\n")
    cases = [
        (("--api-tokens-file", str(tokens)), "line 2: has 5 fields, at most 4"),
        (("--jwt-jwks-url", "https://idp.example.test/jwks"), "jwt-audience is required"),
        (("--jwt-audience", "a"), "jwt-audience needs jwt-jwks-url"),
    ]
    for args, message in cases:
        server = server_factory("auth_app:agent", *args, ready=False)
        code, _ = server.wait_exit(timeout=15)
        output = server.stderr()
        assert code == 2, output
        assert message in output, output
        assert "Traceback" not in output
        assert_nothing_secret(output, [TOKEN_A, TOKEN_B])
