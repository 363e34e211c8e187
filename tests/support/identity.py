"""An identity provider of the tests: keys, tokens signed with them (good and forged), and a
real JWKS endpoint served over loopback from a thread, whose key set a test can rotate or
take down."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, Key, RSAKey

ISSUER = "https://idp.example.test"
AUDIENCE = "agent-server-tests"
TENANT_CLAIM = "org_id"


def hs256(header: dict[str, Any], claims: dict[str, Any], secret: bytes) -> str:
    """A compact JWS signed HS256 with any bytes for its secret, signed here by hand: the
    forgeries (a public key as an HMAC secret) are what JOSE libraries rightly refuse to make,
    so the tests must not depend on one still being lenient."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Provider:
    """Signing keys by kid, and tokens from them."""

    def __init__(self) -> None:
        self.keys: dict[str, Key] = {
            "rsa-1": RSAKey.generate_key(2048, parameters={"kid": "rsa-1"}),
            "ec-1": ECKey.generate_key("P-256", parameters={"kid": "ec-1"}),
        }

    def add(self, kid: str) -> Key:
        self.keys[kid] = RSAKey.generate_key(2048, parameters={"kid": kid})
        return self.keys[kid]

    def jwks(self, *kids: str) -> dict[str, Any]:
        return {"keys": [self.keys[kid].as_dict(private=False) for kid in kids]}

    @staticmethod
    def claims(**overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "sub": "user-7f3a",
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + 600,
            TENANT_CLAIM: "org-5c1e",
            "scope": "read write",
        }
        claims.update(overrides)
        return {name: value for name, value in claims.items() if value is not None}

    def token(self, kid: str = "rsa-1", alg: str | None = None, **claims: Any) -> str:
        key = self.keys[kid]
        alg = alg or ("ES256" if isinstance(key, ECKey) else "RS256")
        return jwt.encode({"alg": alg, "kid": kid}, self.claims(**claims), key, algorithms=[alg])

    def signed_by_another(self, kid: str = "rsa-1") -> str:
        """A token naming `kid` but signed with a key of its own: a bad signature."""
        other = RSAKey.generate_key(2048)
        return jwt.encode({"alg": "RS256", "kid": kid}, self.claims(), other, algorithms=["RS256"])

    def signed_as(self, header: dict[str, Any], kid: str) -> str:
        """A token with `header` as given, signed with the key `kid` under the header's
        alg (which may not be that key's)."""
        alg = header["alg"]
        return jwt.encode(header, self.claims(), self.keys[kid], algorithms=[alg])

    def unsigned(self, kid: str | None = "rsa-1") -> str:
        """`alg: none`, no signature."""
        fields = {"alg": "none", "typ": "JWT"} if kid is None else {"alg": "none", "kid": kid}
        header = b64(json.dumps(fields).encode())
        return f"{header}.{b64(json.dumps(self.claims()).encode())}."

    def hmac_with_public_key(self, kid: str = "rsa-1") -> str:
        """HS256 with the RSA public key (PEM, as served) for its secret: the key confusion."""
        public = self.keys[kid]
        assert isinstance(public, RSAKey)
        header = {"alg": "HS256", "kid": kid}
        return hs256(header, self.claims(), public.as_pem(private=False))


class JwksServer:
    """A JWKS endpoint over loopback, served from a thread: `document` is what it answers,
    `down` makes it answer 503, `stall` holds each answer that many seconds, `padding` adds
    that many bytes to it; `fetches` counts the requests."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.down = False
        self.stall = 0.0
        self.padding = 0
        self.fetches = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.fetches += 1
                if server.stall:
                    time.sleep(server.stall)
                if server.down:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                document = dict(server.document)
                if server.padding:
                    document["padding"] = "x" * server.padding
                body = json.dumps(document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"

    def __enter__(self) -> JwksServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
