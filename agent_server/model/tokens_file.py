"""The tokens file of `--api-tokens-file`: one principal per bearer token.

One line per token, `token identity [tenant] [scope,...]`, fields apart by spaces or tabs;
`-` for the tenant means the identity's own; a line whose first visible character is `#` is a
comment, an empty line is skipped. A file that breaks any rule is refused whole, by line
number and reason: a message never quotes a line, which holds a token.

Only SHA-256 digests of the tokens are kept, so a lookup compares digests (its time says
nothing about the token) and no token stays in memory as text.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent_server.model.principal import Principal, check_name, check_tenant
from agent_server.model.tokens import TokenError, check_token

#: Largest tokens file read (about ten thousand tokens); past it the file is refused.
MAX_TOKENS_FILE_BYTES = 1024 * 1024
#: The tenant field that means "the identity's own tenant", to give scopes without a tenant.
OWN_TENANT = "-"
#: Fields are apart by spaces and tabs only: Python's own whitespace includes separators
#: (\x1c to \x1f, \x85, \u2028) a token must not hide.
_FIELDS = re.compile(r"[ \t]+")


def token_digest(token: bytes) -> bytes:
    """The key a token is kept and looked up under."""
    return hashlib.sha256(token).digest()


@dataclass(frozen=True)
class TokenTable:
    """The principals of a tokens file, by the digest of their token."""

    principals: Mapping[bytes, Principal]

    def __len__(self) -> int:
        return len(self.principals)

    def find(self, token: bytes) -> Principal | None:
        return self.principals.get(token_digest(token))


def parse_tokens(text: str, source: str = "tokens file") -> TokenTable:
    """The table a tokens file's text gives, or TokenError naming the first bad line."""
    found: dict[bytes, Principal] = {}
    first_line: dict[bytes, int] = {}
    for number, raw in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        line = raw.removesuffix("\r").strip(" \t")
        if not line or line.startswith("#"):
            continue
        fields = _FIELDS.split(line)
        where = f"{source} line {number}"
        if len(fields) < 2:
            raise TokenError(f"{where}: needs a token and an identity")
        if len(fields) > 4:
            raise TokenError(
                f"{where}: has {len(fields)} fields, at most 4 (token identity [tenant] "
                "[scope,...])"
            )
        token, identity, *rest = fields
        try:
            check_token(token)
        except TokenError as exc:
            raise TokenError(f"{where}: {exc}") from None
        tenant = rest[0] if rest else OWN_TENANT
        scopes = rest[1].split(",") if len(rest) > 1 else []
        try:
            check_name(identity, "the identity")
            if tenant != OWN_TENANT:
                check_tenant(tenant, "the tenant")
            for scope in scopes:
                check_name(scope, "each scope")
        except ValueError as exc:
            raise TokenError(f"{where}: {exc}") from None
        digest = token_digest(token.encode("ascii"))
        if digest in found:
            raise TokenError(f"{where}: repeats the token of line {first_line[digest]}")
        first_line[digest] = number
        found[digest] = Principal(
            identity, None if tenant == OWN_TENANT else tenant, frozenset(scopes)
        )
    if not found:
        raise TokenError(f"{source} holds no token")
    return TokenTable(found)


def read_tokens_file(path: str) -> TokenTable:
    """The table of the file at `path` (bounded in size), or TokenError saying why not."""
    source = f"tokens file {path!r}"
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_TOKENS_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TokenError(f"{source} cannot be read: {reason}") from None
    if len(data) > MAX_TOKENS_FILE_BYTES:
        raise TokenError(f"{source} is larger than {MAX_TOKENS_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TokenError(f"{source} is not UTF-8 text") from None
    return parse_tokens(text, source)
