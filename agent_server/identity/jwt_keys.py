"""The keys JWT bearer tokens are verified with, each pinned to the algorithms of its type.

A key's type decides what may be verified with it: an RSA key RS*/PS*, an EC key the ES* of
its curve, an Ed25519 key EdDSA, a secret HS*; a JWK's own `alg` narrows that to one. So
`alg: none` is never accepted, and a token signed HS256 with the public key as its secret
(the classic confusion) meets an RSA key that takes no HS*. Keys are read with joserfc
(docs/security.md#jwt-bearer-tokens says why that library).

Files are read when the settings are checked (`agent_server/runtime/settings.py`), so a bad
key stops the start (exit 2); the JWKS a URL serves is parsed here too (`parse_jwks`), by
`jwks.py` that fetches it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, Key, KeySet, OctKey, OKPKey, RSAKey

#: Algorithms each key type verifies; the EC one by curve.
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = {"P-256": ("ES256",), "P-384": ("ES384",), "P-521": ("ES512",)}
OKP_ALGORITHMS = {"Ed25519": ("EdDSA", "Ed25519")}
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
#: Shortest secret for HS*: RFC 7518 section 3.2 asks for at least the hash's size.
MIN_SECRET_BYTES = 32
#: Largest key file read.
MAX_KEY_FILE_BYTES = 1024 * 1024


class KeyFileError(ValueError):
    """A key file or a JWKS that cannot be used; the message never holds key material."""


@dataclass(frozen=True)
class VerifyingKey:
    """A key and the only algorithms a token verified with it may name."""

    key: Key
    algorithms: tuple[str, ...]

    @property
    def kid(self) -> str | None:
        return self.key.kid


def pinned(key: Key) -> VerifyingKey | None:
    """`key` with the algorithms its type allows (narrowed to its JWK `alg`), or None when
    it verifies nothing here (an unknown curve, an `alg` of another type)."""
    if isinstance(key, RSAKey):
        allowed: tuple[str, ...] = RSA_ALGORITHMS
    elif isinstance(key, ECKey):
        allowed = EC_ALGORITHMS.get(key.curve_name, ())
    elif isinstance(key, OKPKey):
        allowed = OKP_ALGORITHMS.get(key.curve_name, ())
    elif isinstance(key, OctKey):
        allowed = HMAC_ALGORITHMS
    else:
        allowed = ()
    named = key.alg
    if named is not None:
        allowed = tuple(alg for alg in allowed if alg == named)
    return VerifyingKey(key, allowed) if allowed else None


def _read(path: str, what: str) -> bytes:
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"{what} {path!r} cannot be read: {exc.strerror or 'error'}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{what} {path!r} is larger than {MAX_KEY_FILE_BYTES} bytes")
    return data


def load_secret_file(path: str) -> VerifyingKey:
    """The HS* secret in a mounted file, its trailing newline stripped."""
    secret = _read(path, "jwt-secret-file").rstrip(b"\r\n")
    if len(secret) < MIN_SECRET_BYTES:
        raise KeyFileError(
            f"jwt-secret-file {path!r} must hold at least {MIN_SECRET_BYTES} bytes "
            "(RFC 7518 3.2: no shorter than the HS256 hash)"
        )
    key = pinned(OctKey.import_key(secret))
    assert key is not None
    return key


def _public_pem(data: bytes, path: str) -> Key:
    try:
        loaded = serialization.load_pem_public_key(data)
    except ValueError:
        raise KeyFileError(
            f"jwt-public-key-file {path!r} holds no PEM public key, JWK or JWKS (a private "
            "key or a certificate is refused: give the public key)"
        ) from None
    if isinstance(loaded, rsa.RSAPublicKey):
        return RSAKey.import_key(data)
    if isinstance(loaded, ec.EllipticCurvePublicKey):
        return ECKey.import_key(data)
    if isinstance(loaded, ed25519.Ed25519PublicKey):
        return OKPKey.import_key(data)
    raise KeyFileError(f"jwt-public-key-file {path!r}: an RSA, EC or Ed25519 key is needed")


def load_public_key_file(path: str) -> list[VerifyingKey]:
    """The keys of a public key file: a PEM public key, a JWK or a JWKS (JSON)."""
    data = _read(path, "jwt-public-key-file")
    if data.lstrip().startswith(b"{"):
        try:
            document = json.loads(data)
        except ValueError:
            raise KeyFileError(f"jwt-public-key-file {path!r} is not valid JSON") from None
        if isinstance(document, dict) and "keys" not in document:
            document = {"keys": [document]}
        keys = parse_jwks(document, f"jwt-public-key-file {path!r}")
    else:
        found = pinned(_public_pem(data, path))
        keys = [] if found is None else [found]
    if not keys:
        raise KeyFileError(f"jwt-public-key-file {path!r} holds no key that verifies signatures")
    return keys


def parse_jwks(document: Any, source: str) -> list[VerifyingKey]:
    """The signature keys of a JWKS document. Symmetric keys are left out (a key set is
    public: one there would let anyone sign), and so are keys for encryption and keys of
    a type or curve nothing here verifies; private members are never kept."""
    if not isinstance(document, Mapping) or not isinstance(document.get("keys"), list):
        raise KeyFileError(f"{source} is not a JWKS: an object with a list of keys")
    found: list[VerifyingKey] = []
    for entry in document["keys"]:
        if not isinstance(entry, Mapping) or entry.get("kty") not in ("RSA", "EC", "OKP"):
            continue
        if entry.get("use", "sig") != "sig":
            continue
        try:
            key = KeySet.import_key_set({"keys": [dict(entry)]}).keys[0]
        except (JoseError, ValueError, TypeError, KeyError):
            continue  # one malformed key does not take the others with it
        if key.is_private:
            key = type(key).import_key(key.as_dict(private=False))
        verifying = pinned(key)
        if verifying is not None:
            found.append(verifying)
    return found
